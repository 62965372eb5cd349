"""A ladder walk inside a 60 s function stops short of the function's deadline: the rungs it tried
are kept, the launch lease is given up at once, and the reconciler's next tick walks the rest.

Time is the fake clock's: each RunInstances takes ten seconds of it, and the deadline is what a
Lambda context's remaining time would say (`gpujobs_fakes.memory.Deadline`); nothing sleeps."""

from __future__ import annotations

import contextlib
from datetime import timedelta

from gpujobs.domain.job import Market
from gpujobs.domain.launching import LAUNCH_LEASE, LEASE_MARGIN
from gpujobs.domain.states import JobState
from gpujobs.service.launcher import WALK_RESERVE
from gpujobs.service.ports import LaunchRequest
from gpujobs_fakes.memory import Deadline
from tests.service.conftest import World, spec

ZONES = ("us-east-1a", "us-east-1b")
LAST = ("g6.xlarge", "us-east-1b", "on-demand")
RUN_INSTANCES_TAKES = timedelta(seconds=10)


def every_rung_but_the_last_refused(world: World) -> None:
    """Spot-first over two types and two zones: eight rungs, only the last has room."""
    world.compute.refuse = {
        (t, z, m): "InsufficientInstanceCapacity"
        for m in ("spot", "on-demand")
        for t in ("g5.xlarge", "g6.xlarge")
        for z in ZONES
        if (t, z, m) != LAST
    }

    def slow(_request: LaunchRequest) -> None:
        world.clock.advance(seconds=RUN_INSTANCES_TAKES.total_seconds())

    world.compute.on_run = slow


def test_a_walk_tries_only_the_rungs_its_deadline_allows_and_gives_the_lease_up(world: World) -> None:
    every_rung_but_the_last_refused(world)
    deadline = Deadline(world.clock, at=world.clock.now() + timedelta(seconds=40))
    world.rewire(time_left=deadline.time_left)

    job = world.submit(spec()).job

    # 40 s left: rungs start at 40, 30 and 20 s left; at 10 s (< WALK_RESERVE) the walk stops.
    assert timedelta(seconds=15) == WALK_RESERVE
    assert len(world.compute.calls) == 3
    assert job.state is JobState.LAUNCHING
    attempt = job.current_attempt
    assert attempt is not None
    assert len(attempt.tries) == 3
    assert attempt.lease_expires_at is not None
    assert attempt.lease_expires_at <= world.clock.now()  # nobody holds the job for 11 minutes
    assert "5 left for the next run" in job.status_detail
    assert world.compute.live() == []


def test_the_reconcilers_next_tick_walks_the_rest_of_the_ladder_and_launches(world: World) -> None:
    every_rung_but_the_last_refused(world)
    deadline = Deadline(world.clock, at=world.clock.now() + timedelta(seconds=40))
    world.rewire(time_left=deadline.time_left)
    job_id = world.submit(spec()).job.job_id

    world.clock.advance(minutes=1)
    deadline.at = world.clock.now() + timedelta(seconds=60)  # the next tick's own minute
    world.reconciler.run(deadline=deadline.at)

    job = world.store.get(job_id)
    assert job.state is JobState.RUNNING
    attempt = job.current_attempt
    assert attempt is not None
    assert attempt.number == 1  # the same attempt, continued
    assert (attempt.instance_type, attempt.zone, attempt.market) == ("g6.xlarge", "us-east-1b", Market.ON_DEMAND)
    pools = [(c.instance_type, c.subnet.zone, c.market.value) for c in world.compute.calls]
    assert len(pools) == 8
    assert len(set(pools)) == 8  # no rung tried twice
    assert len(attempt.tries) == 7


def test_a_walk_whose_tick_also_runs_short_goes_on_over_several_ticks_and_ends_queued(world: World) -> None:
    every_rung_but_the_last_refused(world)
    world.compute.refuse[LAST] = "InsufficientInstanceCapacity"  # no room anywhere
    deadline = Deadline(world.clock, at=world.clock.now() + timedelta(seconds=24))
    world.rewire(time_left=deadline.time_left)
    job_id = world.submit(spec()).job.job_id
    ticks = 0
    while world.store.get(job_id).state is JobState.LAUNCHING:
        ticks += 1
        world.clock.advance(minutes=1)
        deadline.at = world.clock.now() + timedelta(seconds=44)  # each tick: time for three rungs
        world.reconciler.run()
        assert ticks < 10

    job = world.store.get(job_id)
    assert job.state is JobState.QUEUED
    assert job.history[-1].reason == "no-capacity"
    assert len(world.compute.calls) == 8
    assert ticks == 3  # 1 rung at submit, then 3, 3 and the last 1


class FunctionTimedOut(BaseException):
    """Lambda ending the invocation at its deadline: nothing after it runs, no `finally` writes."""


def test_a_walk_killed_mid_way_holds_the_job_only_until_its_invocations_deadline(world: World) -> None:
    """Issue 19, item 11: the function dies in the middle of a RunInstances (a hung call, an
    out-of-memory kill, the timeout). Its claim used to hold the job for the 11 min lease; now it
    lasts until the invocation's deadline (and `LEASE_MARGIN`), and the next tick takes it over."""
    deadline = Deadline(world.clock, at=world.clock.now() + timedelta(seconds=60))
    world.rewire(time_left=deadline.time_left)

    def dies(_request: LaunchRequest) -> None:
        world.clock.advance(seconds=60)
        raise FunctionTimedOut

    world.compute.on_run = dies
    with contextlib.suppress(FunctionTimedOut):
        world.submit(spec())
    [job] = world.store.list_by_state(JobState.LAUNCHING, limit=10)
    attempt = job.current_attempt
    assert attempt is not None
    assert attempt.lease_expires_at is not None
    assert attempt.lease_expires_at == deadline.at + LEASE_MARGIN  # not 11 min after the claim
    assert world.compute.live() == []

    # the reconciler's first tick after the dead invocation's end (and the margin) launches it
    world.compute.on_run = None
    world.clock.advance(seconds=LEASE_MARGIN.total_seconds())
    deadline.at = world.clock.now() + timedelta(seconds=60)
    world.reconciler.run(deadline=deadline.at)
    launched = world.store.get(job.job_id)
    assert launched.state is JobState.RUNNING
    assert launched.attempt_count == 1  # the same attempt taken over, not a second launch
    assert len(world.compute.live()) == 1


def test_a_launch_with_no_known_deadline_keeps_the_whole_lease(world: World) -> None:
    """A caller that cannot say how long it has (a script, the local cloud's CLI) keeps the lease
    longer than any launching function's timeout, so no second launcher takes over a live walk."""

    def dies(_request: LaunchRequest) -> None:
        raise FunctionTimedOut

    world.compute.on_run = dies
    with contextlib.suppress(FunctionTimedOut):
        world.submit(spec())
    [job] = world.store.list_by_state(JobState.LAUNCHING, limit=10)
    assert job.current_attempt is not None
    assert job.current_attempt.lease_expires_at == world.clock.now() + LAUNCH_LEASE
