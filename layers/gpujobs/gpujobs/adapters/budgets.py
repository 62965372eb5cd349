"""Budget policies in the jobs table: one small item per scope (a team, or "all").

Two budget functions (or a budget function and the reconciler) may write one scope at once, so no
write here is a read followed by a put. `tighten` is a put conditional on the stored mode and
period (the rule of `domain.budget.may_replace`, so a late forecast never downgrades a hold within
its period), and `release` is a put conditional on the stored policy being the one the reconciler
read. The in-memory fake applies the same two conditions.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from gpujobs.contract import budget_name
from gpujobs.domain.budget import BudgetMode, BudgetPolicy, lifted, replaceable_modes, strictest

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

    def tighten(self, policy: BudgetPolicy) -> BudgetPolicy:
        """One conditional put: `domain.budget.may_replace` written as a DynamoDB condition."""
        modes = {f":m{i}": m for i, m in enumerate(replaceable_modes(policy.mode))}
        values: dict[str, AttributeValueTypeDef] = {key: {"S": mode.value} for key, mode in modes.items()}
        values |= {":period": {"S": policy.period}, ":none": {"S": ""}}
        try:
            self._ddb.put_item(
                TableName=self._table,
                Item=_item(policy),
                ConditionExpression=(
                    f"attribute_not_exists(pk) OR #mode IN ({', '.join(modes)})"
                    " OR (#period <> :none AND #period < :period)"
                ),
                ExpressionAttributeNames={"#mode": "mode", "#period": "period"},
                ExpressionAttributeValues=values,
            )
        except self._ddb.exceptions.ConditionalCheckFailedException:
            return self._get(policy.scope) or policy  # the stricter policy in force (policies are never deleted)
        self._register(policy.scope)
        return policy

    def release(self, policy: BudgetPolicy) -> bool:
        """One conditional put: the stored item must still say what `policy` says, field by field."""
        names = {"#mode": "mode", "#reason": "reason", "#period": "period"}
        values: dict[str, AttributeValueTypeDef] = {
            ":mode": {"S": policy.mode.value},
            ":reason": {"S": policy.reason},
            ":period": {"S": policy.period},
        }
        condition = "#mode = :mode AND #reason = :reason AND #period = :period AND "
        if policy.since is None:
            condition += "attribute_not_exists(since)"
        else:
            condition += "since = :since"
            values[":since"] = {"S": policy.since.isoformat()}
        try:
            self._ddb.put_item(
                TableName=self._table,
                Item=_item(lifted(policy)),
                ConditionExpression=condition,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
            )
        except self._ddb.exceptions.ConditionalCheckFailedException:
            return False
        return True

    def _register(self, scope: str) -> None:
        """The registry of scopes: one partition, a handful of items (the teams with budgets)."""
        self._ddb.put_item(
            TableName=self._table,
            Item={"pk": {"S": SCOPES_PK}, "sk": {"S": f"SCOPE#{scope}"}, "scope": {"S": scope}},
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


def _item(policy: BudgetPolicy) -> dict[str, AttributeValueTypeDef]:
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
    return item


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
    """Whether a scope's AWS budget has room again: its actual spend is below its limit (raised, say).

    The reconciler asks this only of a hold (`domain.budget.lifts_early`); a forecast's spot-only
    policy lasts until its period rolls over whatever the budget says now.
    """

    def __init__(self, *, budgets_client: BudgetsClient, sts_client: STSClient, stack_name: str) -> None:
        self._budgets = budgets_client
        self._sts = sts_client
        self._stack = stack_name
        self._account: str | None = None

    def __call__(self, policy: BudgetPolicy) -> bool:
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
