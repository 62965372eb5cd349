"""The local cloud: the stack on a moto server on loopback, its event sources driving the real handlers.

`LocalCloud` is the facade the demo, `local up` and the tests drive; each idea it composes lives in
its own module:

- `moto_server`: the moto server on 127.0.0.1 and this process's environment pointing at it;
- `stack` and `router`: the stack built from template.yaml (`MotoStack`) and its routes;
- `event_sources`: the template's SQS queues, EventBridge rules, SNS topic and schedule as polls;
- `invoker`: the real handlers invoked as Lambda does, with retries, destinations and `Delivery`
  records for observers;
- `loop`: the one thread every invocation runs on, so a run is deterministic; other components add
  their periodic work to it with `add_tick()`;
- `faults`: capacity errors injected into RunInstances.

moto stamps every SQS message with one `SenderId` (`stack.MOTO_SENDER`, its default user), whatever
credentials sent it. `send(body, sender=...)` plays a message another principal sent: the jobs
queue's event source hands the submit function that principal's id, as SQS would (the team
configuration, `teams`, decides what it may do).

`start()` starts the server, builds the stack, adds the resources the template declares beyond
`MotoStack` (the events dead-letter queue, the budget alerts topic), wires every event source and
warms the handlers' clients; `stop()` undoes all of it and leaves the process as it found it.
"""

from __future__ import annotations

import gc
import json
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import suppress
from pathlib import Path
from types import TracebackType
from typing import Any

import boto3

from gpujobs.contract import STACK_TAG
from gpujobs_local import router
from gpujobs_local.event_sources import EventSources
from gpujobs_local.faults import CapacityFault, CapacityFaults
from gpujobs_local.invoker import EVENTS_DEAD_LETTER_QUEUE, Delivery, DeliveryLog, LambdaInvoker
from gpujobs_local.lambda_endpoint import LambdaEndpoint
from gpujobs_local.loop import LoopThread
from gpujobs_local.moto_server import MotoServer
from gpujobs_local.router import ACCOUNT
from gpujobs_local.stack import ALLOWED, REGION, MotoStack

__all__ = ["Delivery", "LocalCloud"]


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
        teams: str | None = None,
    ) -> None:
        """`teams`: a team configuration (JSON, docs/deploy.md); None runs the stack without one."""
        self.workdir = Path(workdir)
        self.stack_name = stack_name
        self.reconcile_every = reconcile_every
        self.allowed_instance_types = tuple(allowed_instance_types)
        self.poll_interval = poll_interval
        self.retry_delay = retry_delay
        self.teams = teams
        self.region = REGION
        self.outputs: dict[str, str] = {}
        self.stack: MotoStack | None = None
        self._server = MotoServer(region=self.region)
        self._loop = LoopThread(name="gpujobs-local-cloud", poll_interval=poll_interval, schedule_every=reconcile_every)
        self._log = DeliveryLog()
        self._faults = CapacityFaults()
        self._sources: EventSources | None = None
        self._clients: dict[str, Any] = {}
        self._senders: dict[str, str] = {}  # message id -> SenderId, for messages sent as another principal
        self._lambda: LambdaEndpoint | None = None

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
        return self._server.running

    @property
    def endpoint_url(self) -> str:
        return self._server.endpoint_url

    @property
    def lambda_endpoint_url(self) -> str:
        """Lambda Invoke of the functions invoked directly (the credentials function), for other
        processes: `AWS_ENDPOINT_URL_LAMBDA` (`lambda_endpoint`)."""
        self._require_running()
        assert self._lambda is not None
        return self._lambda.endpoint

    @property
    def deliveries(self) -> deque[Delivery]:
        """The last 10 000 handler invocations."""
        return self._log.deliveries

    def start(self) -> None:
        if self.running:
            return
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._server.start()
        try:
            sources = self._build()
        except BaseException:
            self.stop()
            raise
        self._sources = sources
        self._loop.start(sources=sources.polls, schedule=sources.run_schedules)

    def stop(self) -> None:
        if not self.running:
            return
        try:
            self._loop.stop()
        finally:
            try:
                from gpujobs.runtime import bootstrap

                bootstrap.reset()
                self._sources = None
                self._clients.clear()
                self._senders.clear()
                if self._lambda is not None:
                    self._lambda.close()
                    self._lambda = None
                self.stack = None
                boto3.DEFAULT_SESSION = None  # drops the hooks and clients registered on it
                gc.collect()  # close pooled connections, so moto's keep-alive threads end
                with suppress(Exception):
                    self._server.reset()
            finally:
                self._server.stop()

    def add_shutdown(self, fn: Callable[[], None]) -> None:
        """Run `fn` in stop(), after the loop has stopped and before the AWS endpoint goes away."""
        self._loop.add_shutdown(fn)

    def add_tick(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the loop thread on every pass (every `poll_interval` when idle)."""
        self._loop.add_tick(fn)

    def on_delivery(self, callback: Callable[[Delivery], None]) -> None:
        self._log.subscribe(callback)

    # ---- what another shell needs ------------------------------------------------------------
    def exports(self) -> dict[str, str]:
        self._require_running()
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            **self._server.credentials,
            "AWS_ACCOUNT_ID_ENDPOINT_MODE": "disabled",
            "GPUJOBS_QUEUE_URL": self.outputs["JobsQueueUrl"],
            "GPUJOBS_TABLE": self.outputs["JobsTableName"],
            "GPUJOBS_EVENT_BUS": self.outputs["EventBusName"],
            "GPUJOBS_LOG_GROUP": self.outputs["JobLogGroupName"],
            "GPUJOBS_BUCKET": self.outputs["CheckpointBucketName"],
            "GPUJOBS_STACK": self.stack_name,
            "GPUJOBS_SPOT_DRILL_ROLE_ARN": self.outputs["SpotDrillRoleArn"],
        }

    # ---- driving it --------------------------------------------------------------------------
    def client(self, service: str) -> Any:
        """A boto3 client for the local endpoint (its own session: safe from any thread)."""
        return self._server.client(service)

    def send(self, body: str, *, sender: str | None = None) -> str:
        """Send `body` to the jobs queue as `sender` (a principal's unique id; None: moto's default
        user); returns the message id. Sent on the loop thread, so no poll receives the message
        before its sender is recorded."""
        self._require_running()

        def send_as() -> str:
            answer = self._clients["sqs_main"].send_message(QueueUrl=self.outputs["JobsQueueUrl"], MessageBody=body)
            message_id = str(answer["MessageId"])
            if sender is not None:
                self._senders[message_id] = sender
            return message_id

        message_id: str = self._loop.call(send_as)
        return message_id

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
        self._faults.inject(CapacityFault(instance_type=instance_type, zone=zone, market=market, code=code))

    def clear_faults(self) -> None:
        self._faults.clear()

    def run_reconciler(self) -> dict[str, Any]:
        """Invoke the scheduled function(s) now, on the loop thread; returns the (last) handler result."""
        self._require_running()
        assert self._sources is not None
        result: dict[str, Any] = self._loop.call(self._sources.run_schedules)
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
    def _build(self) -> EventSources:
        stack = MotoStack(
            stack_name=self.stack_name, allowed_instance_types=self.allowed_instance_types, teams=self.teams
        )
        self.stack = stack
        os.environ.update(stack.env)
        self._faults.install(stack)
        for name in ("sqs", "sqs_main", "events", "sns", "dynamodb", "dynamodbstreams"):
            self._clients[name] = self.client(name.removesuffix("_main"))
        sqs, sns = self._clients["sqs"], self._clients["sns"]

        events_dlq = sqs.create_queue(
            QueueName=f"{self.stack_name}-events-dlq", Attributes={"MessageRetentionPeriod": "1209600"}
        )["QueueUrl"]
        topic = sns.create_topic(
            Name=f"{self.stack_name}-budget-alerts", Tags=[{"Key": STACK_TAG, "Value": self.stack_name}]
        )["TopicArn"]
        queues = {
            "JobsQueue": stack.queue_url,
            "JobsDeadLetterQueue": stack.dlq_url,
            EVENTS_DEAD_LETTER_QUEUE: events_dlq,
        }
        self.outputs = {
            "JobsQueueUrl": stack.queue_url,
            "JobsDeadLetterQueueUrl": stack.dlq_url,
            "JobsTableName": stack.table,
            "EventBusName": stack.bus,
            "CheckpointBucketName": stack.bucket,
            "LaunchTemplateId": stack.launch_template,
            "InstanceRoleArn": f"arn:aws:iam::{ACCOUNT}:role/{self.stack_name}-InstanceRole",
            "JobRoleArn": stack.job_role_arn,
            "SpotDrillRoleArn": f"arn:aws:iam::{ACCOUNT}:role/{self.stack_name}-SpotDrillRole",
            "SubmitFunctionName": f"{self.stack_name}-SubmitFunction",
            "BudgetAlertsTopicArn": topic,
            "CheckpointNowDocumentName": stack.checkpoint_document,
            "EventsDeadLetterQueueUrl": events_dlq,
            "JobLogGroupName": stack.log_group,
        }

        routes = router.routes()
        invoker = LambdaInvoker(
            routes=routes,
            stack_name=self.stack_name,
            region=self.region,
            sqs=sqs,
            destinations=queues,
            log_to=self._log,
        )
        sources = EventSources(
            routes=routes,
            invoker=invoker,
            clients=self._clients,
            queues=queues,
            refs={"JobsEventBus": stack.bus, "BudgetAlertsTopic": topic, "JobsTable": stack.table},
            retry_delay=self.retry_delay,
            senders=self._senders,
        )

        from gpujobs.runtime import bootstrap

        bootstrap.reset()
        # Warm containers: create every wired client now, on this thread (creating clients from
        # the default session on two threads at once is not safe in botocore).
        wires = (
            bootstrap.job_service,
            bootstrap.reactions,
            bootstrap.reconciler,
            bootstrap.budget_reactions,
            bootstrap.outbox,
        )
        for wire in (*wires, bootstrap.job_sessions):
            wire()
        bootstrap.make_every_client()
        self._lambda = LambdaEndpoint(stack.invoke).start()
        # It holds this run's credentials: readable by the user only, from its creation on.
        env_sh = os.open(self.workdir / "env.sh", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(env_sh, "w", encoding="utf-8") as handle:
            handle.write("".join(f"export {k}={v}\n" for k, v in self.exports().items()))
        return sources

    def _require_running(self) -> None:
        if not self.running:
            raise RuntimeError("the local cloud is not running: call start() first")
