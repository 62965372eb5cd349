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

import contextlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError

Invoke = Callable[[dict[str, Any]], "Any"]


@dataclass
class Batch:
    shard: str
    event: dict[str, Any]
    last: str
    """The sequence number of the batch's last record read (filtered ones included)."""
    sequences: list[str]
    """The sequence numbers of the records handed to the function, in order."""
    following: str | None = None
    """The shard iterator after the batch: where the next read starts once the batch is done."""


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
    shards_every: float = 10.0
    """Seconds between two listings of the stream's shards (each poll reads with kept iterators)."""
    _shards: list[str] = field(default_factory=list)
    _listed_at: float = float("-inf")
    _iterators: dict[str, str] = field(default_factory=dict)
    """Shard id -> the iterator to read on with, while the records before it are done."""

    def next_batch(self) -> Batch | None:
        """The next records after the checkpoint, in the first shard that has any; records that no
        filter matches are marked done on the way. One GetRecords a shard when there is nothing new."""
        if not self._shards or time.monotonic() - self._listed_at >= self.shards_every:
            described = self.client.describe_stream(StreamArn=self.stream_arn)["StreamDescription"]
            self._shards, self._listed_at = [shard["ShardId"] for shard in described["Shards"]], time.monotonic()
        for shard_id in self._shards:
            while True:
                page = self._read(shard_id)
                records, following = page.get("Records", []), page.get("NextShardIterator")
                if not records:
                    self._keep_iterator(shard_id, following)
                    break
                kept = [r for r in records if self._matches(r)]
                last = records[-1]["dynamodb"]["SequenceNumber"]
                if not kept:
                    self.done[shard_id] = last
                    self._keep_iterator(shard_id, following)
                    continue
                event = {"Records": [self._as_lambda_record(r) for r in kept]}
                sequences = [r["dynamodb"]["SequenceNumber"] for r in kept]
                return Batch(shard_id, event, last, sequences, following)
        return None

    def _read(self, shard_id: str) -> Any:
        kept = self._iterators.pop(shard_id, None)
        if kept is not None:
            with contextlib.suppress(ClientError):  # expired (15 min on AWS): read on from the checkpoint
                return self.client.get_records(ShardIterator=kept, Limit=self.batch_size)
        return self.client.get_records(ShardIterator=self._iterator(shard_id), Limit=self.batch_size)

    def _keep_iterator(self, shard_id: str, following: str | None) -> None:
        if following:
            self._iterators[shard_id] = following

    def finished(self, batch: Batch, result: Any, *, failed: bool) -> bool:
        """Move the checkpoint as the invocation's outcome says; True when the whole batch is done."""
        if failed:
            return False
        failures = result.get("batchItemFailures", []) if isinstance(result, dict) else []
        if not failures:
            self.done[batch.shard] = batch.last
            self._keep_iterator(batch.shard, batch.following)
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
