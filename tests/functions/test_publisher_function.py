"""The Publisher function on moto: the jobs table's real stream in, `GPU Job State Change` events out.

The stream is moto's DynamoDB stream of the template's table (NEW_AND_OLD_IMAGES); the mapping is
played by `MotoStack.publish_state_changes` (filters, batch size and partial batch responses as the
template declares them); the events land on the stack's bus, where a rule hands them to a queue a
subscriber reads.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpujobs.adapters.dynamodb import DynamoJobStore
from gpujobs.adapters.job_stream import stream_record
from gpujobs.service.outbox import StreamedWrite, UnreadableWrite
from gpujobs_local.stack import LambdaContext, MotoStack
from tests.conftest import load_function

pytestmark = pytest.mark.integration

SPEC: dict[str, Any] = {
    "name": "digits",
    "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/gpujobs-train:1",
    "command": ["python", "train.py"],
    "instance_types": ["g5.xlarge"],
    "team": "vision",
}


def _submit(stack: MotoStack) -> str:
    stack.send(SPEC)
    stack.deliver(load_function("submit").handler)
    (job_id,) = [i["job_id"]["S"] for i in stack.ddb.scan(TableName=stack.table)["Items"] if i["sk"]["S"] == "JOB"]
    return str(job_id)


def _history(stack: MotoStack, job_id: str) -> list[tuple[str | None, str]]:
    job = DynamoJobStore(table_name=stack.table, client=stack.ddb).get(job_id)
    return [(h.source.value if h.source else None, h.target.value) for h in job.history]


def test_every_transition_a_handler_wrote_reaches_the_bus_from_the_stream_in_order(stack: MotoStack) -> None:
    # Given a job the submit function recorded and launched (it published nothing itself)
    job_id = _submit(stack)
    assert stack.observed_events(publish=False) == []

    # When the stream mapping invokes the Publisher function
    responses = stack.publish_state_changes()

    # Then each write's transitions are on the bus once, in the job's order, with their event ids
    assert responses
    assert all(r == {"batchItemFailures": []} for r in responses)
    events = [e["detail"] for e in stack.observed_events(publish=False) if e["detail"]["job_id"] == job_id]
    assert [(e["from"], e["to"]) for e in events] == _history(stack, job_id)
    assert [e["event_id"] for e in events] == [f"{job_id}:{n}" for n in range(1, len(events) + 1)]
    assert stack.publish_state_changes() == []  # nothing read twice once done


def test_a_put_events_that_fails_is_answered_as_that_records_failure_and_published_on_the_retry(
    stack: MotoStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = _submit(stack)
    publisher = load_function("publisher")

    def refused(**_: Any) -> None:
        raise ConnectionError("EventBridge unreachable")

    # Given EventBridge unreachable
    stack.on_aws("before-call.events.PutEvents", refused)
    (first,) = stack.publish_state_changes()

    # Then the batch names its first record as failed: Lambda reads it, and all after it, again
    (failure,) = first["batchItemFailures"]
    assert stack.observed_events(publish=False) == []

    # When EventBridge answers again (a new container: the hook was on the old client)
    stack.off_aws("before-call.events.PutEvents", refused)
    from gpujobs.runtime import bootstrap

    bootstrap.reset()
    stack.publish_state_changes()

    events = [e["detail"] for e in stack.observed_events(publish=False) if e["detail"]["job_id"] == job_id]
    assert [(e["from"], e["to"]) for e in events] == _history(stack, job_id)
    assert failure["itemIdentifier"]
    assert publisher.handler({"Records": []}, LambdaContext()) == {"batchItemFailures": []}


def test_records_that_are_not_a_jobs_write_are_nothing_to_publish_and_an_unreadable_one_is_named() -> None:
    keys = {"pk": {"S": "JOB#j-0123456789abcdef"}, "sk": {"S": "JOB"}}
    instance = {"eventName": "INSERT", "dynamodb": {"Keys": {**keys, "sk": {"S": "INSTANCE#i-0abc"}}}}
    removal = {"eventName": "REMOVE", "dynamodb": {"Keys": keys, "SequenceNumber": "1"}}
    newer = {
        "eventName": "MODIFY",
        "dynamodb": {
            "Keys": keys,
            "SequenceNumber": "7",
            "OldImage": {**keys, "doc": {"S": "{}"}, "version": {"N": "1"}},
            "NewImage": {**keys, "doc": {"S": '{"state": "PAUSED"}'}, "version": {"N": "2"}},
        },
    }
    keys_only = {"eventName": "MODIFY", "dynamodb": {"Keys": keys, "SequenceNumber": "8"}}

    assert stream_record(instance) is None
    assert stream_record(removal) is None
    unreadable = stream_record(newer)
    assert isinstance(unreadable, UnreadableWrite)
    assert (unreadable.position, unreadable.key) == ("7", "JOB#j-0123456789abcdef")
    assert "NEW_AND_OLD_IMAGES" in str(getattr(stream_record(keys_only), "problem", ""))
    assert not isinstance(stream_record(keys_only), StreamedWrite)


def test_the_local_mapping_reads_again_from_the_lowest_failed_record_and_skips_what_no_filter_matches(
    stack: MotoStack,
) -> None:
    """The local cloud's reading of the stream, as Lambda's mapping: the local stories rely on it."""
    _submit(stack)
    stack.publish_state_changes()  # done with everything so far
    stack.send({**SPEC, "name": "another", "client_token": "another"})
    stack.deliver(load_function("submit").handler)  # its creation, claim and launch: three writes
    reader = stack.table_stream()

    batch = reader.next_batch()
    assert batch is not None
    keys = {r["dynamodb"]["Keys"]["sk"]["S"] for r in batch.event["Records"]}
    assert keys == {"JOB"}  # the instance index items were filtered out
    assert len(batch.sequences) >= 2
    assert not reader.finished(batch, {"batchItemFailures": [{"itemIdentifier": batch.sequences[1]}]}, failed=False)

    again = reader.next_batch()
    assert again is not None
    assert again.sequences[0] == batch.sequences[1]
    assert reader.finished(again, {"batchItemFailures": []}, failed=False)
    assert reader.next_batch() is None
