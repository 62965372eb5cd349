"""The reconciler repairs before it launches, stops launching before its deadline, and never kills
a live gang because an eventually consistent index showed it an old version of the job.

Stories: a job that launched after the `ByState` index was last updated keeps its gang; 300 queued
jobs in a capacity crunch, each RunInstances taking a second, do not keep a lost instance from
being repaired in the same run, and the run ends before the function's timeout; the queued jobs a
run did not reach are the first ones tried by the next.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from gpujobs.domain.states import JobState
from gpujobs.service.ports import LaunchRequest
from tests.service.conftest import World, spec

EVERY_POOL = {
    (t, z, m): "InsufficientInstanceCapacity"
    for t in ("g5.xlarge", "g6.xlarge")
    for z in ("us-east-1a", "us-east-1b")
    for m in ("spot", "on-demand")
}
LAMBDA_TIMEOUT = timedelta(seconds=120)


class LambdaTimedOutError(BaseException):
    """Lambda ends the process at its timeout: nothing in the function can catch that."""


def test_a_gang_launched_after_the_index_was_read_is_not_terminated_as_an_orphan(world: World) -> None:
    world.compute.refuse = dict(EVERY_POOL)
    job = world.submit(spec()).job
    assert job.state is JobState.QUEUED
    world.store.lag_index()  # from here on, the ByState index still shows the job QUEUED
    world.compute.refuse = {}
    world.clock.advance(hours=1)
    launched = world.service.launch(job.job_id)
    assert launched.state is JobState.RUNNING
    gang = launched.instance_ids

    world.clock.advance(minutes=11)  # the gang is past the orphan grace
    report = world.reconciler.run()

    assert set(gang).isdisjoint(world.compute.terminated)
    assert world.store.get(job.job_id).state is JobState.RUNNING
    assert report.repairs["orphans spared by a consistent read"] == len(gang)


def test_a_stray_instance_is_still_terminated_when_a_consistent_read_confirms_it(world: World) -> None:
    job = world.submit(spec()).job
    request = world.compute.calls[-1]
    (stray,) = world.compute.run_instances(
        LaunchRequest(**{**request.__dict__, "attempt": 7, "client_token": "not-an-attempt-of-the-job"})
    )
    world.store.lag_index()

    world.clock.advance(minutes=11)
    report = world.reconciler.run()

    assert stray.instance_id in world.compute.terminated
    assert report.repairs["orphans terminated"] == 1
    assert world.store.get(job.job_id).state is JobState.RUNNING


def queue_in_a_crunch(world: World, count: int) -> list[str]:
    world.compute.refuse = dict(EVERY_POOL)
    ids = []
    for n in range(count):
        job = world.submit(spec(name=f"queued-{n}"), message_id=f"m-{n}").job
        assert job.state is JobState.QUEUED
        ids.append(job.job_id)
    return ids


def slow_run_instances_until(world: World, deadline_at: datetime) -> None:
    """Each RunInstances takes a second of the function's time; past the timeout Lambda kills it."""

    def one_second(_request: LaunchRequest) -> None:
        world.clock.advance(seconds=1)
        if world.clock.now() > deadline_at:
            raise LambdaTimedOutError

    world.compute.on_run = one_second


def test_300_queued_jobs_in_a_capacity_crunch_never_starve_the_repair_of_a_lost_instance(world: World) -> None:
    lost = world.submit(spec(name="lost", capacity="on-demand"), message_id="m-lost").job
    (iid,) = lost.instance_ids
    queue_in_a_crunch(world, 300)
    world.compute.terminate([iid])  # EC2 took it; the state change never arrived
    world.clock.advance(hours=1)  # every queued job's next try is due
    deadline = world.clock.now() + LAMBDA_TIMEOUT
    slow_run_instances_until(world, deadline)

    report = world.reconciler.run(deadline=deadline)

    attempt = world.store.get(lost.job_id).current_attempt
    assert attempt is not None
    assert iid in attempt.gone
    assert report.repairs["lost state changes repaired"] == 1
    assert report.repairs["launches deferred to the next run"] > 0
    assert world.clock.now() < deadline


def test_the_queued_jobs_a_run_did_not_reach_are_tried_first_by_the_next(world: World) -> None:
    queued = queue_in_a_crunch(world, 40)
    world.clock.advance(hours=1)
    first_deadline = world.clock.now() + LAMBDA_TIMEOUT
    slow_run_instances_until(world, first_deadline)
    world.reconciler.run(deadline=first_deadline)
    tried_first = {c.job_id for c in world.compute.calls if c.job_id in queued and c.attempt == 2}

    world.clock.advance(minutes=1)
    calls_before = len(world.compute.calls)
    second_deadline = world.clock.now() + LAMBDA_TIMEOUT
    slow_run_instances_until(world, second_deadline)
    world.reconciler.run(deadline=second_deadline)
    tried_next = [c.job_id for c in world.compute.calls[calls_before:]]

    assert tried_first
    assert tried_next
    assert tried_next[0] not in tried_first
