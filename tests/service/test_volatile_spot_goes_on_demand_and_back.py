"""Issue 21: a `spot-first` job is never given up for its interruptions. Spot that reclaims it three
times within six hours sends its next launch to on-demand; after its wait there (six hours, doubled
for each return that spot answered with more reclaims) the reconciler moves it back to spot, make
before break: checkpoint, a spot-only replacement, the on-demand instances taken only once the
replacement is up. With no spot room the on-demand attempt trains on and the move is tried again."""

from __future__ import annotations

import itertools
from datetime import timedelta

from gpujobs.domain.job import Job, Market
from gpujobs.domain.reports import CheckpointReport, HeartbeatReport
from gpujobs.domain.states import JobState, Reason
from tests.service.conftest import World, spec

SPOT_POOLS = [(t, z, "spot") for t in ("g5.xlarge", "g6.xlarge") for z in ("us-east-1a", "us-east-1b")]


def alive(world: World, job: Job) -> Job:
    """Every live attempt's trainer heartbeats and commits a checkpoint (what a healthy job sends)."""
    current = world.store.get(job.job_id)
    for attempt in current.attempts:
        if attempt.instance_ids and not attempt.is_over:
            step = int((world.clock.now() - current.created_at).total_seconds() // 60)  # a step a minute
            world.reactions.report(HeartbeatReport(job_id=job.job_id, attempt=attempt.number, step=step))
            uri = f"s3://ckpt-bucket/{job.job_id}/step-{step}"
            world.reactions.report(CheckpointReport(job_id=job.job_id, attempt=attempt.number, step=step, uri=uri))
    return world.store.get(job.job_id)


def hours_pass(world: World, job: Job, hours: float) -> Job:
    """Time passes with the reconciler running every 10 minutes and the trainers reporting."""
    for _ in range(round(hours * 6)):
        world.clock.advance(seconds=600)
        alive(world, job)
        world.reconciler.run()
    return world.store.get(job.job_id)


def reclaimed_three_times(world: World, job: Job) -> Job:
    for _ in range(3):
        current = alive(world, job)
        attempt = current.current_attempt
        assert attempt is not None
        assert attempt.market is Market.SPOT
        world.reactions.spot_warning(attempt.instance_ids[0])
        world.clock.advance(seconds=20 * 60)
        world.reconciler.run()
    return world.store.get(job.job_id)


def test_volatile_spot_sends_the_job_to_on_demand_and_calm_spot_takes_it_back(world: World) -> None:
    job = world.submit(spec()).job
    volatile = reclaimed_three_times(world, job)

    assert volatile.state is JobState.RUNNING
    assert volatile.interruptions == 3
    on_demand = volatile.current_attempt
    assert on_demand is not None
    assert on_demand.market is Market.ON_DEMAND  # three reclaims in an hour: on-demand first

    before = hours_pass(world, job, 5.5)  # its wait on on-demand is six hours
    assert before.current_attempt is not None
    assert before.current_attempt.number == on_demand.number
    assert not any(e.reason is Reason.BACK_TO_SPOT for e in before.history)

    back = hours_pass(world, job, 1)
    moves = [e for e in back.history if e.reason is Reason.BACK_TO_SPOT]
    assert [(e.source, e.target) for e in moves] == [(JobState.RUNNING, JobState.INTERRUPTED)]
    assert back.state is JobState.RUNNING
    spot = back.current_attempt
    assert spot is not None
    assert spot.market is Market.SPOT
    assert spot.number == on_demand.number + 1
    assert back.interruptions == 3  # a move is no interruption
    assert any(set(ids) == set(on_demand.instance_ids) for ids, _ in world.signaller.signals)  # checkpoint first
    assert all(world.compute.instances[i].state != "running" for i in on_demand.instance_ids)  # taken once spot is up
    assert all(c.market is Market.SPOT for c in world.compute.calls[-1:])


def test_a_move_back_without_spot_room_keeps_the_on_demand_attempt_training_and_retries(world: World) -> None:
    job = world.submit(spec()).job
    on_demand = reclaimed_three_times(world, job).current_attempt
    assert on_demand is not None
    assert on_demand.market is Market.ON_DEMAND
    world.compute.refuse.update(dict.fromkeys(SPOT_POOLS, "InsufficientInstanceCapacity"))

    kept = hours_pass(world, job, 6.5)

    assert kept.state is JobState.RUNNING
    assert kept.current_attempt is not None
    assert kept.current_attempt.instance_ids == on_demand.instance_ids  # it trained on, never stopped
    assert all(world.compute.instances[i].state == "running" for i in on_demand.instance_ids)
    tries = [e for e in kept.history if e.reason is Reason.BACK_TO_SPOT]
    assert (JobState.LAUNCHING, JobState.RUNNING) in [(e.source, e.target) for e in tries]
    spot_walks = [c for c in world.compute.calls if c.market is Market.SPOT and c.attempt > on_demand.number]
    assert spot_walks, "the move never tried spot"
    assert not [c for c in world.compute.calls if c.market is Market.ON_DEMAND and c.attempt > on_demand.number]
    moves = [e.at for e in tries if e.target is JobState.INTERRUPTED]
    assert moves[0] - on_demand.started_at >= timedelta(hours=6)  # not before its wait
    gaps = [b - a for a, b in itertools.pairwise(moves)]
    assert gaps == sorted(gaps)  # each refused try waits at least as long as the one before
    assert all(g >= timedelta(minutes=30) for g in gaps)

    world.compute.refuse.clear()
    back = hours_pass(world, job, 3)  # the backoff is never longer than 3 hours
    assert back.current_attempt is not None
    assert back.current_attempt.market is Market.SPOT


def test_spot_that_reclaims_the_job_again_after_its_return_doubles_the_next_wait(world: World) -> None:
    job = world.submit(spec(max_runtime_minutes=7 * 24 * 60)).job
    reclaimed_three_times(world, job)
    returned = hours_pass(world, job, 6.5)
    assert returned.current_attempt is not None
    assert returned.current_attempt.market is Market.SPOT

    again = reclaimed_three_times(world, job)
    second_stay = again.current_attempt
    assert second_stay is not None
    assert second_stay.market is Market.ON_DEMAND
    assert again.interruptions == 6

    still = hours_pass(world, job, 7)  # one return in memory: twelve hours now
    assert still.current_attempt is not None
    assert still.current_attempt.number == second_stay.number
    later = hours_pass(world, job, 5.5)
    assert later.current_attempt is not None
    assert later.current_attempt.market is Market.SPOT
    assert later.state is JobState.RUNNING
    assert not any(e.target is JobState.FAILED for e in later.history)
