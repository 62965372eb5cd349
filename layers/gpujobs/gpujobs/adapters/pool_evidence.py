"""The stack's spot evidence on DynamoDB: a few items of the jobs table, one per pool and UTC day.

An item `POOLS#<yyyy-mm-dd>` / `<instance type>#<zone>` holds a map `reclaims` of job attempt
(`job_id#attempt`) to the reclaim's epoch second, so recording a reclaim twice, or from two
launchers at once, sets the same entry (`SET reclaims.#k = :t` never overwrites another's). The
first reclaim of a pool on a day makes the map, conditional on there being none, and a lost race
sets its entry into the map the winner made. `expires_at` (the table's TTL attribute) lets DynamoDB
delete a day's items once they are older than any ranking reads (`domain.pools.HORIZON`).

Reading is one query per day the horizon touches (three at most): small items, a few hundred at
most. The stream carries these writes too; the Publisher's filter (`sk` = JOB) passes only jobs'.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from gpujobs.domain.pools import HORIZON, Reclaim

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient
    from types_boto3_dynamodb.type_defs import QueryInputTypeDef

KEEP_FOR = HORIZON + timedelta(days=1)
"""How long a day's items outlive their day: past any read's horizon."""


def day_pk(at: datetime) -> str:
    return f"POOLS#{at.astimezone(UTC).date().isoformat()}"


class DynamoPoolEvidence:
    def __init__(self, *, table_name: str, client: DynamoDBClient) -> None:
        self._table, self._ddb = table_name, client

    def record(self, reclaims: Sequence[Reclaim]) -> None:
        for reclaim in reclaims:
            self._record(reclaim)

    def _record(self, reclaim: Reclaim) -> None:
        key = {"pk": {"S": day_pk(reclaim.at)}, "sk": {"S": f"{reclaim.instance_type}#{reclaim.zone}"}}
        at = {"N": str(int(reclaim.at.timestamp()))}
        expires = {"N": str(int((reclaim.at + KEEP_FOR).timestamp()))}
        entry = reclaim.key or f"@{at['N']}"
        for _ in range(2):  # the map exists (set the entry), or it does not (make it, unless a racer did)
            try:
                self._ddb.update_item(
                    TableName=self._table,
                    Key=key,
                    UpdateExpression="SET reclaims.#k = :t, expires_at = :e",
                    ConditionExpression="attribute_exists(reclaims)",
                    ExpressionAttributeNames={"#k": entry},
                    ExpressionAttributeValues={":t": at, ":e": expires},
                )
                return
            except self._ddb.exceptions.ConditionalCheckFailedException:
                pass
            try:
                self._ddb.update_item(
                    TableName=self._table,
                    Key=key,
                    UpdateExpression="SET reclaims = :m, expires_at = :e",
                    ConditionExpression="attribute_not_exists(reclaims)",
                    ExpressionAttributeValues={":m": {"M": {entry: at}}, ":e": expires},
                )
                return
            except self._ddb.exceptions.ConditionalCheckFailedException:
                continue  # another launcher made the map first: set the entry into it

    def recent(self, *, now: datetime) -> list[Reclaim]:
        since = now - HORIZON
        days = sorted({day_pk(since + timedelta(days=d)) for d in range((now - since).days + 2)})
        found: list[Reclaim] = []
        for pk in (d for d in days if d <= day_pk(now)):
            query: QueryInputTypeDef = {
                "TableName": self._table,
                "KeyConditionExpression": "pk = :pk",
                "ExpressionAttributeValues": {":pk": {"S": pk}},
            }
            while True:
                page = self._ddb.query(**query)
                for item in page.get("Items", []):
                    instance_type, _, zone = item["sk"]["S"].partition("#")
                    for entry, value in item.get("reclaims", {}).get("M", {}).items():
                        at = datetime.fromtimestamp(int(value["N"]), tz=UTC)
                        if since <= at <= now:
                            found.append(Reclaim(instance_type, zone, at, "" if entry.startswith("@") else entry))
                last = page.get("LastEvaluatedKey")
                if not last:
                    break
                query["ExclusiveStartKey"] = last
        return found
