"""The reconciler repairs what events failed to say, and costs what the active jobs cost."""

from __future__ import annotations

import contextlib
from datetime import timedelta

from gpujobs.domain.budget import BudgetMode, BudgetPolicy
from gpujobs.domain.job import Job
from gpujobs.domain.launching import LAUNCH_LEASE
from gpujobs.domain.reports import CheckpointReport, ExitReport, HeartbeatReport
from gpujobs.domain.states import JobState, Reason
from tests.service.conftest import World, dumped_then_killed, spec, stopped_for_cost_after


def running(world: World, message_id: str = "msg-1", **overrides: object) -> Job:
    job = world.submit(spec(**overrides), message_id=message_id).job
    assert job.state is JobState.RUNNING
    return job


def test_a_lost_state_change_is_repaired_and_the_job_relaunched(world: World) -> None:
    job = running(world, capacity="on-demand")
    (iid,) = world.store.get(job.job_id).instance_ids
    world.compute.terminate([iid])  # EC2 took it; the event never arrived

    first = world.reconciler.run()
    world.clock.advance(seconds=91)
    second = world.reconciler.run()

    assert first.repairs["lost state changes repaired"] == 1
    assert second.repairs["attempts settled"] == 1
    relaunched = world.store.get(job.job_id)
    assert relaunched.state is JobState.RUNNING
    assert relaunched.current_attempt is not None
    assert relaunched.current_attempt.number == 2


def test_a_lost_exit_report_and_state_change_still_end_a_finished_job(world: World) -> None:
    job = running(world)
    (iid,) = world.store.get(job.job_id).instance_ids
    world.reactions.report(ExitReport(job_id=job.job_id, attempt=1, instance_id=iid, exit_code=0))

    assert world.store.get(job.job_id).state is JobState.SUCCEEDED
    world.compute.terminate([iid])
    report = world.reconciler.run()
    assert report.active_jobs == 0


def test_tagged_instances_with_no_live_job_are_terminated_as_orphans_after_a_grace(world: World) -> None:
    job = running(world)
    world.service.cancel(job.job_id)
    orphan = world.compute.run_instances(world.compute.calls[0])  # same token: EC2 returns the same ones
    assert orphan  # (terminated by the cancel already)
    stray_request = world.compute.calls[0].__class__(**{**world.compute.calls[0].__dict__, "client_token": "stray"})
    (stray,) = world.compute.run_instances(stray_request)

    young = world.reconciler.run()
    world.clock.advance(minutes=11)
    old = world.reconciler.run()

    assert young.repairs["orphans terminated"] == 0
    assert old.repairs["orphans terminated"] == 1
    assert stray.instance_id in world.compute.terminated


def test_a_launch_stuck_in_launching_is_taken_over_once_its_lease_expires(world: World) -> None:
    def crash(request: object) -> None:
        raise TimeoutError("the Lambda died mid-launch")

    world.compute.on_run = crash
    with contextlib.suppress(TimeoutError):
        world.submit(spec())
    world.compute.on_run = None
    (job,) = world.store.list_by_state(JobState.LAUNCHING)

    world.clock.current += LAUNCH_LEASE + timedelta(minutes=1)
    report = world.reconciler.run()

    assert report.repairs["stuck launches taken over"] == 1
    assert world.store.get(job.job_id).state is JobState.RUNNING


def test_a_queued_job_is_retried_when_its_next_try_time_comes(world: World) -> None:
    world.compute.refuse = {
        ("g5.xlarge", z, "on-demand"): "InsufficientInstanceCapacity" for z in ("us-east-1a", "us-east-1b")
    }
    job = world.submit(spec(capacity="on-demand", instance_types=["g5.xlarge"])).job
    assert job.state is JobState.QUEUED

    world.reconciler.run()
    assert world.store.get(job.job_id).state is JobState.QUEUED
    world.compute.refuse = {}
    world.clock.advance(minutes=31)
    world.reconciler.run()

    assert world.store.get(job.job_id).state is JobState.RUNNING


def test_held_jobs_are_released_when_the_budget_period_rolls_over(world: World) -> None:
    world.budgets.set_policy(BudgetPolicy(scope="all", mode=BudgetMode.HOLD, reason="ACTUAL", period="2026-11"))
    job = world.submit(spec()).job
    assert job.state is JobState.QUEUED

    world.reconciler.run()
    assert world.store.get(job.job_id).state is JobState.QUEUED
    world.clock.advance(days=2)  # 2026-12-01
    report = world.reconciler.run()

    assert report.repairs["budget holds released"] == 1
    world.reconciler.run()
    assert world.store.get(job.job_id).state is JobState.RUNNING


def test_a_hold_with_a_malformed_period_is_reported_and_kept_while_the_rest_is_reconciled(world: World) -> None:
    world.budgets.set_policy(BudgetPolicy(scope="vision", mode=BudgetMode.HOLD, reason="ACTUAL", period="Nov 2026"))
    world.compute.refuse = {
        ("g5.xlarge", z, "on-demand"): "InsufficientInstanceCapacity" for z in ("us-east-1a", "us-east-1b")
    }
    job = world.submit(spec(capacity="on-demand", instance_types=["g5.xlarge"], team="speech")).job
    assert job.state is JobState.QUEUED
    world.compute.refuse = {}

    world.clock.advance(days=40)
    report = world.reconciler.run()

    assert report.repairs["errors"] == 1
    assert report.repairs["budget holds released"] == 0
    assert world.budgets.policy_for("vision").mode is BudgetMode.HOLD
    assert world.store.get(job.job_id).state is JobState.RUNNING


def test_a_job_past_its_max_runtime_is_checkpointed_then_stopped(world: World) -> None:
    job = running(world, max_runtime_minutes=60)
    (iid,) = world.store.get(job.job_id).instance_ids

    world.clock.advance(minutes=61)
    world.reconciler.run()
    assert world.store.get(job.job_id).stop_request is not None
    assert world.signaller.signals[-1][0] == (iid,)
    world.reactions.report(CheckpointReport(job_id=job.job_id, attempt=1, step=900, uri="s3://b/step-900"))
    world.reactions.instance_state(iid, "terminated")

    stopped = world.store.get(job.job_id)
    assert stopped.state is JobState.STOPPED
    assert stopped.history[-1].reason is Reason.MAX_RUNTIME


def test_a_job_past_its_max_cost_is_stopped(world: World) -> None:
    job = running(world, max_cost_usd=1.0)  # g5.xlarge spot at $0.50/h here

    assert stopped_for_cost_after(world, job.job_id, minutes=120)


def test_a_hung_trainer_whose_heartbeat_stopped_is_replaced(world: World) -> None:
    job = running(world)
    (iid,) = world.store.get(job.job_id).instance_ids
    world.reactions.report(HeartbeatReport(job_id=job.job_id, attempt=1, step=10))

    world.clock.advance(minutes=16)
    report = dumped_then_killed(world)

    assert report.repairs["hung attempts terminated"] == 1
    assert iid in world.compute.terminated


def test_its_reads_grow_with_active_jobs_not_with_history(world: World) -> None:
    for n in range(5):
        done = running(world, message_id=f"m-{n}", name=f"old-{n}")
        world.service.cancel(done.job_id)
    running(world, message_id="m-live", name="live")

    report = world.reconciler.run()

    assert report.active_jobs == 1
