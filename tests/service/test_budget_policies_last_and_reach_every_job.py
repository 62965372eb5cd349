"""Budget policies last as long as they should and reach every job of their scope.

Stories: spot-only after a forecast lasts until the period rolls over, even when the budget has
room again, while a hold is lifted early once it has; a late forecast never turns a hold into
spot-only within its month, even when it races the function writing the hold; and an actual
breach stops a job that was still launching when the alert came, once it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpujobs.domain.budget import BudgetMode, BudgetPolicy
from gpujobs.domain.job import Market
from gpujobs.domain.launching import claim_launch
from gpujobs.domain.reports import CheckpointReport
from gpujobs.domain.states import JobState, Reason
from gpujobs.service.budgeting import BudgetReactions
from gpujobs.service.ports import LaunchRequest
from gpujobs_fakes.memory import InMemoryBudgetBook
from gpujobs_fakes.wiring import rewired
from tests.service.conftest import World, spec

ACTUAL_VISION = (
    "AWS Budget Notification November 29, 2026\nAWS Account 123456789012\n\nDear AWS Customer,\n\n"
    "You requested that we alert you when the ACTUAL Cost associated with your gpujobs-gpujobs-team-vision "
    "budget is greater than $100.00 for the current month. The ACTUAL Cost associated with this budget is "
    "$120.59.\n\nBudget Name: gpujobs-gpujobs-team-vision\nBudget Type: Cost\nBudgeted Amount: $100.00\n"
    "Alert Type: ACTUAL\nAlert Threshold: > $100.00\nACTUAL Amount: $120.59\n"
)


def budget_function(world: World) -> BudgetReactions:
    return world.budget_reactions


def test_spot_only_after_a_forecast_lasts_until_the_period_rolls_over_even_when_the_budget_has_room(
    world: World,
) -> None:
    world.rewire(budget_has_room=lambda _policy: True)
    budget_function(world).apply("vision", BudgetMode.SPOT_ONLY, "FORECASTED $130 > $100")

    report = world.reconciler.run()

    assert report.repairs["budget holds released"] == 0
    assert world.budgets.policy_for("vision").mode is BudgetMode.SPOT_ONLY
    world.clock.advance(days=2)  # 2026-12-01: November's forecast has lapsed
    world.reconciler.run()
    assert world.budgets.policy_for("vision").mode is BudgetMode.NORMAL


def test_a_hold_is_lifted_early_once_the_budget_has_room_and_its_jobs_launch(world: World) -> None:
    room = False
    world.rewire(budget_has_room=lambda _policy: room)
    budget_function(world).apply("vision", BudgetMode.HOLD, "ACTUAL $120 > $100")
    job = world.submit(spec(team="vision")).job
    assert job.state is JobState.QUEUED

    world.reconciler.run()
    assert world.budgets.policy_for("vision").mode is BudgetMode.HOLD
    room = True  # the team's limit was raised
    report = world.reconciler.run()
    world.reconciler.run()

    assert report.repairs["budget holds released"] == 1
    assert world.budgets.policy_for("vision").mode is BudgetMode.NORMAL
    assert world.store.get(job.job_id).state is JobState.RUNNING


class BookRacedByAHold:
    """The budget book as a forecast's function sees it while another function writes a hold for
    the same scope: after the forecast's first read of the book, or before its first write."""

    def __init__(self, book: InMemoryBudgetBook, write_the_hold: Callable[[], None]) -> None:
        self._book = book
        self._write_the_hold: Callable[[], None] | None = write_the_hold

    def _race(self) -> None:
        if self._write_the_hold is not None:
            write, self._write_the_hold = self._write_the_hold, None
            write()

    def policy_for(self, team: str) -> BudgetPolicy:
        found = self._book.policy_for(team)
        self._race()
        return found

    def held_scopes(self) -> list[BudgetPolicy]:
        found = self._book.held_scopes()
        self._race()
        return found

    def tighten(self, policy: BudgetPolicy) -> BudgetPolicy:
        self._race()
        return self._book.tighten(policy)

    def release(self, policy: BudgetPolicy) -> bool:
        self._race()
        return self._book.release(policy)

    def __getattr__(self, name: str) -> Any:
        """Any other write goes through after the hold, as it would in the race."""
        target = getattr(self._book, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self._race()
            return target(*args, **kwargs)

        return call


def test_a_late_forecast_never_downgrades_a_hold_even_when_two_budget_functions_race(world: World) -> None:
    actual = budget_function(world)
    racing = BookRacedByAHold(world.budgets, lambda: actual.apply("vision", BudgetMode.HOLD, "ACTUAL $120 > $100"))
    forecast = rewired(world.services, budgets=racing).budgets

    reaction = forecast.apply("vision", BudgetMode.SPOT_ONLY, "FORECASTED $130 > $100")

    assert world.budgets.policy_for("vision").mode is BudgetMode.HOLD
    assert world.budgets.policy_for("vision").reason == "ACTUAL $120 > $100"
    assert reaction.detail.startswith("budget hold for vision")
    assert world.publisher.notices[-1][0] == "GPU Budget Hold"


def test_an_actual_breach_stops_a_job_that_was_launching_when_the_alert_came(world: World) -> None:
    other_team = world.submit(spec(team="speech"), message_id="m-speech").job

    def alert_during_the_launch(_request: LaunchRequest) -> None:
        world.compute.on_run = None
        budget_function(world).budget_notification(
            subject="AWS Budgets: gpujobs-gpujobs-team-vision has exceeded", message=ACTUAL_VISION
        )

    world.compute.on_run = alert_during_the_launch
    launching = world.submit(spec(team="vision"), message_id="m-vision").job
    assert launching.state is JobState.RUNNING  # the launch was in flight when the alert came
    assert launching.stop_request is None
    (iid,) = launching.instance_ids

    report = world.reconciler.run()

    request = world.store.get(launching.job_id).stop_request
    assert request is not None
    assert request.reason is Reason.BUDGET_EXCEEDED
    assert report.repairs["budget holds enforced"] == 1
    assert world.store.get(other_team.job_id).stop_request is None
    world.reactions.report(CheckpointReport(job_id=launching.job_id, attempt=1, step=300, uri="s3://b/step-300"))
    assert iid in world.compute.terminated  # spot: terminated once the checkpoint is safe
    world.reactions.instance_state(iid, "terminated")
    stopped = world.store.get(launching.job_id)
    assert stopped.state is JobState.STOPPED
    assert stopped.history[-1].reason is Reason.BUDGET_EXCEEDED
    assert world.store.get(other_team.job_id).state is JobState.RUNNING


def test_the_reconciler_holds_a_queued_job_of_a_held_scope_instead_of_launching_it(world: World) -> None:
    world.compute.refuse = {
        (t, z, m): "InsufficientInstanceCapacity"
        for t in ("g5.xlarge", "g6.xlarge")
        for z in ("us-east-1a", "us-east-1b")
        for m in ("spot", "on-demand")
    }
    queued = world.submit(spec(team="vision")).job
    assert queued.state is JobState.QUEUED
    budget_function(world).apply("vision", BudgetMode.HOLD, "ACTUAL $120 > $100")
    world.compute.refuse = {}
    world.clock.advance(hours=1)

    world.reconciler.run()

    held = world.store.get(queued.job_id)
    assert held.state is JobState.QUEUED
    assert held.hold_reason is not None
    assert "ACTUAL $120 > $100" in held.hold_reason
    assert world.compute.live() == []


# ---- a spot-only policy and jobs that may not use spot now (issue 19, item 5) ----------------


def launches_on_demand_once_the_forecast_lapses(world: World, job_id: str) -> None:
    world.clock.advance(days=2)  # 2026-12-01: November's forecast has lapsed
    world.reconciler.run()
    world.reconciler.run()
    launched = world.store.get(job_id)
    assert launched.state is JobState.RUNNING
    assert launched.current_attempt is not None
    assert launched.current_attempt.market is Market.ON_DEMAND


def test_an_on_demand_job_under_a_spot_only_forecast_waits_held_and_launches_when_the_period_rolls_over(
    world: World,
) -> None:
    budget_function(world).apply("vision", BudgetMode.SPOT_ONLY, "FORECASTED $130 > $100")

    job = world.submit(spec(team="vision", capacity="on-demand")).job
    for _ in range(3):  # ticks while the forecast holds: the job waits, it is never failed or relaunched
        world.clock.advance(minutes=10)
        world.reconciler.run()

    held = world.store.get(job.job_id)
    assert held.state is JobState.QUEUED
    assert held.history[-1].reason is Reason.BUDGET_HOLD
    assert held.hold_reason is not None
    assert "spot-only" in held.hold_reason
    assert "FORECASTED $130 > $100" in held.hold_reason
    assert world.compute.calls == []
    assert [h.reason for h in held.history].count(Reason.BUDGET_HOLD) == 1  # one transition, not one per tick
    launches_on_demand_once_the_forecast_lapses(world, job.job_id)


def test_a_volatile_spot_first_job_under_a_spot_only_forecast_stays_on_spot_instead_of_waiting(
    world: World,
) -> None:
    """Spot reclaimed it three times in an hour, which asks for on-demand (`domain.volatility`), and
    the budget's forecast allows spot only: the budget wins, the replacement goes to spot and the
    job never waits or fails for it (issue 21: a spot-first job is never given up for its interruptions)."""
    job = world.submit(spec(team="vision", max_interruptions=1)).job
    for number in (1, 2):
        world.reactions.spot_warning(world.store.get(job.job_id).attempt(number).instance_ids[0])
    budget_function(world).apply("vision", BudgetMode.SPOT_ONLY, "FORECASTED $130 > $100")

    world.reactions.spot_warning(world.store.get(job.job_id).attempt(3).instance_ids[0])
    world.reconciler.run()

    kept = world.store.get(job.job_id)
    assert kept.state is JobState.RUNNING
    assert kept.interruptions == 3
    assert kept.current_attempt is not None
    assert kept.current_attempt.market is Market.SPOT
    assert all(c.market is Market.SPOT for c in world.compute.calls)
    assert not any(h.target is JobState.FAILED for h in kept.history)


def test_a_spot_job_past_max_interruptions_under_a_spot_only_forecast_still_fails_for_its_interruptions(
    world: World,
) -> None:
    budget_function(world).apply("vision", BudgetMode.SPOT_ONLY, "FORECASTED $130 > $100")
    job = world.submit(spec(team="vision", capacity="spot", max_interruptions=0)).job
    (iid,) = job.instance_ids

    world.reactions.spot_warning(iid)

    failed = world.store.get(job.job_id)
    assert failed.state is JobState.FAILED
    assert failed.history[-1].reason is Reason.INTERRUPTED_TOO_OFTEN


def test_a_walk_that_finds_spot_only_in_force_for_an_on_demand_job_ends_it_queued_for_the_budget(
    world: World,
) -> None:
    """The walk judges its markets a moment after the claim did (a deadline's markets move with the
    clock): when only the budget's spot-only leaves it no rung, the job waits; it is not failed."""
    world.compute.refuse = {
        (t, z, "on-demand"): "InsufficientInstanceCapacity"
        for t in ("g5.xlarge", "g6.xlarge")
        for z in ("us-east-1a", "us-east-1b")
    }
    job = world.submit(spec(team="vision", capacity="on-demand")).job
    assert job.state is JobState.QUEUED
    assert job.next_try_at is not None
    world.compute.refuse = {}
    world.clock.advance(hours=1)
    claimed = world.service.change(job.job_id, lambda j: claim_launch(j, now=world.clock.now(), hold=None)).after
    assert claimed.state is JobState.LAUNCHING

    walked = world.service._launcher.walk(claimed, spot_only=True)

    assert walked.state is JobState.QUEUED
    assert walked.history[-1].reason is Reason.BUDGET_HOLD
    assert "spot-only" in walked.status_detail
