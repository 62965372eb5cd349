"""Budget policies in the jobs table: one small item per scope (a team, or "all")."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from gpujobs.contract import budget_name
from gpujobs.domain.budget import BudgetMode, BudgetPolicy, strictest

if TYPE_CHECKING:
    from types_boto3_budgets import BudgetsClient
    from types_boto3_dynamodb import DynamoDBClient
    from types_boto3_dynamodb.type_defs import AttributeValueTypeDef
    from types_boto3_sts import STSClient

SCOPES_PK = "BUDGETS"


def budget_pk(scope: str) -> str:
    return f"BUDGET#{scope}"


class DynamoBudgetBook:
    def __init__(self, *, table_name: str, client: DynamoDBClient) -> None:
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
        item: dict[str, AttributeValueTypeDef] = {
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


def _policy(item: dict[str, AttributeValueTypeDef]) -> BudgetPolicy:
    since = item.get("since", {}).get("S")
    return BudgetPolicy(
        scope=item["scope"]["S"],
        mode=BudgetMode(item["mode"]["S"]),
        reason=item.get("reason", {}).get("S", ""),
        period=item.get("period", {}).get("S", ""),
        since=datetime.fromisoformat(since) if since else None,
    )


class BudgetsApiCheck:
    """Whether a held scope's AWS budget has room again (its limit was raised above actual spend)."""

    def __init__(self, *, budgets_client: BudgetsClient, sts_client: STSClient, stack_name: str) -> None:
        self._budgets = budgets_client
        self._sts = sts_client
        self._stack = stack_name
        self._account: str | None = None

    def __call__(self, policy: BudgetPolicy) -> bool:
        if policy.mode is not BudgetMode.HOLD:
            return True  # a forecast warning lapses with its period; nothing to check
        if self._account is None:
            self._account = str(self._sts.get_caller_identity()["Account"])
        try:
            budget = self._budgets.describe_budget(
                AccountId=self._account, BudgetName=budget_name(self._stack, policy.scope)
            )["Budget"]
        except self._budgets.exceptions.NotFoundException:
            return False  # no budget to read: keep the hold until the period rolls over
        limit = float(budget["BudgetLimit"]["Amount"])
        actual = float(budget.get("CalculatedSpend", {}).get("ActualSpend", {}).get("Amount", "0"))
        return actual < limit
