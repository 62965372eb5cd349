"""The local cloud: the stack on a moto server on loopback, its event sources driving the real handlers.

`LocalCloud.start()` starts `moto.server.ThreadedMotoServer` on 127.0.0.1 (a free port), points this
process at it (AWS_ENDPOINT_URL, fake credentials, the stack's environment), builds the stack from
template.yaml (`MotoStack`) and wires every event source the template declares (`router.routes()`):

- SQS (the jobs queue): batches of up to BatchSize, `batchItemFailures` honoured, failed messages
  back after `retry_delay` seconds, the queue's redrive moving them to its DLQ.
- EventBridgeRule: a real rule in moto with an SQS queue as its target; `account` put back (moto
  drops it); each event invoked alone, as Lambda's asynchronous invocation does.
- SNS: an SQS queue subscribed to the topic (envelope, not raw), turned into the Lambda SNS event.
- Schedule: a `Scheduled Event` every `reconcile_every` seconds.

A handler that raises on an asynchronous source (rule, topic, schedule) is retried per its
function's `EventInvokeConfig.MaximumRetryAttempts` (Lambda's default 2 when absent), then a Lambda
destination record is sent to its `OnFailure` destination (EventsDeadLetterQueue): never dropped
silently, never retried forever. Every invocation runs sequentially on one loop thread, so a run is
deterministic; other components add their periodic work to that thread with `add_tick()`.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import threading
import time
import urllib.request
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import boto3
from botocore.exceptions import ClientError

from gpujobs_local import router
from gpujobs_local.router import ACCOUNT, Route
from gpujobs_local.stack import ALLOWED, REGION, LambdaContext, MotoStack, load_function

log = logging.getLogger(__name__)

FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local"}
PROCESS_ENV = {
    "AWS_REGION": REGION,
    "AWS_DEFAULT_REGION": REGION,
    "AWS_ACCOUNT_ID_ENDPOINT_MODE": "disabled",
    "POWERTOOLS_TRACE_DISABLED": "true",
    "POWERTOOLS_METRICS_DISABLED": "true",
    "POWERTOOLS_METRICS_NAMESPACE": "GpuJobs",
    "POWERTOOLS_SERVICE_NAME": "gpujobs",
    "POWERTOOLS_LOG_LEVEL": "WARNING",
}
_IN_FLIGHT_VISIBILITY = 60  # seconds a received message stays hidden while its handler runs


@dataclass(frozen=True)
class Delivery:
    """One handler invocation, as observers see it."""

    function: str  # logical id, e.g. SubmitFunction
    kind: str  # "SQS", "SNS", "Scheduled Event" or the EventBridge detail-type
    summary: str
    result: Any = None
    error: BaseException | None = None
    attempt: int = 1
    dead_lettered: bool = False
    seconds: float = 0.0
    event: Any = None

    @property
    def ok(self) -> bool:
        if self.error is not None:
            return False
        return not (isinstance(self.result, dict) and self.result.get("batchItemFailures"))

    @property
    def outcome(self) -> str:
        if self.error is not None:
            what = f"{type(self.error).__name__}: {str(self.error).splitlines()[0] if str(self.error) else ''}"
            return f"{'dead-lettered' if self.dead_lettered else 'failed, will retry'} ({what[:120]})"
        if isinstance(self.result, dict) and self.result.get("batchItemFailures"):
            return f"{len(self.result['batchItemFailures'])} item(s) failed, will retry"
        return "ok"

    def line(self) -> str:
        attempt = f" attempt {self.attempt}" if self.attempt > 1 else ""
        return f"{self.function:<22} {self.kind} [{self.summary}]{attempt} -> {self.outcome} ({self.seconds:.2f}s)"


@dataclass
class _Fault:
    instance_type: str | None
    zone: str | None
    market: str | None
    code: str


class LocalCloud:
    """The whole control plane on this machine. See the module docstring."""

    def __init__(
        self,
        *,
        workdir: Path,
        stack_name: str = "gpujobs-local",
        reconcile_every: float = 5.0,
        allowed_instance_types: Sequence[str] = ALLOWED,
        poll_interval: float = 0.2,
        retry_delay: int = 2,
    ) -> None:
        self.workdir = Path(workdir)
        self.stack_name = stack_name
        self.reconcile_every = reconcile_every
        self.allowed_instance_types = tuple(allowed_instance_types)
        self.poll_interval = poll_interval
        self.retry_delay = retry_delay
        self.region = REGION
        self.endpoint_url = ""
        self.outputs: dict[str, str] = {}
        self.stack: MotoStack | None = None
        self.deliveries: deque[Delivery] = deque(maxlen=10_000)

        self._server: Any = None
        self._saved_env: dict[str, str] | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._observers: list[Callable[[Delivery], None]] = []
        self._ticks: list[Callable[[], None]] = []
        self._shutdowns: list[Callable[[], None]] = []
        self._calls: deque[tuple[Callable[[], Any], Future[Any]]] = deque()
        self._faults: list[_Fault] = []
        self._routes: list[Route] = []
        self._handlers: dict[str, Callable[[dict[str, Any], Any], Any]] = {}
        self._sources: list[Callable[[], bool]] = []
        self._queues_by_logical_id: dict[str, str] = {}
        self._subnet_zones: dict[str, str] = {}
        self._next_tick = 0.0
        self._clients: dict[str, Any] = {}

    # ---- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> LocalCloud:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> None:
        if self.running:
            return
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._saved_env = dict(os.environ)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        self._server = server
        try:
            host, port = server.get_host_and_port()
            self.endpoint_url = f"http://{host}:{port}"
            self._moto_reset()  # moto's state is per process: start from an empty account
            os.environ.update({"AWS_ENDPOINT_URL": self.endpoint_url, **FAKE_CREDENTIALS, **PROCESS_ENV})
            for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
                os.environ.pop(key, None)
            self._build()
        except BaseException:
            self.stop()
            raise
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, name="gpujobs-local-cloud", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if not self.running:
            return
        try:
            self._stopping.set()
            if self._thread is not None:
                self._thread.join(timeout=60)
                if self._thread.is_alive():
                    log.warning("the local cloud's loop thread did not stop within 60 s")
                self._thread = None
            for hook in reversed(self._shutdowns):
                try:
                    hook()
                except Exception:
                    log.exception("shutdown hook %r failed", hook)
            while self._calls:
                _, future = self._calls.popleft()
                future.cancel()
        finally:
            try:
                from gpujobs.runtime import bootstrap

                bootstrap.reset()
                self._handlers.clear()
                self._sources.clear()
                self._clients.clear()
                self.stack = None
                boto3.DEFAULT_SESSION = None  # drops the hooks and clients registered on it
                gc.collect()  # close pooled connections, so moto's keep-alive threads end
                with contextlib.suppress(Exception):
                    self._moto_reset()
            finally:
                server, self._server = self._server, None
                server.stop()
                if self._saved_env is not None:
                    os.environ.clear()
                    os.environ.update(self._saved_env)
                    self._saved_env = None

    def add_shutdown(self, fn: Callable[[], None]) -> None:
        """Run `fn` in stop(), after the loop has stopped and before the AWS endpoint goes away."""
        self._shutdowns.append(fn)

    def add_tick(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the loop thread on every pass (every `poll_interval` when idle)."""
        with self._lock:
            self._ticks.append(fn)

    def on_delivery(self, callback: Callable[[Delivery], None]) -> None:
        with self._lock:
            self._observers.append(callback)

    # ---- what another shell needs ------------------------------------------------------------
    def exports(self) -> dict[str, str]:
        self._require_running()
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            **FAKE_CREDENTIALS,
            "AWS_ACCOUNT_ID_ENDPOINT_MODE": "disabled",
            "GPUJOBS_QUEUE_URL": self.outputs["JobsQueueUrl"],
            "GPUJOBS_TABLE": self.outputs["JobsTableName"],
            "GPUJOBS_EVENT_BUS": self.outputs["EventBusName"],
            "GPUJOBS_STACK": self.stack_name,
        }

    # ---- driving it --------------------------------------------------------------------------
    def client(self, service: str) -> Any:
        """A boto3 client for the local endpoint (its own session: safe from any thread)."""
        # Any service by name (the stubs type client() per literal name); credentials are plain strings.
        return boto3.session.Session(**self._session_kwargs()).client(  # type: ignore[arg-type,call-overload]
            service, endpoint_url=self.endpoint_url, region_name=self.region
        )

    def put_event(
        self,
        *,
        source: str,
        detail_type: str,
        detail: dict[str, Any],
        resources: Sequence[str] = (),
        bus: str = "default",
    ) -> None:
        self._require_running()
        answer = self._clients["events"].put_events(
            Entries=[
                {
                    "Source": source,
                    "DetailType": detail_type,
                    "Detail": json.dumps(detail),
                    "Resources": list(resources),
                    "EventBusName": bus,
                }
            ]
        )
        if answer.get("FailedEntryCount"):
            raise RuntimeError(f"put_events refused the event: {answer['Entries']}")

    def inject_capacity_error(
        self,
        *,
        instance_type: str | None = None,
        zone: str | None = None,
        market: str | None = None,
        code: str = "InsufficientInstanceCapacity",
    ) -> None:
        """Refuse matching RunInstances calls (None matches anything; market is "spot" or "on-demand")."""
        with self._lock:
            self._faults.append(_Fault(instance_type, zone, market, code))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def run_reconciler(self) -> dict[str, Any]:
        """Invoke the scheduled function(s) now, on the loop thread; returns the (last) handler result."""
        self._require_running()
        result: dict[str, Any] = self._on_loop(self._run_schedules)
        return result

    def wait_until(self, predicate: Callable[[], bool], *, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if predicate():
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
            time.sleep(self.poll_interval)

    def dead_letters(self) -> list[dict[str, Any]]:
        """Bodies of what waits in the events dead-letter queue (left there)."""
        self._require_running()
        url = self.outputs["EventsDeadLetterQueueUrl"]
        messages = (
            self._clients["sqs_main"]
            .receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=0)
            .get("Messages", [])
        )
        return [json.loads(m["Body"]) for m in messages]

    # ---- building ----------------------------------------------------------------------------
    def _session_kwargs(self) -> dict[str, str]:
        return {
            "aws_access_key_id": FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            "region_name": self.region,
        }

    def _moto_reset(self) -> None:
        request = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", method="POST", data=b"")  # noqa: S310
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback only
            response.read()

    def _build(self) -> None:
        stack = MotoStack(stack_name=self.stack_name, allowed_instance_types=self.allowed_instance_types)
        self.stack = stack
        os.environ.update(stack.env)
        stack.on_aws("provide-client-params.ec2.RunInstances", self._refuse_capacity)
        self._subnet_zones = {
            s["SubnetId"]: s["AvailabilityZone"] for s in stack.ec2.describe_subnets(SubnetIds=stack.subnets)["Subnets"]
        }
        for name in ("sqs", "sqs_main", "events", "sns"):
            self._clients[name] = self.client(name.removesuffix("_main"))
        sqs, sns = self._clients["sqs"], self._clients["sns"]

        events_dlq = sqs.create_queue(
            QueueName=f"{self.stack_name}-events-dlq", Attributes={"MessageRetentionPeriod": "1209600"}
        )["QueueUrl"]
        topic = sns.create_topic(
            Name=f"{self.stack_name}-budget-alerts", Tags=[{"Key": "gpujobs:stack", "Value": self.stack_name}]
        )["TopicArn"]
        self._queues_by_logical_id = {
            "JobsQueue": stack.queue_url,
            "JobsDeadLetterQueue": stack.dlq_url,
            "EventsDeadLetterQueue": events_dlq,
        }
        refs = {"JobsEventBus": stack.bus, "BudgetAlertsTopic": topic}
        self.outputs = {
            "JobsQueueUrl": stack.queue_url,
            "JobsDeadLetterQueueUrl": stack.dlq_url,
            "JobsTableName": stack.table,
            "EventBusName": stack.bus,
            "CheckpointBucketName": stack.bucket,
            "LaunchTemplateId": stack.launch_template,
            "InstanceRoleArn": f"arn:aws:iam::{ACCOUNT}:role/{self.stack_name}-InstanceRole",
            "SubmitFunctionName": f"{self.stack_name}-SubmitFunction",
            "BudgetAlertsTopicArn": topic,
            "CheckpointNowDocumentName": stack.checkpoint_document,
            "EventsDeadLetterQueueUrl": events_dlq,
        }

        self._routes = router.routes()
        for route in self._routes:
            if route.function not in self._handlers:
                self._handlers[route.function] = load_function(route.module).handler
            if route.kind == "SQS":
                url = self._queues_by_logical_id[route.target("Queue")]
                self._sources.append(self._sqs_source(route, url))
            elif route.kind == "EventBridgeRule":
                self._sources.append(self._rule_source(route, refs))
            elif route.kind == "SNS":
                self._sources.append(self._topic_source(route, refs[route.target("Topic")]))
        self._next_tick = time.monotonic() + self.reconcile_every

        from gpujobs.runtime import bootstrap

        bootstrap.reset()
        # Warm containers: create every wired client now, on this thread (creating clients from
        # the default session on two threads at once is not safe in botocore).
        for wire in (bootstrap.job_service, bootstrap.reactions, bootstrap.reconciler, bootstrap.budget_reactions):
            wire()
        (self.workdir / "env.sh").write_text(
            "".join(f"export {k}={v}\n" for k, v in self.exports().items()), encoding="utf-8"
        )

    def _queue_for(self, route: Route) -> tuple[str, str]:
        sqs = self._clients["sqs"]
        url = sqs.create_queue(QueueName=f"{self.stack_name}-{route.name}"[:80])["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        return url, arn

    def _sqs_source(self, route: Route, url: str) -> Callable[[], bool]:
        sqs = self._clients["sqs"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]

        def poll() -> bool:
            messages = sqs.receive_message(
                QueueUrl=url,
                MaxNumberOfMessages=min(route.batch_size, 10),
                VisibilityTimeout=_IN_FLIGHT_VISIBILITY,
                AttributeNames=["All"],
                MessageAttributeNames=["All"],
            ).get("Messages", [])
            if not messages:
                return False
            event = {"Records": [_sqs_record(m, arn, self.region) for m in messages]}
            attempt = max(int(m.get("Attributes", {}).get("ApproximateReceiveCount", 1)) for m in messages)
            delivery = self._invoke(route, "SQS", event, attempt=attempt, last=False)
            if delivery.error is not None:
                failed = {m["MessageId"] for m in messages}
            elif route.reports_batch_failures and isinstance(delivery.result, dict):
                failed = {f["itemIdentifier"] for f in delivery.result.get("batchItemFailures", [])}
            else:
                failed = set()
            for m in messages:
                if m["MessageId"] in failed:
                    sqs.change_message_visibility(
                        QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=self.retry_delay
                    )
                else:
                    sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
            return True

        return poll

    def _rule_source(self, route: Route, refs: dict[str, str]) -> Callable[[], bool]:
        bus_id = route.bus_logical_id
        bus = "default" if bus_id is None else refs[bus_id]
        rule = f"{self.stack_name}-{route.name}"[:64]
        url, arn = self._queue_for(route)
        events = self._clients["events"]
        pattern = route.pattern(stack_name=self.stack_name, region=self.region)
        events.put_rule(Name=rule, EventBusName=bus, EventPattern=json.dumps(pattern), State="ENABLED")
        events.put_targets(Rule=rule, EventBusName=bus, Targets=[{"Id": "local-lambda", "Arn": arn}])
        return self._async_queue_source(route, url, router.eventbridge_event)

    def _topic_source(self, route: Route, topic_arn: str) -> Callable[[], bool]:
        url, arn = self._queue_for(route)
        subscription = self._clients["sns"].subscribe(TopicArn=topic_arn, Protocol="sqs", Endpoint=arn)[
            "SubscriptionArn"
        ]
        return self._async_queue_source(route, url, lambda body: router.sns_event(body, subscription_arn=subscription))

    def _async_queue_source(
        self, route: Route, url: str, to_event: Callable[[str], dict[str, Any]]
    ) -> Callable[[], bool]:
        sqs = self._clients["sqs"]

        def poll() -> bool:
            messages = sqs.receive_message(
                QueueUrl=url,
                MaxNumberOfMessages=10,
                VisibilityTimeout=_IN_FLIGHT_VISIBILITY,
                AttributeNames=["ApproximateReceiveCount"],
            ).get("Messages", [])
            for m in messages:
                attempt = int(m.get("Attributes", {}).get("ApproximateReceiveCount", 1))
                try:
                    event = to_event(m["Body"])
                except ValueError as exc:  # not JSON: nothing a retry would fix
                    self._dead_letter(route, {"body": m["Body"]}, exc, attempt)
                    sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
                    continue
                kind = "SNS" if route.kind == "SNS" else str(event.get("detail-type", route.kind))
                last = attempt > route.async_retries
                delivery = self._invoke(route, kind, event, attempt=attempt, last=last)
                if delivery.error is not None and not last:
                    sqs.change_message_visibility(
                        QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=self.retry_delay
                    )
                    continue
                if delivery.error is not None:
                    self._dead_letter(route, event, delivery.error, attempt)
                sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
            return bool(messages)

        return poll

    def _dead_letter(self, route: Route, event: dict[str, Any], error: BaseException, invocations: int) -> None:
        url = self._queues_by_logical_id.get(
            route.on_failure or "", self._queues_by_logical_id["EventsDeadLetterQueue"]
        )
        record = router.destination_record(
            function_arn=self._function_arn(route.function), event=event, error=error, invocations=invocations
        )
        self._clients["sqs"].send_message(QueueUrl=url, MessageBody=json.dumps(record, default=str))
        log.warning("%s gave up after %d invocation(s): %s; event dead-lettered", route.function, invocations, error)

    def _function_arn(self, function: str) -> str:
        return f"arn:aws:lambda:{self.region}:{ACCOUNT}:function:{self.stack_name}-{function}"

    # ---- invoking ----------------------------------------------------------------------------
    def _invoke(self, route: Route, kind: str, event: dict[str, Any], *, attempt: int, last: bool) -> Delivery:
        handler = self._handlers[route.function]
        context = LambdaContext(
            function_name=f"{self.stack_name}-{route.function}",
            invoked_function_arn=self._function_arn(route.function),
            aws_request_id=str(uuid.uuid4()),
        )
        started = time.perf_counter()
        result: Any = None
        error: BaseException | None = None
        try:
            result = handler(event, context)
        except Exception as exc:
            error = exc
            log.info("%s failed on %s (attempt %d): %s", route.function, kind, attempt, exc, exc_info=True)
        delivery = Delivery(
            function=route.function,
            kind=kind,
            summary=router.summarize(route.kind if route.kind in ("SQS", "SNS") else "event", event),
            result=result,
            error=error,
            attempt=attempt,
            dead_lettered=error is not None and last,
            seconds=time.perf_counter() - started,
            event=event,
        )
        self.deliveries.append(delivery)
        with self._lock:
            observers = list(self._observers)
        for observer in observers:
            try:
                observer(delivery)
            except Exception:
                log.exception("delivery observer %r failed", observer)
        return delivery

    def _run_schedules(self) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for route in self._routes:
            if route.kind != "Schedule":
                continue
            rule_arn = f"arn:aws:events:{self.region}:{ACCOUNT}:rule/{self.stack_name}-{route.name}"
            event = router.scheduled_event(rule_arn=rule_arn, region=self.region)
            for attempt in range(1, route.async_retries + 2):
                last = attempt > route.async_retries
                delivery = self._invoke(route, "Scheduled Event", event, attempt=attempt, last=last)
                if delivery.error is None:
                    if isinstance(delivery.result, dict):
                        result = delivery.result
                    break
                if last:
                    self._dead_letter(route, event, delivery.error, attempt)
                    raise delivery.error
        return result

    def _on_loop(self, fn: Callable[[], Any]) -> Any:
        if threading.current_thread() is self._thread or self._thread is None:
            return fn()
        future: Future[Any] = Future()
        self._calls.append((fn, future))
        return future.result()

    def _loop(self) -> None:
        while not self._stopping.is_set():
            busy = False
            while self._calls:
                fn, future = self._calls.popleft()
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn())
                    except BaseException as exc:
                        future.set_exception(exc)
                busy = True
            for source in self._sources:
                if self._stopping.is_set():
                    return
                try:
                    busy = source() or busy
                except Exception:
                    log.exception("polling an event source failed")
            if time.monotonic() >= self._next_tick:
                self._next_tick = time.monotonic() + self.reconcile_every
                with contextlib.suppress(Exception):  # surfaced to observers and dead-lettered
                    self._run_schedules()
            with self._lock:
                ticks = list(self._ticks)
            for tick in ticks:
                try:
                    tick()
                except Exception:
                    log.exception("tick %r failed", tick)
            if not busy:
                self._stopping.wait(self.poll_interval)

    # ---- the capacity fault hook -------------------------------------------------------------
    def _refuse_capacity(self, params: dict[str, Any], **_: Any) -> None:
        with self._lock:
            faults = list(self._faults)
        if not faults:
            return
        itype = params.get("InstanceType")
        interfaces: list[dict[str, Any]] = params.get("NetworkInterfaces", [])
        subnet = str(params.get("SubnetId") or (interfaces[0].get("SubnetId", "") if interfaces else ""))
        zone = params.get("Placement", {}).get("AvailabilityZone") or self._subnet_zones.get(subnet)
        market = "spot" if "InstanceMarketOptions" in params else "on-demand"
        for f in faults:
            if f.instance_type in (None, itype) and f.zone in (None, zone) and f.market in (None, market):
                raise ClientError(
                    {"Error": {"Code": f.code, "Message": f"local cloud: no {market} {itype} capacity in {zone}"}},
                    "RunInstances",
                )

    def _require_running(self) -> None:
        if not self.running:
            raise RuntimeError("the local cloud is not running: call start() first")


def _sqs_record(m: dict[str, Any], arn: str, region: str) -> dict[str, Any]:
    return {
        "messageId": m["MessageId"],
        "receiptHandle": m["ReceiptHandle"],
        "body": m["Body"],
        "attributes": m.get("Attributes", {}),
        "messageAttributes": m.get("MessageAttributes", {}),
        "md5OfBody": m["MD5OfBody"],
        "eventSource": "aws:sqs",
        "eventSourceARN": arn,
        "awsRegion": region,
    }
