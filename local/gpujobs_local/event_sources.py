"""The stack's event sources, built from the template's routes, each a poll the loop thread calls.

Every `Events:` entry the template declares (`router.routes()`) becomes a source here; nothing is
wired per function:

- SQS (the jobs queue): batches of up to BatchSize, `batchItemFailures` honoured, failed messages
  back after `retry_delay` seconds, the queue's redrive moving them to its DLQ.
- DynamoDB (the jobs table's stream): `streams.TableStream` reads moto's stream as the mapping
  does (filters, checkpoint, partial batch responses); a failed batch comes again after
  `retry_delay` seconds, and once `MaximumRetryAttempts` are used up its place in the stream goes
  to the OnFailure destination and the mapping moves on.
- EventBridgeRule: a real rule in moto with an SQS queue as its target; `account` put back (moto
  drops it); each event invoked alone, as Lambda's asynchronous invocation does.
- SNS: an SQS queue subscribed to the topic (envelope, not raw), turned into the Lambda SNS event.
- Schedule: not polled; `run_schedules()` invokes it, on the loop's period or on demand.

Rules and topics go through SQS because that is what moto delivers to; the queue's receive count
is the attempt number, and its visibility timeout is the wait before an asynchronous retry.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpujobs_local import router
from gpujobs_local.invoker import LambdaInvoker
from gpujobs_local.router import ACCOUNT, Route
from gpujobs_local.streams import TableStream, filter_patterns

Poll = Callable[[], bool]
"""One look at a source: invoke what waits there; True if anything did."""

_IN_FLIGHT_VISIBILITY = 60  # seconds a received message stays hidden while its handler runs


class EventSources:
    """What the template routes to the functions, as polls over moto (see the module docstring)."""

    def __init__(
        self,
        *,
        routes: Iterable[Route],
        invoker: LambdaInvoker,
        clients: Mapping[str, Any],
        queues: Mapping[str, str],
        refs: Mapping[str, str],
        retry_delay: int,
        senders: Mapping[str, str] | None = None,
    ) -> None:
        """`clients`: boto3 `sqs`, `events`, `sns`, `dynamodb` and `dynamodbstreams` clients; `queues`:
        queue URL by logical id (the queues SQS events name); `refs`: bus name, topic ARN and table
        name by logical id; `senders`: the
        `SenderId` by message id for messages sent as another principal than moto's default user
        (read at each delivery, so entries added later apply)."""
        self.routes = list(routes)
        self.stack_name = invoker.stack_name
        self.region = invoker.region
        self.retry_delay = retry_delay
        self._senders: Mapping[str, str] = {} if senders is None else senders
        self._invoker = invoker
        self._sqs, self._events, self._sns = clients["sqs"], clients["events"], clients["sns"]
        self.polls: list[Poll] = []
        for route in self.routes:
            if route.kind == "SQS":
                self.polls.append(self._sqs_source(route, queues[route.target("Queue")]))
            elif route.kind == "EventBridgeRule":
                self.polls.append(self._rule_source(route, refs))
            elif route.kind == "SNS":
                self.polls.append(self._topic_source(route, refs[route.target("Topic")]))
            elif route.kind == "DynamoDB":
                self.polls.append(self._stream_source(route, refs[route.target("Stream")], clients))

    def run_schedules(self) -> dict[str, Any]:
        """Invoke every scheduled function now, retrying at once; returns the (last) handler result.

        Raises the handler's error once its retries are used up (the event is dead-lettered first).
        """
        result: dict[str, Any] = {}
        for route in self.routes:
            if route.kind != "Schedule":
                continue
            rule_arn = f"arn:aws:events:{self.region}:{ACCOUNT}:rule/{self.stack_name}-{route.name}"
            event = router.scheduled_event(rule_arn=rule_arn, region=self.region)
            for attempt in range(1, route.async_retries + 2):
                delivery = self._invoker.invoke_async(route, "Scheduled Event", event, attempt=attempt)
                if delivery.error is None:
                    if isinstance(delivery.result, dict):
                        result = delivery.result
                    break
                if delivery.dead_lettered:
                    raise delivery.error
        return result

    # ---- the sources -------------------------------------------------------------------------
    def _queue_arn(self, url: str) -> str:
        return str(self._sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"])

    def _queue_for(self, route: Route) -> tuple[str, str]:
        url = self._sqs.create_queue(QueueName=f"{self.stack_name}-{route.name}"[:80])["QueueUrl"]
        return url, self._queue_arn(url)

    def _sqs_source(self, route: Route, url: str) -> Poll:
        sqs = self._sqs
        arn = self._queue_arn(url)

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
            event = {"Records": [_sqs_record(m, arn, self.region, self._senders.get(m["MessageId"])) for m in messages]}
            attempt = max(int(m.get("Attributes", {}).get("ApproximateReceiveCount", 1)) for m in messages)
            delivery = self._invoker.invoke(route, "SQS", event, attempt=attempt, last=False)
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

    def _stream_source(self, route: Route, table: str, clients: Mapping[str, Any]) -> Poll:
        stream_arn = str(clients["dynamodb"].describe_table(TableName=table)["Table"]["LatestStreamArn"])
        reader = TableStream(
            client=clients["dynamodbstreams"],
            stream_arn=stream_arn,
            batch_size=route.batch_size,
            filters=filter_patterns(route.properties),
            region=self.region,
        )
        state = {"attempt": 0, "retry_at": 0.0}

        def poll() -> bool:
            if time.monotonic() < state["retry_at"]:
                return False
            batch = reader.next_batch()
            if batch is None:
                return False
            state["attempt"] += 1
            attempt = int(state["attempt"])
            delivery = self._invoker.invoke(route, "DynamoDB", batch.event, attempt=attempt, last=False)
            if reader.finished(batch, delivery.result, failed=delivery.error is not None):
                state["attempt"] = 0
                return True
            if 0 <= route.stream_retries < attempt:
                self._invoker.send_to_destination(
                    route,
                    router.stream_failure_record(
                        function_arn=self._invoker.function_arn(route.function),
                        stream_arn=stream_arn,
                        shard=batch.shard,
                        sequences=batch.sequences,
                        invocations=attempt,
                    ),
                )
                reader.skip(batch)
                state["attempt"] = 0
            else:
                state["retry_at"] = time.monotonic() + self.retry_delay
            return True

        return poll

    def _rule_source(self, route: Route, refs: Mapping[str, str]) -> Poll:
        bus_id = route.bus_logical_id
        bus = "default" if bus_id is None else refs[bus_id]
        rule = f"{self.stack_name}-{route.name}"[:64]
        url, arn = self._queue_for(route)
        pattern = route.pattern(stack_name=self.stack_name, region=self.region)
        self._events.put_rule(Name=rule, EventBusName=bus, EventPattern=json.dumps(pattern), State="ENABLED")
        self._events.put_targets(Rule=rule, EventBusName=bus, Targets=[{"Id": "local-lambda", "Arn": arn}])
        return self._async_queue_source(route, url, router.eventbridge_event)

    def _topic_source(self, route: Route, topic_arn: str) -> Poll:
        url, arn = self._queue_for(route)
        subscription = self._sns.subscribe(TopicArn=topic_arn, Protocol="sqs", Endpoint=arn)["SubscriptionArn"]
        return self._async_queue_source(route, url, lambda body: router.sns_event(body, subscription_arn=subscription))

    def _async_queue_source(self, route: Route, url: str, to_event: Callable[[str], dict[str, Any]]) -> Poll:
        sqs = self._sqs

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
                    self._invoker.dead_letter(route, {"body": m["Body"]}, exc, attempt)
                    sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
                    continue
                kind = "SNS" if route.kind == "SNS" else str(event.get("detail-type", route.kind))
                delivery = self._invoker.invoke_async(route, kind, event, attempt=attempt)
                if delivery.error is not None and not delivery.dead_lettered:
                    sqs.change_message_visibility(
                        QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=self.retry_delay
                    )
                    continue
                sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
            return bool(messages)

        return poll


def _sqs_record(m: dict[str, Any], arn: str, region: str, sender: str | None = None) -> dict[str, Any]:
    attributes = m.get("Attributes", {})
    return {
        "messageId": m["MessageId"],
        "receiptHandle": m["ReceiptHandle"],
        "body": m["Body"],
        "attributes": attributes if sender is None else {**attributes, "SenderId": sender},
        "messageAttributes": m.get("MessageAttributes", {}),
        "md5OfBody": m["MD5OfBody"],
        "eventSource": "aws:sqs",
        "eventSourceARN": arn,
        "awsRegion": region,
    }
