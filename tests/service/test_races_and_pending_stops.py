"""Stories of events that overlap: a stop under way meets a reclaim or a crash, a launch races a
report, a whole gang exits in the same instant. Each ends the way a user would expect."""

from __future__ import annotations

import threading
import time

import pytest

from gpujobs.domain.job import Job
from gpujobs.domain.reports import CheckpointReport, ExitReport, HeartbeatReport
from gpujobs.domain.states import JobState, Reason
from gpujobs.service.ports import Backoff, ConcurrentUpdateError, LaunchRequest
from tests.service.conftest import World, spec

POLICY_STOPS = [Reason.IDLE, Reason.BUDGET_EXCEEDED, Reason.MAX_RUNTIME, Reason.MAX_COST]


def running(world: World, **overrides: object) -> Job:
    job = world.submit(spec(**overrides)).job
    assert job.state is JobState.RUNNING
    return job


def reclaim(world: World, instance_ids: tuple[str, ...]) -> None:
    world.compute.terminate(instance_ids)
    for iid in instance_ids:
        world.reactions.instance_state(iid, "terminated")


# ---- scenario 4: a pending stop ends the job -------------------------------------------------------


@pytest.mark.parametrize("reason", POLICY_STOPS)
def test_a_spot_warning_during_a_pending_stop_ends_the_job_stopped_with_that_reason(
    world: World, reason: Reason
) -> None:
    job = running(world)
    (iid,) = world.store.get(job.job_id).instance_ids
    world.reactions.request_stop(job.job_id, reason, detail=f"policy: {reason.value}")

    world.reactions.spot_warning(iid)
    reclaim(world, (iid,))

    stopped = world.store.get(job.job_id)
    assert stopped.state is JobState.STOPPED
    assert stopped.history[-1].reason is reason
    assert len(world.compute.calls) == 1  # no replacement was launched
    assert [a.number for a in stopped.attempts] == [1]


@pytest.mark.parametrize("reason", POLICY_STOPS)
def test_a_crash_during_a_pending_stop_ends_the_job_stopped_with_that_reason(world: World, reason: Reason) -> None:
    job = running(world, nodes=2, max_attempts=3)
    nodes = world.store.get(job.job_id).instance_ids
    world.reactions.request_stop(job.job_id, reason, detail=f"policy: {reason.value}")

    world.reactions.report(ExitReport(job_id=job.job_id, attempt=1, instance_id=nodes[0], exit_code=1))
    assert nodes[1] in world.compute.terminated  # the rest of the gang still goes
    reclaim(world, nodes)

    stopped = world.store.get(job.job_id)
    assert stopped.state is JobState.STOPPED
    assert stopped.history[-1].reason is reason
    assert len(world.compute.calls) == 1


def test_a_new_attempt_never_inherits_an_old_stop_request(world: World) -> None:
    # given a record (written before stops ended jobs) that is being replaced with a stop on it
    job = running(world)
    world.reactions.request_stop(job.job_id, Reason.IDLE, detail="idle")
    asked = world.store.get(job.job_id)
    first = asked.current_attempt
    assert first is not None
    now = world.clock.now()
    ended = asked.with_attempt(first.model_copy(update={"ended_at": now, "end_reason": "interrupted"}), now=now)
    world.store.save(ended.transition(JobState.INTERRUPTED, Reason.SPOT_INTERRUPTION, now=now))

    world.reconciler.run()  # launches the replacement
    world.clock.advance(minutes=11)  # past the old request's checkpoint deadline
    world.reconciler.run()

    replaced = world.store.get(job.job_id)
    assert replaced.state is JobState.RUNNING
    assert replaced.stop_request is None
    (iid,) = replaced.instance_ids
    assert world.compute.instances[iid].state == "running"


# ---- scenario 9: a launch is recorded even when it loses a race ---------------------------------------


@pytest.mark.parametrize("report", ["heartbeat", "checkpoint"])
def test_a_launch_that_loses_a_race_to_a_report_is_still_recorded(world: World, report: str) -> None:
    def report_during_launch(request: LaunchRequest) -> None:
        world.compute.on_run = None
        if report == "heartbeat":
            world.reactions.report(HeartbeatReport(job_id=request.job_id, attempt=request.attempt, step=1))
        else:
            world.reactions.report(
                CheckpointReport(job_id=request.job_id, attempt=request.attempt, step=3, uri="s3://c")
            )

    world.compute.on_run = report_during_launch

    job = world.submit(spec(nodes=2)).job

    stored = world.store.get(job.job_id)
    assert stored.state is JobState.RUNNING
    assert sorted(stored.instance_ids) == sorted(f.instance.instance_id for f in world.compute.live())
    assert world.compute.terminated == []
    assert world.transitions(job.job_id)[-1] == ("LAUNCHING", "RUNNING", "instances-launched")


def test_a_transaction_conflict_is_a_lost_race_retried_with_jitter(world: World) -> None:
    job = running(world)
    pauses: list[float] = []
    world.rewire(backoff=Backoff(sleep=pauses.append, jitter=lambda: 0.5))
    world.store.faults.fail_next("save", times=3, error=ConcurrentUpdateError(job.job_id, job.version))

    cancelled = world.service.cancel(job.job_id)

    assert cancelled.state is JobState.CANCELLED
    assert pauses == [0.01, 0.02, 0.04]  # half of each growing window


# ---- scenario 10: exit reports are never lost ----------------------------------------------------------


def test_a_64_node_gang_whose_nodes_all_exit_0_at_once_succeeds(world: World) -> None:
    job = running(world, nodes=64, instance_types=["p4d.24xlarge"], capacity="on-demand")
    world.store.on_get = lambda: time.sleep(0.002)  # a read takes time, as DynamoDB's does
    start = threading.Barrier(64)
    errors: list[BaseException] = []

    def exit_0(rank: int) -> None:
        start.wait()
        try:
            world.reactions.report(ExitReport(job_id=job.job_id, attempt=1, node_rank=rank, exit_code=0))
        except BaseException as exc:  # any lost exit report fails the story
            errors.append(exc)

    threads = [threading.Thread(target=exit_0, args=(rank,)) for rank in range(64)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    done = world.store.get(job.job_id)
    assert done.state is JobState.SUCCEEDED
    attempt = done.attempt(1)
    assert attempt is not None
    assert len(attempt.exit_codes) == 64


def test_an_exit_report_that_overtakes_the_launch_record_is_kept_and_counted(world: World) -> None:
    def exit_before_the_record(request: LaunchRequest) -> None:
        world.compute.on_run = None
        world.reactions.report(ExitReport(job_id=request.job_id, attempt=request.attempt, node_rank=0, exit_code=0))

    world.compute.on_run = exit_before_the_record

    job = world.submit(spec()).job

    done = world.store.get(job.job_id)
    assert done.state is JobState.SUCCEEDED
    attempt = done.attempt(1)
    assert attempt is not None
    assert attempt.exit_codes == {attempt.instance_ids[0]: 0}
    assert world.alarms.alarms == {}
