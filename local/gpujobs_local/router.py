"""Which event reaches which function, read from template.yaml, and the event shapes Lambda gets.

Every `Events:` entry of every `AWS::Serverless::Function` in the template becomes a `Route`: an SQS
queue it consumes (batch size), a DynamoDB table's stream it reads (batch size, filters, retries), an
EventBridge rule (bus, pattern with `!Sub` resolved), an SNS topic or a schedule. Nothing here is hard-coded per function: add an event to the template and the local
cloud delivers it. The helpers below build what Lambda hands a handler for each kind of source
(SQS batch, SNS record, scheduled event) and what a Lambda on-failure destination receives.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gpujobs_local import template

ACCOUNT = "123456789012"
LAMBDA_DEFAULT_ASYNC_RETRIES = 2  # Lambda's default for asynchronous invocations


class RouteError(Exception):
    """The template holds an event source the local cloud cannot deliver."""


@dataclass(frozen=True)
class Route:
    """One event source of one function, as the template declares it."""

    function: str  # logical id, e.g. InstanceStateFunction
    module: str  # functions/<module>/app.py
    event_name: str  # the key under Events:, e.g. StateChanges
    kind: str  # SQS | DynamoDB | EventBridgeRule | SNS | Schedule
    properties: dict[str, Any] = field(default_factory=dict)
    async_retries: int = LAMBDA_DEFAULT_ASYNC_RETRIES  # EventInvokeConfig.MaximumRetryAttempts
    on_failure: str | None = None  # logical id of the OnFailure destination queue (the event's own, for a stream)

    @property
    def name(self) -> str:
        return f"{self.function}{self.event_name}"

    def target(self, key: str) -> str:
        """The logical id a property refers to (`!Ref X` or `!GetAtt X.Arn`)."""
        value = self.properties[key]
        if isinstance(value, dict) and "Ref" in value:
            return str(value["Ref"])
        if isinstance(value, dict) and "Fn::GetAtt" in value:
            return str(value["Fn::GetAtt"][0])
        raise RouteError(f"{self.name}.{key} is {value!r}: not a reference to a resource of this stack")

    @property
    def bus_logical_id(self) -> str | None:
        """None for the default bus, else the logical id of the stack's bus."""
        if "EventBusName" not in self.properties:
            return None
        return self.target("EventBusName")

    def pattern(self, *, stack_name: str, region: str) -> dict[str, Any]:
        refs = {
            "AWS::StackName": stack_name,
            "AWS::Region": region,
            "AWS::AccountId": ACCOUNT,
            "AWS::Partition": "aws",
        }
        resolved: dict[str, Any] = template._resolve(self.properties["Pattern"], refs, {})
        return resolved

    @property
    def batch_size(self) -> int:
        return int(self.properties.get("BatchSize", 10))

    @property
    def stream_retries(self) -> int:
        """A stream mapping's `MaximumRetryAttempts` (-1: until the record expires)."""
        return int(self.properties.get("MaximumRetryAttempts", -1))

    @property
    def reports_batch_failures(self) -> bool:
        return "ReportBatchItemFailures" in self.properties.get("FunctionResponseTypes", [])


def routes() -> list[Route]:
    """Every event source in template.yaml, in template order."""
    found: list[Route] = []
    for logical_id, resource in template.resources_of_type("AWS::Serverless::Function").items():
        props = resource.get("Properties", {})
        code_uri = str(props.get("CodeUri", "")).rstrip("/")
        module = code_uri.rsplit("/", 1)[-1]
        invoke_config = props.get("EventInvokeConfig", {})
        retries = int(invoke_config.get("MaximumRetryAttempts", LAMBDA_DEFAULT_ASYNC_RETRIES))
        destination = invoke_config.get("DestinationConfig", {}).get("OnFailure", {}).get("Destination")
        on_failure = _logical_id(destination)
        for event_name, event in props.get("Events", {}).items():
            kind = event["Type"]
            if kind not in ("SQS", "DynamoDB", "EventBridgeRule", "SNS", "Schedule"):
                raise RouteError(f"{logical_id}.{event_name}: event type {kind} is not delivered locally")
            event_props = event.get("Properties", {})
            if kind == "DynamoDB":  # a mapping's own destination, not the asynchronous invocations'
                stream_destination = event_props.get("DestinationConfig", {}).get("OnFailure", {}).get("Destination")
                on_failure = _logical_id(stream_destination)
            found.append(
                Route(
                    function=logical_id,
                    module=module,
                    event_name=event_name,
                    kind=kind,
                    properties=event_props,
                    async_retries=retries,
                    on_failure=on_failure,
                )
            )
    return found


def _logical_id(destination: Any) -> str | None:
    """The logical id a destination's `!GetAtt X.Arn` names, or None."""
    return destination["Fn::GetAtt"][0] if isinstance(destination, dict) and "Fn::GetAtt" in destination else None


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def scheduled_event(*, rule_arn: str, region: str) -> dict[str, Any]:
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": ACCOUNT,
        "time": _now(),
        "region": region,
        "resources": [rule_arn],
        "detail": {},
    }


def eventbridge_event(body: str) -> dict[str, Any]:
    """An event from a rule's SQS target, as Lambda would get it: moto drops `account` (§0.6)."""
    event: dict[str, Any] = json.loads(body)
    event.setdefault("account", ACCOUNT)
    event.setdefault("version", "0")
    event.setdefault("resources", [])
    return event


def sns_event(body: str, *, subscription_arn: str) -> dict[str, Any]:
    """The Lambda SNS event for one SNS envelope delivered (not raw) to an SQS queue."""
    envelope: dict[str, Any] = json.loads(body)
    return {
        "Records": [
            {
                "EventSource": "aws:sns",
                "EventVersion": "1.0",
                "EventSubscriptionArn": subscription_arn,
                "Sns": {
                    "Type": envelope.get("Type", "Notification"),
                    "MessageId": envelope.get("MessageId", str(uuid.uuid4())),
                    "TopicArn": envelope.get("TopicArn", ""),
                    "Subject": envelope.get("Subject"),
                    "Message": envelope.get("Message", ""),
                    "Timestamp": envelope.get("Timestamp", _now()),
                    "SignatureVersion": envelope.get("SignatureVersion", "1"),
                    "Signature": envelope.get("Signature", ""),
                    "SigningCertUrl": envelope.get("SigningCertURL", ""),
                    "UnsubscribeUrl": envelope.get("UnsubscribeURL", ""),
                    "MessageAttributes": envelope.get("MessageAttributes", {}),
                },
            }
        ]
    }


def destination_record(
    *, function_arn: str, event: Mapping[str, Any], error: BaseException, invocations: int
) -> dict[str, Any]:
    """What Lambda sends to an OnFailure destination once an asynchronous invocation gave up."""
    return {
        "version": "1.0",
        "timestamp": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "requestContext": {
            "requestId": str(uuid.uuid4()),
            "functionArn": f"{function_arn}:$LATEST",
            "condition": "RetriesExhausted",
            "approximateInvokeCount": invocations,
        },
        "requestPayload": dict(event),
        "responseContext": {"statusCode": 200, "executedVersion": "$LATEST", "functionError": "Unhandled"},
        "responsePayload": {"errorMessage": str(error)[:2000], "errorType": type(error).__name__, "stackTrace": []},
    }


def stream_failure_record(
    *, function_arn: str, stream_arn: str, shard: str, sequences: list[str], invocations: int
) -> dict[str, Any]:
    """What a stream mapping sends to its OnFailure destination once it gives up on a batch: where
    the records are, not the records."""
    return {
        "requestContext": {
            "requestId": str(uuid.uuid4()),
            "functionArn": function_arn,
            "condition": "RetryAttemptsExhausted",
            "approximateInvokeCount": invocations,
        },
        "version": "1.0",
        "timestamp": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "DDBStreamBatchInfo": {
            "shardId": shard,
            "startSequenceNumber": sequences[0],
            "endSequenceNumber": sequences[-1],
            "batchSize": len(sequences),
            "streamArn": stream_arn,
        },
    }


def summarize(kind: str, event: Mapping[str, Any]) -> str:
    """One short line naming what an event is about (for progress displays)."""
    if kind == "SQS":
        records = event.get("Records", [])
        return f"{len(records)} message(s)"
    if kind == "DynamoDB":
        return f"{len(event.get('Records', []))} stream record(s)"
    if kind == "SNS":
        sns = event.get("Records", [{}])[0].get("Sns", {})
        return str(sns.get("Subject") or sns.get("Message", ""))[:100]
    detail = event.get("detail") if isinstance(event.get("detail"), dict) else {}
    assert isinstance(detail, dict)
    keys = ("job_id", "instance-id", "state", "alarmName", "exit_code", "step")
    parts = [f"{k}={detail[k]}" for k in keys if k in detail and not isinstance(detail[k], dict)]
    if isinstance(detail.get("state"), dict):
        parts.append(f"state={detail['state'].get('value')}")
    return " ".join([str(event.get("source", "")), *parts])
