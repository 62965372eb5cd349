"""Budget policies in the jobs table: one small item per scope (a team, or "all")."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gpujobs.service.budgets import strictest
from gpujobs.service.ports import BudgetMode, BudgetPolicy

SCOPES_PK = "BUDGETS"


def budget_pk(scope: str) -> str:
    return f"BUDGET#{scope}"


class DynamoBudgetBook:
    def __init__(self, *, table_name: str, client: Any) -> None:
        self._table = table_name
        self._ddb = client

    def _get(self, scope: str) -> BudgetPolicy | None:
        item = self._ddb.get_item(
            TableName=self._table, Key={"pk": {"S": budget_pk(scope)}, "sk": {"S": "BUDGET"}}, ConsistentRead=True
        ).get("Item")
        return _policy(item) if item else None

    def policy_for(self, team: str) -> BudgetPolicy:
        return strictest([self._get(team), self._get("all")], team)

    def set_policy(self, policy: BudgetPolicy) -> None:
        item: dict[str, Any] = {
            "pk": {"S": budget_pk(policy.scope)},
            "sk": {"S": "BUDGET"},
            "scope": {"S": policy.scope},
            "mode": {"S": policy.mode.value},
            "reason": {"S": policy.reason},
            "period": {"S": policy.period},
        }
        if policy.since:
            item["since"] = {"S": policy.since.isoformat()}
        self._ddb.put_item(TableName=self._table, Item=item)
        # The registry of scopes: one partition, a handful of items (the teams with budgets).
        self._ddb.put_item(
            TableName=self._table,
            Item={"pk": {"S": SCOPES_PK}, "sk": {"S": f"SCOPE#{policy.scope}"}, "scope": {"S": policy.scope}},
        )

    def held_scopes(self) -> list[BudgetPolicy]:
        found: list[BudgetPolicy] = []
        for scope_item in self._ddb.query(
            TableName=self._table,
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": {"S": SCOPES_PK}},
        ).get("Items", []):
            policy = self._get(scope_item["scope"]["S"])
            if policy is not None and policy.mode is not BudgetMode.NORMAL:
                found.append(policy)
        return found


def _policy(item: dict[str, Any]) -> BudgetPolicy:
    since = item.get("since", {}).get("S")
    return BudgetPolicy(
        scope=item["scope"]["S"],
        mode=BudgetMode(item["mode"]["S"]),
        reason=item.get("reason", {}).get("S", ""),
        period=item.get("period", {}).get("S", ""),
        since=datetime.fromisoformat(since) if since else None,
    )
