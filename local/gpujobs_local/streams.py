"""Lambda's DynamoDB event source mapping over moto's stream of a table.

`TableStream` reads the stream the way the mapping does: records in shard order, a batch of up to
`BatchSize`, the template's `FilterCriteria` applied (a record no filter matches is done without an
invocation), and a checkpoint per shard that moves past a batch only when its invocation succeeded.
An invocation that raises leaves the checkpoint where it was (the whole batch comes again); a
partial batch response moves it to just before the lowest failed sequence number, so that record
and every one after it come again. What reaches the handler is the record as Lambda shapes it
(`eventSourceARN`, `ApproximateCreationDateTime` in epoch seconds).

moto serves DynamoDB Streams only on its `streams.dynamodb.*` host: the client is created with the
account-id endpoint mode off (aws-contracts §0.8).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

Invoke = Callable[[dict[str, Any]], "Any"]


@dataclass
class Batch:
    shard: str
    event: dict[str, Any]
    last: str
    """The sequence number of the batch's last record read (filtered ones included)."""
    sequences: list[str]
    """The sequence numbers of the records handed to the function, in order."""


@dataclass
class TableStream:
    client: Any
    """A `dynamodbstreams` client."""
    stream_arn: str
    batch_size: int = 100
    filters: Sequence[Mapping[str, Any]] = ()
    """Parsed `FilterCriteria` patterns; empty: every record is handed over."""
    region: str = "us-east-1"
    done: dict[str, str] = field(default_factory=dict)
    """Shard id -> the sequence number of the last record done."""

    def next_batch(self) -> Batch | None:
        """The next records after the checkpoint, in the first shard that has any; records that no
        filter matches are marked done on the way."""
        shards = self.client.describe_stream(StreamArn=self.stream_arn)["StreamDescription"]["Shards"]
        for shard in shards:
            shard_id = shard["ShardId"]
            while True:
                page = self.client.get_records(ShardIterator=self._iterator(shard_id), Limit=self.batch_size)
                records = page.get("Records", [])
                if not records:
                    break
                kept = [r for r in records if self._matches(r)]
                last = records[-1]["dynamodb"]["SequenceNumber"]
                if not kept:
                    self.done[shard_id] = last
                    continue
                event = {"Records": [self._as_lambda_record(r) for r in kept]}
                return Batch(shard_id, event, last, [r["dynamodb"]["SequenceNumber"] for r in kept])
        return None

    def finished(self, batch: Batch, result: Any, *, failed: bool) -> bool:
        """Move the checkpoint as the invocation's outcome says; True when the whole batch is done."""
        if failed:
            return False
        failures = result.get("batchItemFailures", []) if isinstance(result, dict) else []
        if not failures:
            self.done[batch.shard] = batch.last
            return True
        lowest = min((str(f.get("itemIdentifier", "")) for f in failures), key=_order)
        if lowest not in batch.sequences:  # an identifier that names no record: the whole batch failed
            return False
        index = batch.sequences.index(lowest)
        if index > 0:
            self.done[batch.shard] = batch.sequences[index - 1]
        return False

    def skip(self, batch: Batch) -> None:
        """Give up on a batch (its retries are used up): the mapping moves past it."""
        self.done[batch.shard] = batch.last

    def _iterator(self, shard_id: str) -> str:
        after = self.done.get(shard_id)
        kwargs: dict[str, Any] = {"StreamArn": self.stream_arn, "ShardId": shard_id}
        if after is None:
            kwargs["ShardIteratorType"] = "TRIM_HORIZON"
        else:
            kwargs.update(ShardIteratorType="AFTER_SEQUENCE_NUMBER", SequenceNumber=after)
        return str(self.client.get_shard_iterator(**kwargs)["ShardIterator"])

    def _matches(self, record: Mapping[str, Any]) -> bool:
        return not self.filters or any(_matches(pattern, record) for pattern in self.filters)

    def _as_lambda_record(self, record: Mapping[str, Any]) -> dict[str, Any]:
        change = dict(record["dynamodb"])
        created = change.get("ApproximateCreationDateTime")
        if isinstance(created, datetime):
            change["ApproximateCreationDateTime"] = int(created.timestamp())
        return {
            "eventID": record.get("eventID"),
            "eventName": record["eventName"],
            "eventVersion": "1.1",
            "eventSource": "aws:dynamodb",
            "awsRegion": self.region,
            "dynamodb": change,
            "eventSourceARN": self.stream_arn,
        }


def filter_patterns(properties: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The `FilterCriteria` patterns of an event source, parsed."""
    return [json.loads(f["Pattern"]) for f in (properties.get("FilterCriteria") or {}).get("Filters", [])]


def _matches(pattern: Any, value: Any) -> bool:
    """The subset of Lambda's filter syntax the template uses: nested keys, each leaf a list of
    exact values one of which the record's value must equal."""
    if isinstance(pattern, dict):
        return isinstance(value, Mapping) and all(k in value and _matches(p, value[k]) for k, p in pattern.items())
    if isinstance(pattern, list):
        return value in pattern
    return bool(pattern == value)


def _order(sequence: str) -> tuple[int, str]:
    return (len(sequence), sequence)
