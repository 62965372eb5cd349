"""Each job's instances get the job's own security group; no other job's instances are in it.

Before, every instance carried the stack's one group, whose self-ingress let any job's code reach
every other job's rendezvous, NCCL and gloo ports. Now the launch creates (or finds) the job's
group and attaches it; the reconciler deletes it once the job is over and its instances are gone.
"""

from __future__ import annotations

from gpujobs.domain.job import Job
from gpujobs.domain.states import JobState
from tests.service.conftest import World, spec


def running(world: World, token: str, **overrides: object) -> Job:
    job = world.submit(spec(client_token=token, **overrides), message_id=token).job
    assert job.state is JobState.RUNNING
    return job


def groups_of(world: World, job: Job) -> set[str | None]:
    return {r.security_group_id for r in world.compute.calls if r.job_id == job.job_id}


def test_two_jobs_launch_into_two_groups_of_their_own(world: World) -> None:
    first, second = running(world, "a", nodes=2), running(world, "b", nodes=2)

    assert len(groups_of(world, first)) == len(groups_of(world, second)) == 1
    assert groups_of(world, first).isdisjoint(groups_of(world, second))
    assert None not in groups_of(world, first) | groups_of(world, second)


def test_a_replacement_attempt_joins_the_same_jobs_group(world: World) -> None:
    job = running(world, "replaced")
    world.reactions.spot_warning(job.instance_ids[0])

    attempts = {r.attempt for r in world.compute.calls if r.job_id == job.job_id}
    assert attempts == {1, 2}
    assert len(groups_of(world, job)) == 1


def test_the_reconciler_deletes_a_jobs_group_once_its_instances_are_gone(world: World) -> None:
    job = running(world, "ending")
    (group,) = groups_of(world, job)
    world.service.cancel(job.job_id)

    world.reconciler.run()  # the fake's terminate is immediate; EC2's takes a minute or so
    assert group not in world.compute.security_groups


def test_the_reconciler_keeps_the_group_of_a_running_job(world: World) -> None:
    job = running(world, "running")
    (group,) = groups_of(world, job)

    world.reconciler.run()

    assert world.compute.security_groups[str(group)] == job.job_id


def test_the_reconciler_sweeps_a_leftover_group_whose_job_is_unknown(world: World) -> None:
    leftover = world.compute.job_security_group("j-00000000000000ff")

    world.reconciler.run()

    assert leftover not in world.compute.security_groups
