"""`keep_on_failure`: a gang whose crash fails the job stays up for inspection, billed, until its
keep is over or the job is cancelled; a crash that is retried keeps nothing.

Stories: the last attempt of a one-node job crashes: the job is FAILED, its instance stays up and
is billed until the keep ends, the reconciler leaves it while the keep lasts and terminates it
after; a cancel of the FAILED job releases its gang at once (twice is harmless); a crash with
attempts left terminates what the crashed node kept up and relaunches; one node of a gang on its
last attempt crashes while the others hang: the whole gang is kept, none terminated.
"""

from __future__ import annotations

from datetime import timedelta

from gpujobs.domain.cost import BilledPool, billed_pools, cost_of
from gpujobs.domain.job import Job
from gpujobs.domain.reports import ExitReport
from gpujobs.domain.states import JobState, Reason
from tests.service.conftest import World, spec


def prices(job: Job) -> dict[BilledPool, float | None]:
    """$1 an hour in every pool the job was billed in."""
    return dict.fromkeys(billed_pools(job), 1.0)


def live(world: World) -> set[str]:
    return {f.instance.instance_id for f in world.compute.live()}


def crash(world: World, job_id: str, *, attempt: int, node: int = 0) -> None:
    job = world.store.get(job_id)
    instance_id = job.attempts[attempt - 1].instance_ids[node]
    world.reactions.report(
        ExitReport(job_id=job_id, attempt=attempt, instance_id=instance_id, node_rank=node, exit_code=1)
    )


def test_the_last_attempts_crash_keeps_its_instance_billed_until_the_keep_is_over(world: World) -> None:
    # given a one-node job whose only attempt runs, kept 30 minutes on failure
    job = world.submit(spec(keep_on_failure="30m", max_attempts=1)).job
    [instance] = job.instance_ids
    world.clock.advance(minutes=20)

    # when its workload crashes
    crash(world, job.job_id, attempt=1)

    # then the job fails and its instance stays up, kept until 30 minutes from now
    failed = world.store.get(job.job_id)
    assert failed.state is JobState.FAILED
    assert failed.history[-1].reason is Reason.CRASHED_TOO_OFTEN
    assert failed.kept is not None
    assert failed.kept.until == world.clock.now() + timedelta(minutes=30)
    assert instance in live(world)
    billed_at_failure = cost_of(failed, world.clock.now(), prices(failed))

    # and the reconciler leaves it while the keep lasts, billing it all the while
    world.clock.advance(minutes=29)
    world.reconciler.run()
    assert instance in live(world)
    assert world.store.get(job.job_id).state is JobState.FAILED
    assert cost_of(failed, world.clock.now(), prices(failed)) > billed_at_failure

    # and terminates it once the keep is over; the bill stops at the keep's end
    world.clock.advance(minutes=2)
    world.reconciler.run()
    world.reconciler.run()
    assert instance not in live(world)
    assert world.store.get(job.job_id).state is JobState.FAILED
    ended = cost_of(failed, failed.kept.until, prices(failed))
    assert cost_of(failed, world.clock.now() + timedelta(hours=5), prices(failed)) == ended


def test_a_cancel_of_the_failed_job_releases_its_kept_gang_at_once(world: World) -> None:
    job = world.submit(spec(keep_on_failure="2h", max_attempts=1)).job
    crash(world, job.job_id, attempt=1)
    assert live(world) == set(job.instance_ids)

    world.clock.advance(minutes=5)
    world.service.cancel(job.job_id)
    world.service.cancel(job.job_id)  # twice is harmless

    released = world.store.get(job.job_id)
    assert released.state is JobState.FAILED  # FAILED stays terminal: no CANCELLED
    assert released.kept is not None
    assert released.kept.released_at == world.clock.now()
    assert not released.kept.lasts(world.clock.now())
    assert live(world) == set()


def test_a_crash_with_attempts_left_terminates_what_the_node_kept_up_and_relaunches(world: World) -> None:
    job = world.submit(spec(keep_on_failure="30m", max_attempts=3)).job
    [crashed] = job.instance_ids

    crash(world, job.job_id, attempt=1)

    retried = world.store.get(job.job_id)
    assert Reason.CRASHED_RETRYING in [h.reason for h in retried.history]
    assert retried.kept is None
    assert crashed not in live(world)  # its bootstrap kept it up: the control plane takes it
    assert retried.state is JobState.RUNNING
    assert live(world) == set(retried.instance_ids)


def test_a_gang_whose_last_attempt_crashes_on_one_node_is_kept_whole_hung_ranks_too(world: World) -> None:
    # given a 3-node gang on its last attempt
    job = world.submit(spec(nodes=3, keep_on_failure="1h", max_attempts=1)).job

    # when node 1 crashes and the others never report (hung in a collective)
    crash(world, job.job_id, attempt=1, node=1)

    # then the job fails at once and no node is terminated
    failed = world.store.get(job.job_id)
    assert failed.state is JobState.FAILED
    assert failed.kept is not None
    assert live(world) == set(job.instance_ids)
    world.clock.advance(minutes=59)
    world.reconciler.run()
    assert live(world) == set(job.instance_ids)


def test_without_keep_on_failure_a_crashed_node_ends_its_gang_as_before(world: World) -> None:
    job = world.submit(spec(nodes=3, max_attempts=1)).job

    crash(world, job.job_id, attempt=1, node=1)

    assert world.store.get(job.job_id).kept is None
    assert live(world) == set()  # the whole gang is terminated at the crash
