"""A job with a deadline whose spot attempt trains too slowly is moved to on-demand by the reconciler:
its trainers are asked to checkpoint, a replacement launches on-demand at once, and the spot
instances go once the warning window has passed. Nothing of this is counted as an interruption."""

from __future__ import annotations

from datetime import timedelta

from gpujobs.domain.budget import BudgetMode
from gpujobs.domain.job import Market
from gpujobs.domain.reports import HeartbeatReport
from gpujobs.domain.states import JobState, Reason
from tests.service.conftest import World, spec

DEADLINE = {"hours": 10, "expected_hours": 6, "total_steps": 600}
"""100 steps an hour expected; a changeover is 8 + 1 + 30 = 39 min."""


def test_a_spot_attempt_without_slack_left_moves_to_on_demand(world: World) -> None:
    job = world.submit(spec(deadline=DEADLINE)).job
    spot = world.store.get(job.job_id).current_attempt
    assert spot is not None
    assert spot.market is Market.SPOT  # 3.35 h of slack at submission: spot only
    world.reactions.report(HeartbeatReport(job_id=job.job_id, attempt=1, step=100))

    # After 3 h it is still at step 200 (4 h of work left, 7 h to go): 2.35 h of slack, it stays.
    world.clock.advance(seconds=3 * 3600)
    world.reactions.report(HeartbeatReport(job_id=job.job_id, attempt=1, step=200))
    world.reconciler.run()
    assert world.store.get(job.job_id).current_attempt == world.store.get(job.job_id).attempt(1)

    # After 6 h, step 250: 3.5 h of work left and 4 h to go leave less than a changeover.
    world.clock.advance(seconds=3 * 3600)
    world.reactions.report(HeartbeatReport(job_id=job.job_id, attempt=1, step=250))
    report = world.reconciler.run()

    assert report.repairs["market moves"] == 1
    moved = world.store.get(job.job_id)
    assert moved.state is JobState.RUNNING
    assert [a.market for a in moved.attempts] == [Market.SPOT, Market.ON_DEMAND]
    assert (JobState.RUNNING.value, JobState.INTERRUPTED.value, Reason.DEADLINE_MARKET) in world.transitions(job.job_id)
    assert moved.interruptions == 0
    assert world.signaller.signals == [(spot.instance_ids, spot.container_name(job.job_id))]
    assert moved.attempts[-1].market is Market.ON_DEMAND

    # The spot trainers saved and train on; past the warning window and its grace (5 min) they are taken.
    world.clock.advance(seconds=int(timedelta(minutes=6).total_seconds()))
    world.reconciler.run()
    assert all(world.compute.instances[i].state != "running" for i in spot.instance_ids)


def test_under_a_spot_only_budget_a_slow_spot_attempt_is_not_moved_tick_after_tick(world: World) -> None:
    """Issue 19, item 6: the move would launch its replacement on spot again (the budget allows
    nothing else), and the next tick would move that one: 31 gangs in 30 min. No move: it trains on."""
    job = world.submit(spec(deadline=DEADLINE, team="vision")).job
    spot = world.store.get(job.job_id).current_attempt
    assert spot is not None
    assert spot.market is Market.SPOT
    world.budget_reactions.apply("vision", BudgetMode.SPOT_ONLY, "FORECASTED $130 > $100")
    world.clock.advance(seconds=6 * 3600)
    world.reactions.report(HeartbeatReport(job_id=job.job_id, attempt=1, step=250))  # too slow: it would move

    moves = 0
    for tick in range(15):  # 30 minutes of reconciler ticks, the trainer still too slow
        world.reactions.report(HeartbeatReport(job_id=job.job_id, attempt=1, step=250 + tick))
        moves += world.reconciler.run().repairs["market moves"]
        world.clock.advance(seconds=120)

    assert moves == 0
    kept = world.store.get(job.job_id)
    assert kept.state is JobState.RUNNING
    assert [a.market for a in kept.attempts] == [Market.SPOT]
    assert world.signaller.signals == []
    assert all(world.compute.instances[i].state == "running" for i in spot.instance_ids)


def test_a_move_that_finds_no_on_demand_room_keeps_the_spot_attempt_training_and_retries_later(
    world: World,
) -> None:
    """Issue 19, item 6: the move never costs the running attempt before its replacement is up."""
    job = world.submit(spec(deadline=DEADLINE)).job
    spot = world.store.get(job.job_id).current_attempt
    assert spot is not None
    assert spot.market is Market.SPOT
    world.compute.refuse = {
        (t, z, "on-demand"): "InsufficientInstanceCapacity"
        for t in ("g5.xlarge", "g6.xlarge")
        for z in ("us-east-1a", "us-east-1b")
    }
    world.clock.advance(seconds=6 * 3600)
    step = 250

    def tick() -> int:
        nonlocal step
        step += 1
        world.reactions.report(HeartbeatReport(job_id=job.job_id, attempt=1, step=step))
        moves = world.reconciler.run().repairs["market moves"]
        world.clock.advance(seconds=120)
        return moves

    assert tick() == 1  # it tried: checkpoint, and a walk of the on-demand rungs, all refused
    kept = world.store.get(job.job_id)
    assert kept.state is JobState.RUNNING
    assert kept.current_attempt is not None
    assert kept.current_attempt.number == 1
    assert kept.current_attempt.interrupted_at is None
    assert "no room" in kept.status_detail
    assert (JobState.LAUNCHING.value, JobState.RUNNING.value, Reason.DEADLINE_MARKET) in world.transitions(job.job_id)
    refused_walk = len(world.compute.calls)

    assert sum(tick() for _ in range(4)) == 0  # 8 minutes: past the warning window, within the retry wait
    assert all(world.compute.instances[i].state == "running" for i in spot.instance_ids)
    assert len(world.compute.calls) == refused_walk
    assert world.store.get(job.job_id).current_attempt == world.store.get(job.job_id).attempt(1)

    world.compute.refuse = {}
    assert tick() == 1  # 10 minutes on: the move again, and now there is room
    moved = world.store.get(job.job_id)
    assert moved.state is JobState.RUNNING
    assert [a.market for a in moved.attempts] == [Market.SPOT, Market.ON_DEMAND]
    assert moved.interruptions == 0


def test_a_move_whose_replacement_is_slow_to_launch_keeps_the_spot_attempt_until_the_new_gang_is_up(
    world: World,
) -> None:
    """Issue 19, item 6 (make before break): the replacement's walk is cut short tick after tick
    (every invocation near its deadline) for half an hour. The moved spot attempt, whole and
    training, is not taken after the warning window as a reclaimed gang would be: only once the
    on-demand gang is up."""
    job = world.submit(spec(deadline=DEADLINE)).job
    spot = world.store.get(job.job_id).current_attempt
    assert spot is not None
    world.clock.advance(seconds=6 * 3600)
    world.rewire(time_left=lambda: timedelta(seconds=10))  # less than a rung needs: each walk pauses
    step = 250

    def tick() -> None:
        nonlocal step
        step += 1
        world.reactions.report(HeartbeatReport(job_id=job.job_id, attempt=1, step=step))
        world.reconciler.run()
        world.clock.advance(seconds=120)

    for _ in range(15):  # 30 minutes, the replacement never launched
        tick()
    waiting = world.store.get(job.job_id)
    assert waiting.state is JobState.LAUNCHING
    assert waiting.attempt(1) is not None
    assert waiting.attempt(1).moved  # type: ignore[union-attr]
    assert all(world.compute.instances[i].state == "running" for i in spot.instance_ids)

    world.rewire(time_left=lambda: None)
    tick()  # the walk goes through: the on-demand gang is up
    replaced = world.store.get(job.job_id)
    assert replaced.state is JobState.RUNNING
    assert replaced.current_attempt is not None
    assert replaced.current_attempt.market is Market.ON_DEMAND
    tick()  # and the next tick takes the spot attempt
    assert all(world.compute.instances[i].state != "running" for i in spot.instance_ids)
