"""The job store on DynamoDB: one item per job plus one small index item per instance.

Every save is a transaction whose first write is conditional on the version that was read, so a
lost race (a failed condition, or a TransactionConflict with a concurrent transaction on the same
item) surfaces as ConcurrentUpdateError instead of a silent overwrite or a crash. The job item carries
`state` and `updated_at` for the `ByState` index, and an ended job whose objects are kept carries
`objects_kept` and `ended_at` for the sparse `ByEnd` index (`domain.retention`); instance items carry
`instance_id` for the `ByInstance` index. Every lookup is a query; nothing here scans.

The GPU ledger (`domain.ledger`) is one more item, `LEDGER`/`GPUS`, of number attributes that are only
ever added to: a write that changes what a job holds or whether it waits carries that change to the
ledger in its own transaction (`change_of`: what the record stands for less what it says the ledger
counts for it), with an admission's ceilings as conditions.

The record itself is the `doc` attribute, JSON, read and written as `domain.records` says: a newer
release's fields are kept on write-back, and every write stamps `schema_version`. An item this release
cannot read raises UnreadableJobError naming its key; a listing skips it when told how to report it.

An item may not pass 400 KB as DynamoDB counts it (`item_size`). The store measures the job item
before it writes and refuses an oversized one with JobRecordTooLargeError, as does DynamoDB itself
(moto draws its own line a little lower, at 405,000 bytes); the in-memory store measures the same item.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from gpujobs.adapters.item_size import MAX_ITEM_BYTES, item_size
from gpujobs.domain import retention
from gpujobs.domain.job import Job
from gpujobs.domain.ledger import Ledger, LedgerChange, change_of, ledgered
from gpujobs.domain.records import RECORD_SCHEMA_VERSION, read_record, record_json
from gpujobs.domain.states import JobState
from gpujobs.service.ports import (
    AdmissionRefusedError,
    ConcurrentUpdateError,
    JobExistsError,
    JobNotFoundError,
    JobRecordTooLargeError,
    UnreadableJobError,
    UnreadableObserver,
)

__all__ = ["MAX_ITEM_BYTES", "DynamoJobStore", "item_size", "job_item", "job_of_item", "sized_job_item"]

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient
    from types_boto3_dynamodb.type_defs import AttributeValueTypeDef, QueryInputTypeDef, TransactWriteItemTypeDef

    Item = dict[str, AttributeValueTypeDef]

log = logging.getLogger(__name__)

JOB_SK = "JOB"
OBJECTS_KEPT = "ended"
"""The `ByEnd` index's one partition: ended jobs whose objects are still kept."""
LOST_RACE_CODES = frozenset({"ConditionalCheckFailed", "TransactionConflict"})
"""Cancellation reasons that mean another writer got there first: the version check failed, or
another transaction was writing the same item at that moment. The service retries both."""
BATCH_GET_KEYS = 100
"""BatchGetItem's limit on keys a call."""
BATCH_GET_ROUNDS = 4
"""Calls beyond one per 100 keys for the keys DynamoDB left unprocessed, before they are read one by one."""
LEDGER_KEY: dict[str, dict[str, str]] = {"pk": {"S": "LEDGER"}, "sk": {"S": "GPUS"}}


def job_pk(job_id: str) -> str:
    return f"JOB#{job_id}"


TooLargeObserver = Callable[[JobRecordTooLargeError], None]


class DynamoJobStore:
    def __init__(
        self, *, table_name: str, client: DynamoDBClient, on_too_large: TooLargeObserver | None = None
    ) -> None:
        self._table = table_name
        self._ddb = client
        self._on_too_large = on_too_large

    # ---- writes -------------------------------------------------------------------------
    def create(self, job: Job) -> Job:
        stored = ledgered(job).model_copy(update={"version": 1})
        change = change_of(job)
        put: TransactWriteItemTypeDef = {
            "Put": {
                "TableName": self._table,
                "Item": self._item(stored),
                "ConditionExpression": "attribute_not_exists(pk)",
            }
        }
        try:
            if change:
                self._ddb.transact_write_items(TransactItems=[put, self._ledger_write(change)])
            else:
                self._ddb.put_item(**put["Put"])
        except self._ddb.exceptions.ConditionalCheckFailedException:
            raise JobExistsError(job.job_id) from None
        except self._ddb.exceptions.TransactionCanceledException as exc:
            codes = _cancellation_codes(exc)
            if codes[0] == "ConditionalCheckFailed":
                raise JobExistsError(job.job_id) from None
            if "TransactionConflict" in codes:
                raise ConcurrentUpdateError(job.job_id, 0) from None
            raise
        except self._ddb.exceptions.ClientError as exc:
            self._raise_if_refused_for_size(exc, stored)
            raise
        return stored

    def save(self, job: Job) -> Job:
        stored = ledgered(job).model_copy(update={"version": job.version + 1})
        change = change_of(job)
        writes: list[TransactWriteItemTypeDef] = [
            {
                "Put": {
                    "TableName": self._table,
                    "Item": self._item(stored),
                    "ConditionExpression": "#v = :expected",
                    "ExpressionAttributeNames": {"#v": "version"},
                    "ExpressionAttributeValues": {":expected": {"N": str(job.version)}},
                }
            }
        ]
        if change:
            writes.append(self._ledger_write(change))
        attempt = job.current_attempt
        if attempt is not None:
            writes += [
                {
                    "Put": {
                        "TableName": self._table,
                        "Item": self._instance_item(job.job_id, iid, attempt.number),
                    }
                }
                for iid in attempt.instance_ids
            ]
        try:
            self._ddb.transact_write_items(TransactItems=writes)
        except self._ddb.exceptions.TransactionCanceledException as exc:
            codes = _cancellation_codes(exc)
            if codes[0] in LOST_RACE_CODES or "TransactionConflict" in codes:
                raise ConcurrentUpdateError(job.job_id, job.version) from None
            if change and len(codes) > 1 and codes[1] == "ConditionalCheckFailed":
                raise AdmissionRefusedError(job.job_id, change.ceilings) from None
            raise
        except self._ddb.exceptions.ClientError as exc:
            self._raise_if_refused_for_size(exc, stored)
            raise
        return stored

    def _ledger_write(self, change: LedgerChange) -> TransactWriteItemTypeDef:
        """Add the change's counts to the ledger item, if its ceilings hold (one transaction item)."""
        names: dict[str, str] = {}
        values: dict[str, AttributeValueTypeDef] = {}
        adds, conditions = [], []
        for index, (name, amount) in enumerate(sorted(change.adds.items())):
            names[f"#a{index}"], values[f":a{index}"] = name, {"N": str(amount)}
            adds.append(f"#a{index} :a{index}")
        for index, (name, ceiling) in enumerate(sorted(change.ceilings.items())):
            names[f"#c{index}"], values[f":c{index}"] = name, {"N": str(ceiling)}
            conditions.append(f"(attribute_not_exists(#c{index}) OR #c{index} <= :c{index})")
        if not adds:
            return {
                "ConditionCheck": {
                    "TableName": self._table,
                    "Key": dict(LEDGER_KEY),
                    "ConditionExpression": " AND ".join(conditions),
                    "ExpressionAttributeNames": names,
                    "ExpressionAttributeValues": values,
                }
            }
        update: TransactWriteItemTypeDef = {
            "Update": {
                "TableName": self._table,
                "Key": dict(LEDGER_KEY),
                "UpdateExpression": "ADD " + ", ".join(adds),
                "ExpressionAttributeNames": names,
                "ExpressionAttributeValues": values,
            }
        }
        if conditions:
            update["Update"]["ConditionExpression"] = " AND ".join(conditions)
        return update

    def ledger(self) -> Ledger:
        item = self._ddb.get_item(TableName=self._table, Key=dict(LEDGER_KEY), ConsistentRead=True).get("Item") or {}
        return Ledger({name: int(value["N"]) for name, value in item.items() if "N" in value and int(value["N"])})

    # ---- reads --------------------------------------------------------------------------
    def get(self, job_id: str) -> Job:
        item = self._ddb.get_item(
            TableName=self._table, Key={"pk": {"S": job_pk(job_id)}, "sk": {"S": JOB_SK}}, ConsistentRead=True
        ).get("Item")
        if item is None:
            raise JobNotFoundError(job_id)
        return self._from_item(item)

    def get_many(self, job_ids: Sequence[str], *, on_unreadable: UnreadableObserver | None = None) -> dict[str, Job]:
        """BatchGetItem, `BATCH_GET_KEYS` keys a call, consistent. Keys DynamoDB leaves unprocessed
        (throttling, the 16 MB response limit) are asked again in the next call; any still left
        after `BATCH_GET_ROUNDS` calls are read one by one, so a busy table costs calls, never jobs."""
        found: dict[str, Job] = {}
        pending: list[Item] = [{"pk": {"S": job_pk(i)}, "sk": {"S": JOB_SK}} for i in dict.fromkeys(job_ids)]
        calls_left = -(-len(pending) // BATCH_GET_KEYS) + BATCH_GET_ROUNDS
        while pending and calls_left > 0:
            calls_left -= 1
            asked, pending = pending[:BATCH_GET_KEYS], pending[BATCH_GET_KEYS:]
            answer = self._ddb.batch_get_item(RequestItems={self._table: {"Keys": asked, "ConsistentRead": True}})
            for got in answer.get("Responses", {}).get(self._table, []):
                self._keep(found, got, on_unreadable)
            unprocessed = answer.get("UnprocessedKeys", {}).get(self._table)
            pending += list(unprocessed["Keys"]) if unprocessed else []
        for key in pending:
            item = self._ddb.get_item(TableName=self._table, Key=key, ConsistentRead=True).get("Item")
            if item is not None:
                self._keep(found, item, on_unreadable)
        return found

    def _keep(self, found: dict[str, Job], item: Item, on_unreadable: UnreadableObserver | None) -> None:
        try:
            job = self._from_item(item)
        except UnreadableJobError as exc:
            if on_unreadable is None:
                raise
            on_unreadable(exc)
            return
        found[job.job_id] = job

    def find_by_instance(self, instance_id: str) -> Job | None:
        items = self._ddb.query(
            TableName=self._table,
            IndexName="ByInstance",
            KeyConditionExpression="instance_id = :i",
            ExpressionAttributeValues={":i": {"S": instance_id}},
            Limit=1,
        ).get("Items", [])
        return self.get(items[0]["job_id"]["S"]) if items else None

    def list_by_state(
        self,
        state: JobState,
        *,
        limit: int = 100,
        team: str | None = None,
        on_unreadable: UnreadableObserver | None = None,
    ) -> list[Job]:
        names, values = {"#s": "state"}, {":s": {"S": state.value}}
        kwargs: QueryInputTypeDef = {
            "TableName": self._table,
            "IndexName": "ByState",
            "KeyConditionExpression": "#s = :s",
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values,
            "ScanIndexForward": False,
        }
        if team is not None:  # filtered after each page is read: the loop reads on until `limit` match
            kwargs["FilterExpression"] = "#t = :t"
            names["#t"], values[":t"] = "team", {"S": team}
        return self._query(kwargs, limit, on_unreadable)

    def list_ended(self, *, before: datetime, limit: int) -> list[Job]:
        return self._ended("ended_at <= :t", before, limit)

    def list_ended_after(self, after: datetime, *, limit: int) -> list[Job]:
        return self._ended("ended_at >= :t", after, limit)

    def _ended(self, condition: str, moment: datetime, limit: int) -> list[Job]:
        """The sparse `ByEnd` index, oldest end first; an unreadable record is logged and skipped."""
        kwargs: QueryInputTypeDef = {
            "TableName": self._table,
            "IndexName": "ByEnd",
            "KeyConditionExpression": f"objects_kept = :k AND {condition}",
            "ExpressionAttributeValues": {":k": {"S": OBJECTS_KEPT}, ":t": {"S": moment.isoformat()}},
            "ScanIndexForward": True,
        }

        def skip(error: UnreadableJobError) -> None:
            log.error("skipping the unreadable ended record of %s: %s", error.job_id, error.problem)

        return self._query(kwargs, limit, skip)

    def _query(self, kwargs: QueryInputTypeDef, limit: int, on_unreadable: UnreadableObserver | None) -> list[Job]:
        """Up to `limit` jobs of an index query, page after page."""
        jobs: list[Job] = []
        while len(jobs) < limit:
            kwargs["Limit"] = limit - len(jobs)
            page = self._ddb.query(**kwargs)
            for item in page.get("Items", []):
                try:
                    jobs.append(self._from_item(item))
                except UnreadableJobError as exc:
                    if on_unreadable is None:
                        raise
                    on_unreadable(exc)
            if "LastEvaluatedKey" not in page:
                break
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        return jobs

    # ---- items --------------------------------------------------------------------------
    def _item(self, job: Job) -> Item:
        try:
            return sized_job_item(job)
        except JobRecordTooLargeError as exc:
            raise self._refused(exc) from None

    def _raise_if_refused_for_size(self, exc: Any, stored: Job) -> None:
        """DynamoDB itself refused the item for its size: the same typed error as our own check."""
        if _refused_for_size(exc):
            raise self._refused(
                JobRecordTooLargeError(stored.job_id, item_size(job_item(stored)), MAX_ITEM_BYTES)
            ) from exc

    def _refused(self, error: JobRecordTooLargeError) -> JobRecordTooLargeError:
        """Tell the observer (the handlers' metrics), then hand the error back to be raised."""
        if self._on_too_large is not None:
            self._on_too_large(error)
        return error

    @staticmethod
    def _instance_item(job_id: str, instance_id: str, attempt: int) -> Item:
        return {
            "pk": {"S": job_pk(job_id)},
            "sk": {"S": f"INSTANCE#{instance_id}"},
            "instance_id": {"S": instance_id},
            "job_id": {"S": job_id},
            "attempt": {"N": str(attempt)},
        }

    @staticmethod
    def _from_item(item: Item) -> Job:
        return job_of_item(item)


def job_of_item(item: Item) -> Job:
    """The job a job item holds (as a read returns it, or as the table's stream carries an image of
    it); UnreadableJobError naming its key when this release cannot read it."""
    try:
        job = read_record(item["doc"]["S"])
        return job.model_copy(update={"version": int(item["version"]["N"])})
    except (ValidationError, KeyError, ValueError, TypeError) as exc:
        key = item.get("job_id", {}).get("S") or item.get("pk", {}).get("S", "?")
        raise UnreadableJobError(key, _first_line(exc)) from exc


def job_item(job: Job) -> Item:
    """The job's DynamoDB item: the whole record as JSON plus the attributes the indexes key on."""
    return {
        "pk": {"S": job_pk(job.job_id)},
        "sk": {"S": JOB_SK},
        "job_id": {"S": job.job_id},
        "state": {"S": job.state.value},
        "updated_at": {"S": job.updated_at.isoformat()},
        "team": {"S": job.team},
        "name": {"S": job.name or "-"},
        "version": {"N": str(job.version)},
        "schema_version": {"N": str(RECORD_SCHEMA_VERSION)},
        "doc": {"S": record_json(job, exclude=frozenset({"version"}))},
        **_ended_attributes(job),
    }


def _ended_attributes(job: Job) -> Item:
    """The sparse `ByEnd` index's key, only on an ended job whose objects are kept."""
    end = retention.ended_at(job)
    if end is None or not retention.objects_kept(job):
        return {}
    return {"objects_kept": {"S": OBJECTS_KEPT}, "ended_at": {"S": end.isoformat()}}


def schema_version_of(item: Item) -> int:
    """The record schema of the release that last wrote `item` (1 for items from before the stamp)."""
    return int(item.get("schema_version", {}).get("N", "1"))


def _first_line(exc: Exception) -> str:
    """A short account of why an item could not be read: pydantic's first error, or the exception."""
    if isinstance(exc, ValidationError):
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "(record)"
        return f"{where}: {first['msg'][:200]} ({exc.error_count()} error(s))"
    return f"{type(exc).__name__}: {str(exc)[:200]}"


def sized_job_item(job: Job) -> Item:
    """`job_item(job)`, or JobRecordTooLargeError when DynamoDB would refuse it for its size."""
    item = job_item(job)
    size = item_size(item)
    if size > MAX_ITEM_BYTES:
        raise JobRecordTooLargeError(job.job_id, size, MAX_ITEM_BYTES)
    return item


def _cancellation_codes(exc: Any) -> list[str | None]:
    """The reason code of each item of a cancelled transaction, in order ("None" where it passed)."""
    return [reason.get("Code") for reason in exc.response.get("CancellationReasons") or []] or [None]


def _refused_for_size(exc: Any) -> bool:
    """DynamoDB's own size refusal (a ValidationException), which moto draws at 405,000 bytes."""
    error = exc.response.get("Error", {})
    return error.get("Code") == "ValidationException" and "size" in str(error.get("Message", "")).lower()
