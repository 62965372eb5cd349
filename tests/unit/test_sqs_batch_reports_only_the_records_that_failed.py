"""The submit function's batch loop reports exactly the records whose handler raised, as the
Powertools batch processor it replaces did (the last tests run both on the same batches)."""

from __future__ import annotations

from typing import Any

import pytest
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.batch.exceptions import BatchProcessingError

from gpujobs.runtime.sqs_batch import AllRecordsFailedError, NotAnSqsBatchError, SqsRecord, process_sqs_batch


class ThrottledError(Exception):
    """A transient AWS error a record's handler met."""


class Stop(BaseException):
    """Not an Exception: nothing a record did wrong, so no batch loop may swallow it."""


def sqs_event(*bodies: str) -> dict[str, Any]:
    return {
        "Records": [
            {
                "messageId": f"m-{i}",
                "receiptHandle": f"h-{i}",
                "body": body,
                "attributes": {"SenderId": "AIDAEXAMPLE", "ApproximateReceiveCount": "1"},
                "messageAttributes": {},
                "md5OfBody": "x",
                "eventSource": "aws:sqs",
                "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:submissions",
                "awsRegion": "us-east-1",
            }
            for i, body in enumerate(bodies)
        ]
    }


class Handler:
    """Records what it was handed; raises what a body names."""

    def __init__(self) -> None:
        self.handled: list[tuple[str, str, str | None]] = []

    def __call__(self, record: Any) -> None:
        self.handled.append((record.message_id, record.body, record.attributes.get("SenderId")))
        if record.body == "throttled":
            raise ThrottledError("slow down")
        if record.body == "stop":
            raise Stop


def test_the_middle_record_failing_is_the_only_one_reported_and_the_others_are_handled() -> None:
    handler = Handler()

    response = process_sqs_batch(sqs_event("a", "throttled", "c"), handler)

    assert response == {"batchItemFailures": [{"itemIdentifier": "m-1"}]}
    assert handler.handled == [
        ("m-0", "a", "AIDAEXAMPLE"),
        ("m-1", "throttled", "AIDAEXAMPLE"),
        ("m-2", "c", "AIDAEXAMPLE"),
    ]


def test_a_batch_that_all_went_well_reports_no_failures() -> None:
    assert process_sqs_batch(sqs_event("a", "b"), Handler()) == {"batchItemFailures": []}


def test_a_batch_whose_every_record_failed_fails_the_invocation_with_each_traceback() -> None:
    with pytest.raises(AllRecordsFailedError) as failed:
        process_sqs_batch(sqs_event("throttled", "throttled"), Handler())

    assert len(failed.value.errors) == 2
    assert str(failed.value).startswith("All records failed processing. 2 individual errors logged separately below.")
    assert str(failed.value).count("ThrottledError: slow down") == 2


@pytest.mark.parametrize("event", [{"Records": []}, {}, {"Records": "m-0"}], ids=["empty", "none", "not-a-list"])
def test_an_event_without_records_is_not_an_sqs_batch(event: dict[str, Any]) -> None:
    handler = Handler()

    with pytest.raises(NotAnSqsBatchError):
        process_sqs_batch(event, handler)

    assert handler.handled == []


def test_a_base_exception_that_is_no_exception_is_not_swallowed_and_ends_the_batch() -> None:
    handler = Handler()

    with pytest.raises(Stop):
        process_sqs_batch(sqs_event("throttled", "stop", "c"), handler)

    assert [message_id for message_id, _, _ in handler.handled] == ["m-0", "m-1"]


def test_a_record_reads_as_lambda_delivered_it() -> None:
    (raw,) = sqs_event("{}")["Records"]

    record = SqsRecord(raw)

    assert (record.message_id, record.body, record.attributes["ApproximateReceiveCount"]) == ("m-0", "{}", "1")


def powertools(event: dict[str, Any], handler: Handler) -> Any:
    return process_partial_response(event=event, record_handler=handler, processor=BatchProcessor(EventType.SQS))


@pytest.mark.parametrize(
    "bodies",
    [("a", "throttled", "c"), ("a", "b"), ("throttled",), ("throttled", "a", "throttled")],
    ids=["middle-fails", "all-well", "the-only-one-fails", "two-of-three-fail"],
)
def test_the_loop_answers_what_powertools_batch_processor_answered(bodies: tuple[str, ...]) -> None:
    ours, theirs = Handler(), Handler()

    try:
        expected: Any = powertools(sqs_event(*bodies), theirs)
    except BatchProcessingError:
        expected = AllRecordsFailedError
    try:
        got: Any = process_sqs_batch(sqs_event(*bodies), ours)
    except AllRecordsFailedError:
        got = AllRecordsFailedError

    assert got == expected
    assert ours.handled == theirs.handled


@pytest.mark.parametrize("event", [{"Records": []}, {}], ids=["empty", "none"])
def test_powertools_refused_an_event_without_records_too(event: dict[str, Any]) -> None:
    with pytest.raises(BatchProcessingError):
        powertools(event, Handler())


def test_powertools_did_not_swallow_a_base_exception_either() -> None:
    handler = Handler()

    with pytest.raises(Stop):
        powertools(sqs_event("throttled", "stop", "c"), handler)

    assert [message_id for message_id, _, _ in handler.handled] == ["m-0", "m-1"]
