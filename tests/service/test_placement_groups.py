"""Placement groups live and die with the job's attempts.

A multi-node attempt launches into a cluster placement group made for it. A Region holds 500, so
an attempt that launched nothing gives its group back at once, the reconciler deletes the groups of
ended attempts and jobs once their instances are gone, and hitting the limit makes a job wait like
a capacity shortage instead of failing it. The fake compute keeps at most 500 groups and will not
delete one an instance still uses, as EC2 does.
"""

from __future__ import annotations

from gpujobs.domain.job import Job
from gpujobs.domain.reports import ExitReport
from gpujobs.domain.states import JobState
from gpujobs.service.ports import PlacementGroup
from tests.service.conftest import World, spec


def finish(world: World, job: Job) -> None:
    for rank in range(len(job.instance_ids)):
        world.reactions.report(ExitReport(job_id=job.job_id, attempt=1, exit_code=0, node_rank=rank))


def test_a_finished_gangs_group_is_deleted_by_the_reconciler_once_its_instances_are_gone(world: World) -> None:
    job = world.store.get(world.submit(spec(nodes=2)).job.job_id)
    assert list(world.compute.placement_groups) == [f"gpujobs-{job.job_id}-a1"]

    finish(world, job)
    assert world.store.get(job.job_id).state is JobState.SUCCEEDED
    world.reconciler.run()
    assert list(world.compute.placement_groups) == [f"gpujobs-{job.job_id}-a1"]  # its instances still shut down

    world.compute.terminate(list(job.instance_ids))
    report = world.reconciler.run()

    assert report.repairs["placement groups deleted"] == 1
    assert world.compute.placement_groups == {}


def test_a_cancelled_gangs_group_is_swept_too(world: World) -> None:
    job_id = world.submit(spec(nodes=4)).job.job_id

    world.service.cancel(job_id)
    world.reconciler.run()

    assert world.compute.placement_groups == {}


def test_an_attempt_that_launched_nothing_gives_its_group_back_at_once(world: World) -> None:
    world.compute.refuse = {
        (t, z, m): "InsufficientInstanceCapacity"
        for t in ("g5.xlarge", "g6.xlarge")
        for z in ("us-east-1a", "us-east-1b")
        for m in ("spot", "on-demand")
    }

    job = world.submit(spec(nodes=2)).job

    assert job.state is JobState.QUEUED
    assert world.compute.placement_groups == {}


def test_the_placement_group_limit_makes_a_job_wait_like_a_capacity_shortage_not_fail(world: World) -> None:
    world.compute.placement_group_limit = 1
    stale = PlacementGroup("gpujobs-j-gone-a1", "j-gone", 1)  # left behind by a job the table no longer has
    world.compute.placement_groups[stale.name] = stale

    job = world.submit(spec(nodes=2)).job

    assert job.state is JobState.QUEUED
    assert job.next_try_at is not None
    attempt = job.current_attempt
    assert attempt is not None
    assert [t.error_code for t in attempt.tries] == ["PlacementGroupLimitExceeded"]  # no rung would fix it
    assert len(world.compute.calls) == 1

    world.clock.current = job.next_try_at
    world.reconciler.run()  # sweeps the stale group, then retries the launch

    running = world.store.get(job.job_id)
    assert running.state is JobState.RUNNING
    assert list(world.compute.placement_groups) == [f"gpujobs-{job.job_id}-a2"]


def test_a_running_gangs_group_is_kept_when_the_state_index_has_not_caught_up(world: World) -> None:
    job = world.store.get(world.submit(spec(nodes=2)).job.job_id)
    world.store.list_by_state = lambda state, limit=100, **_: []  # type: ignore[method-assign,misc]

    world.reconciler.run()

    assert list(world.compute.placement_groups) == [f"gpujobs-{job.job_id}-a1"]
