"""The samples under events/ are events AWS would really deliver, to the function that handles them.

Each folder is named after the function it feeds (`events/spot/` -> `functions/spot/`, the
`SpotFunction` in template.yaml). The samples double as `sam local invoke <Function> -e <file>`
input and as fixtures, so a sample that AWS would never send, or that the function's rule would
never route, would make every test built on it a test of nothing. So:

- every file is JSON, and is an EventBridge event, an SNS or an SQS Lambda event;
- an EventBridge sample has the whole envelope and a real timestamp (the AWS docs' examples carry
  the placeholder `yyyy-mm-ddThh:mm:ssZ`, which no parser accepts);
- an EventBridge sample matches a rule of its own function in template.yaml, on the right bus, and
  no rule of any other function (matching uses moto's implementation of EventBridge patterns;
  `!Sub` in a pattern is resolved for a stack named "gpujobs", the name the samples use).

No AWS, no moto server: this reads files only.
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.parser.models import EventBridgeModel, SnsModel
from moto.events.models import EventPattern

from gpujobs_local.template import properties, resources_of_type

EVENTS = Path(__file__).resolve().parents[2] / "events"
SAMPLES = sorted(EVENTS.rglob("*.json"))
STACK = "gpujobs"
ACCOUNT, REGION = "123456789012", "us-east-1"
ENVELOPE = {"version", "id", "detail-type", "source", "account", "time", "region", "resources", "detail"}
EVENTBRIDGE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
SNS_RECORD_KEYS = {"EventSource", "EventVersion", "EventSubscriptionArn", "Sns"}
SNS_KEYS = {
    "Type",
    "MessageId",
    "TopicArn",
    "Subject",
    "Message",
    "Timestamp",
    "SignatureVersion",
    "Signature",
    "SigningCertUrl",
    "UnsubscribeUrl",
    "MessageAttributes",
}


# ------------------------------------------------------------------------------ helpers
def _load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _name(path: Path) -> str:
    return str(path.relative_to(EVENTS))


def _kind(event: Any) -> str:
    if isinstance(event, dict) and "detail-type" in event:
        return "eventbridge"
    records = event.get("Records") if isinstance(event, dict) else None
    if isinstance(records, list) and records:
        sources = {r.get("EventSource") or r.get("eventSource") for r in records}
        if sources == {"aws:sns"}:
            return "sns"
        if sources == {"aws:sqs"}:
            return "sqs"
    return "unknown"


def _function_for(path: Path) -> str:
    """events/<folder>/... feeds the function whose CodeUri is functions/<folder>/."""
    folder = path.relative_to(EVENTS).parts[0]
    for logical_id, res in resources_of_type("AWS::Serverless::Function").items():
        if res["Properties"]["CodeUri"] == f"functions/{folder}/":
            return logical_id
    raise AssertionError(f"events/{folder}/ has no function with CodeUri functions/{folder}/")


def _resolve_sub(value: Any) -> Any:
    """A pattern with its `!Sub` strings resolved for the sample stack; any other intrinsic is an error."""
    if isinstance(value, list):
        return [_resolve_sub(v) for v in value]
    if isinstance(value, dict):
        if set(value) == {"Fn::Sub"} and isinstance(value["Fn::Sub"], str):
            text = value["Fn::Sub"]
            for name, resolved in {"AWS::StackName": STACK, "AWS::AccountId": ACCOUNT, "AWS::Region": REGION}.items():
                text = text.replace("${" + name + "}", resolved)
            assert "${" not in text, f"cannot resolve {value!r} for the samples"
            return text
        assert not any(k.startswith("Fn::") or k == "Ref" for k in value), f"cannot resolve {value!r} in a pattern"
        return {k: _resolve_sub(v) for k, v in value.items()}
    return value


def _events_of(logical_id: str, event_type: str) -> dict[str, dict[str, Any]]:
    return {
        name: event["Properties"]
        for name, event in properties(logical_id).get("Events", {}).items()
        if event["Type"] == event_type
    }


def _rules() -> list[tuple[str, str, dict[str, Any], bool]]:
    """(function, event name, resolved pattern, on the stack's own bus) for every EventBridgeRule."""
    found = []
    for logical_id in resources_of_type("AWS::Serverless::Function"):
        for name, props in _events_of(logical_id, "EventBridgeRule").items():
            own_bus = props.get("EventBusName") == {"Ref": "JobsEventBus"}
            assert own_bus or "EventBusName" not in props, (logical_id, name, props.get("EventBusName"))
            found.append((logical_id, name, _resolve_sub(props["Pattern"]), own_bus))
    return found


def _matches(pattern: dict[str, Any], event: dict[str, Any]) -> bool:
    # moto types the event as its own TypedDict; a sample is plain JSON of the same shape.
    return bool(EventPattern.load(json.dumps(pattern)).matches_event(cast(Any, event)))


def _eventbridge_samples() -> list[Path]:
    return [p for p in SAMPLES if _kind(_load(p)) == "eventbridge"]


def _sns_samples() -> list[Path]:
    return [p for p in SAMPLES if _kind(_load(p)) == "sns"]


# -------------------------------------------------------------------------------- tests
def test_there_are_samples_for_every_function_that_reacts_to_the_cloud() -> None:
    folders = {p.relative_to(EVENTS).parts[0] for p in SAMPLES}

    assert folders >= {"submit", "spot", "instance_state", "reports", "idle", "budget", "reconciler"}


@pytest.mark.parametrize("path", SAMPLES, ids=_name)
def test_every_sample_is_an_event_shape_lambda_receives(path: Path) -> None:
    event = _load(path)

    assert _kind(event) != "unknown", f"{_name(path)} is neither an EventBridge, an SNS nor an SQS event"


@pytest.mark.parametrize("path", _eventbridge_samples(), ids=_name)
def test_an_eventbridge_sample_has_the_whole_envelope_and_a_real_time(path: Path) -> None:
    event = _load(path)

    assert set(event) >= ENVELOPE, ENVELOPE - set(event)
    assert event["version"] == "0"
    assert uuid.UUID(event["id"])
    assert (event["account"], event["region"]) == (ACCOUNT, REGION)
    assert isinstance(event["resources"], list)
    assert isinstance(event["detail"], dict)
    assert EVENTBRIDGE_TIME.match(event["time"]), event["time"]
    when = datetime.strptime(event["time"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert when.year == 2026
    parsed = parse(event=event, model=EventBridgeModel)
    assert parsed.time == when


@pytest.mark.parametrize("path", _eventbridge_samples(), ids=_name)
def test_an_eventbridge_sample_is_routed_to_its_own_function_and_to_no_other(path: Path) -> None:
    # Given a sample and the function its folder feeds
    event = _load(path)
    function = _function_for(path)
    # When the template's rules look at it
    if event["detail-type"] == "Scheduled Event":
        # A schedule rule has no pattern: EventBridge sends this envelope on every tick.
        assert event["source"] == "aws.events"
        assert _events_of(function, "Schedule"), f"{function} has no Schedule event"
        assert event["resources"][0].startswith(f"arn:aws:events:{REGION}:{ACCOUNT}:rule/")
        return
    matched = [(fn, name, own_bus) for fn, name, pattern, own_bus in _rules() if _matches(pattern, event)]
    # Then exactly its own function receives it, on the bus such events travel on
    assert {fn for fn, _, _ in matched} == {function}, matched
    from_aws = event["source"].startswith("aws.")
    assert all(own_bus is not from_aws for _, _, own_bus in matched), (
        "AWS services publish on the default bus; gpujobs reports on the stack's own bus",
        matched,
    )


@pytest.mark.parametrize("path", _sns_samples(), ids=_name)
def test_an_sns_sample_is_the_lambda_sns_event_of_the_budget_alerts_topic(path: Path) -> None:
    event = _load(path)
    function = _function_for(path)

    parse(event=event, model=SnsModel)
    assert _events_of(function, "SNS"), f"{function} has no SNS event"
    for record in event["Records"]:
        assert set(record) >= SNS_RECORD_KEYS
        assert (record["EventSource"], record["EventVersion"]) == ("aws:sns", "1.0")
        sns = record["Sns"]
        assert set(sns) >= SNS_KEYS, SNS_KEYS - set(sns)
        assert sns["Type"] == "Notification"
        assert isinstance(sns["Message"], str)
        assert sns["TopicArn"].startswith(f"arn:aws:sns:{REGION}:{ACCOUNT}:{STACK}-BudgetAlertsTopic-")
        assert record["EventSubscriptionArn"].startswith(sns["TopicArn"] + ":")
        assert datetime.fromisoformat(sns["Timestamp"]).year == 2026


def test_the_idle_rule_ignores_other_stacks_and_other_alarm_states() -> None:
    # Given the GPU-idle sample of stack "gpujobs"
    alarm = _load(EVENTS / "idle" / "gpu-idle-alarm.json")
    (pattern,) = [p for fn, _, p, _ in _rules() if fn == "IdleFunction"]
    assert _matches(pattern, alarm)
    # When the same alarm belongs to a stack whose name starts with ours, or is back to OK
    other_stack = json.loads(json.dumps(alarm).replace("gpujobs-idle-gpujobs-", "gpujobs-idle-gpujobs-staging-"))
    back_to_ok = json.loads(json.dumps(alarm))
    back_to_ok["detail"]["state"]["value"] = "OK"
    # Then neither reaches this stack's idle function
    assert not _matches(pattern, other_stack)
    assert not _matches(pattern, back_to_ok)


def test_the_state_rule_leaves_pending_instances_alone() -> None:
    running = _load(EVENTS / "instance_state" / "running.json")
    pending = {**running, "detail": {**running["detail"], "state": "pending"}}
    (pattern,) = [p for fn, _, p, _ in _rules() if fn == "InstanceStateFunction"]

    assert _matches(pattern, running)
    assert not _matches(pattern, pending)
