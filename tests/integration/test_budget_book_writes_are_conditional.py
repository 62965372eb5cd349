"""Budget policy writes are conditional, in DynamoDB (on moto) and in the in-memory fake alike.

Stories: a milder policy never replaces a stricter one of the same period, whoever writes last; a
policy of a new period replaces any of an earlier one; a release lifts a policy only if it is
still the one that was read. Each story runs against both books, so the fake the service tests
use enforces exactly what the table does.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import boto3
import pytest
from moto import mock_aws

from gpujobs.adapters.budgets import DynamoBudgetBook
from gpujobs.domain.budget import BudgetMode, BudgetPolicy
from gpujobs.service.ports import BudgetBook
from gpujobs_fakes.memory import InMemoryBudgetBook
from gpujobs_local.template import table_definition

pytestmark = pytest.mark.integration

NOV = datetime(2026, 11, 20, tzinfo=UTC)
HOLD_NOV = BudgetPolicy(scope="vision", mode=BudgetMode.HOLD, reason="ACTUAL $120 > $100", period="2026-11", since=NOV)
FORECAST_NOV = BudgetPolicy(scope="vision", mode=BudgetMode.SPOT_ONLY, reason="FORECASTED", period="2026-11", since=NOV)
FORECAST_DEC = BudgetPolicy(
    scope="vision",
    mode=BudgetMode.SPOT_ONLY,
    reason="FORECASTED",
    period="2026-12",
    since=datetime(2026, 12, 2, tzinfo=UTC),
)


@pytest.fixture(params=["dynamodb", "memory"])
def book(request: pytest.FixtureRequest, aws_credentials: None) -> Iterator[BudgetBook]:
    if request.param == "memory":
        yield InMemoryBudgetBook()
        return
    with mock_aws():
        dynamodb = boto3.client("dynamodb", region_name="us-east-1")
        dynamodb.create_table(**table_definition(table_name="t"))
        yield DynamoBudgetBook(table_name="t", client=dynamodb)


def test_a_forecast_written_after_a_hold_of_the_same_period_leaves_the_hold_in_force(book: BudgetBook) -> None:
    book.tighten(HOLD_NOV)

    in_force = book.tighten(FORECAST_NOV)

    assert in_force == HOLD_NOV
    assert book.policy_for("vision") == HOLD_NOV


def test_a_hold_replaces_a_forecast_and_a_new_period_replaces_an_old_hold(book: BudgetBook) -> None:
    assert book.tighten(FORECAST_NOV) == FORECAST_NOV
    assert book.tighten(HOLD_NOV) == HOLD_NOV

    assert book.tighten(FORECAST_DEC) == FORECAST_DEC
    assert book.policy_for("vision") == FORECAST_DEC


def test_a_policy_without_a_period_is_only_replaced_by_one_at_least_as_strict(book: BudgetBook) -> None:
    timeless = BudgetPolicy(scope="vision", mode=BudgetMode.HOLD, reason="set by hand")
    book.tighten(timeless)

    assert book.tighten(FORECAST_DEC) == timeless


def test_a_release_lifts_only_the_policy_that_was_read(book: BudgetBook) -> None:
    book.tighten(HOLD_NOV)
    newer = BudgetPolicy(scope="vision", mode=BudgetMode.HOLD, reason="ACTUAL $150 > $100", period="2026-11")
    book.tighten(newer)  # a second alert lands between the reconciler's read and its release

    assert book.release(HOLD_NOV) is False
    assert book.policy_for("vision") == newer
    assert book.release(newer) is True
    assert book.policy_for("vision").mode is BudgetMode.NORMAL
    assert book.held_scopes() == []
