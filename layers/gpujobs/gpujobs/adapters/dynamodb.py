"""The job store on DynamoDB: one item per job plus one small index item per instance.

Every save is a transaction whose first write is conditional on the version that was read, so a
lost race (a failed condition, or a TransactionConflict with a concurrent transaction on the same
item) surfaces as ConcurrentUpdateError instead of a silent overwrite or a crash. The job item carries
`state` and `updated_at` for the sparse `ByState` index; instance items carry `instance_id` for the
`ByInstance` index. Both lookups are queries; nothing here scans.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpujobs.domain.job import Job
from gpujobs.domain.states import JobState
from gpujobs.service.ports import ConcurrentUpdateError, JobExistsError, JobNotFoundError

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient
    from types_boto3_dynamodb.type_defs import AttributeValueTypeDef, QueryInputTypeDef, TransactWriteItemTypeDef

    Item = dict[str, AttributeValueTypeDef]

JOB_SK = "JOB"
LOST_RACE_CODES = frozenset({"ConditionalCheckFailed", "TransactionConflict"})
"""Cancellation reasons that mean another writer got there first: the version check failed, or
another transaction was writing the same item at that moment. The service retries both."""


def job_pk(job_id: str) -> str:
    return f"JOB#{job_id}"


class DynamoJobStore:
    def __init__(self, *, table_name: str, client: DynamoDBClient) -> None:
        self._table = table_name
        self._ddb = client

    # ---- writes -------------------------------------------------------------------------
    def create(self, job: Job) -> Job:
        stored = job.model_copy(update={"version": 1})
        try:
            self._ddb.put_item(
                TableName=self._table,
                Item=self._job_item(stored),
                ConditionExpression="attribute_not_exists(pk)",
            )
        except self._ddb.exceptions.ConditionalCheckFailedException:
            raise JobExistsError(job.job_id) from None
        return stored

    def save(self, job: Job) -> Job:
        stored = job.model_copy(update={"version": job.version + 1})
        writes: list[TransactWriteItemTypeDef] = [
            {
                "Put": {
                    "TableName": self._table,
                    "Item": self._job_item(stored),
                    "ConditionExpression": "#v = :expected",
                    "ExpressionAttributeNames": {"#v": "version"},
                    "ExpressionAttributeValues": {":expected": {"N": str(job.version)}},
                }
            }
        ]
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
            codes = {reason.get("Code") for reason in exc.response.get("CancellationReasons") or []}
            if codes & LOST_RACE_CODES:
                raise ConcurrentUpdateError(job.job_id, job.version) from None
            raise
        return stored

    # ---- reads --------------------------------------------------------------------------
    def get(self, job_id: str) -> Job:
        item = self._ddb.get_item(
            TableName=self._table, Key={"pk": {"S": job_pk(job_id)}, "sk": {"S": JOB_SK}}, ConsistentRead=True
        ).get("Item")
        if item is None:
            raise JobNotFoundError(job_id)
        return self._from_item(item)

    def find_by_instance(self, instance_id: str) -> Job | None:
        items = self._ddb.query(
            TableName=self._table,
            IndexName="ByInstance",
            KeyConditionExpression="instance_id = :i",
            ExpressionAttributeValues={":i": {"S": instance_id}},
            Limit=1,
        ).get("Items", [])
        return self.get(items[0]["job_id"]["S"]) if items else None

    def list_by_state(self, state: JobState, *, limit: int = 100) -> list[Job]:
        jobs: list[Job] = []
        kwargs: QueryInputTypeDef = {
            "TableName": self._table,
            "IndexName": "ByState",
            "KeyConditionExpression": "#s = :s",
            "ExpressionAttributeNames": {"#s": "state"},
            "ExpressionAttributeValues": {":s": {"S": state.value}},
            "ScanIndexForward": False,
        }
        while len(jobs) < limit:
            kwargs["Limit"] = limit - len(jobs)
            page = self._ddb.query(**kwargs)
            jobs += [self._from_item(i) for i in page.get("Items", [])]
            if "LastEvaluatedKey" not in page:
                break
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        return jobs

    # ---- items --------------------------------------------------------------------------
    @staticmethod
    def _job_item(job: Job) -> Item:
        return {
            "pk": {"S": job_pk(job.job_id)},
            "sk": {"S": JOB_SK},
            "job_id": {"S": job.job_id},
            "state": {"S": job.state.value},
            "updated_at": {"S": job.updated_at.isoformat()},
            "team": {"S": job.team},
            "name": {"S": job.name or "-"},
            "version": {"N": str(job.version)},
            "doc": {"S": job.model_dump_json(exclude={"version"})},
        }

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
        job = Job.model_validate_json(item["doc"]["S"])
        return job.model_copy(update={"version": int(item["version"]["N"])})
