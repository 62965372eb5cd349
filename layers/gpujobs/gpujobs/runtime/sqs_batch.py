"""SQS partial batch responses: the submit function's loop over its records.

Our own loop rather than Powertools' batch utility, for its cold start: importing
`aws_lambda_powertools.utilities.batch` loads every event source's data classes, asyncio and, with
pydantic installed, the parser's models of SQS, Kinesis, DynamoDB and Kafka records (about a third
of `import boto3`), where submit needs one loop. It behaves as
`process_partial_response(event=..., record_handler=..., processor=BatchProcessor(EventType.SQS))`
did (Powertools 3.x, read from its `utilities/batch/base.py` and `decorators.py`):

- each record goes to the handler in order; a record whose handler raised an `Exception` is listed
  in `batchItemFailures` by its messageId and the next record is handled (the function reports
  batch item failures, so SQS retries only those, then dead-letters them);
- when every record of the batch failed, the invocation fails (`AllRecordsFailedError`, with each
  record's traceback in its text) and SQS retries the whole batch;
- a `BaseException` that is not an `Exception` (SystemExit, KeyboardInterrupt) is not swallowed:
  it ends the invocation at once;
- an event without a non-empty `Records` list is not an SQS batch (`NotAnSqsBatchError`).
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable, Mapping
from typing import Any, TypedDict

logger = logging.getLogger(__name__)


class ItemFailure(TypedDict):
    itemIdentifier: str


class PartialBatchResponse(TypedDict):
    """What a function that reports batch item failures returns to its SQS event source mapping."""

    batchItemFailures: list[ItemFailure]


class SqsRecord:
    """One record of an SQS event, as Lambda delivers it (the fields the handler reads)."""

    __slots__ = ("raw",)

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.raw = raw

    @property
    def message_id(self) -> str:
        return str(self.raw["messageId"])

    @property
    def body(self) -> str:
        return str(self.raw["body"])

    @property
    def attributes(self) -> Mapping[str, str]:
        """The message's system attributes (`SenderId`, `ApproximateReceiveCount`, ...)."""
        attributes: Mapping[str, str] = self.raw["attributes"]
        return attributes


class NotAnSqsBatchError(ValueError):
    """The event has no records to handle: SQS never delivers an empty batch."""


class AllRecordsFailedError(Exception):
    """Every record's handler raised: the invocation fails, so SQS retries the whole batch."""

    def __init__(self, errors: list[Exception]) -> None:
        super().__init__(f"All records failed processing. {len(errors)} individual errors logged separately below.")
        self.errors = errors

    def __str__(self) -> str:
        tracebacks = ["".join(traceback.format_exception(type(e), e, e.__traceback__)) for e in self.errors]
        return "\n".join([f"{super().__str__()}\n", *tracebacks])


def process_sqs_batch(event: Mapping[str, Any], record_handler: Callable[[SqsRecord], object]) -> PartialBatchResponse:
    """Hand each record to `record_handler`; report the ones whose handler raised."""
    records = event.get("Records")
    if not records or not isinstance(records, list):
        raise NotAnSqsBatchError("not an SQS event: no Records to handle")
    failed: list[SqsRecord] = []
    errors: list[Exception] = []
    for raw in records:
        record = SqsRecord(raw)
        try:
            record_handler(record)
        except Exception as error:  # a BaseException that is not an Exception is not ours to swallow
            logger.debug("Record processing exception: %s:%s", type(error), error)
            failed.append(record)
            errors.append(error)
    if failed and len(failed) == len(records):
        raise AllRecordsFailedError(errors)
    return {"batchItemFailures": [{"itemIdentifier": record.message_id} for record in failed]}
