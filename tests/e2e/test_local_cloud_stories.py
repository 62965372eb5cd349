"""End-to-end stories on the local cloud: the real stack, handlers, bootstrap and trainer, on one machine.

Each story starts its own local cloud (`stage` in conftest.py: moto on loopback, the template's event
sources driving the real Lambda handlers, every launched instance running the real bootstrap and the
digits trainer under torchrun as local processes), plays the user or EC2, and checks what a user
would look at: the job's state and reason, its attempts and instances, the step a replacement
resumed from, the accuracy the trainer printed. When a story ends, the fixture checks that no
process and no port of it is left.
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest

from gpujobs.domain import fate
from gpujobs.domain.job import Job, Market
from gpujobs.domain.states import JobState, Reason
from gpujobs_cli.main import main as gpujobs_cli
from gpujobs_local.cloud import Delivery
from gpujobs_local.instances import STATE_CHANGE
from gpujobs_local.session import ROOT
from tests.e2e.conftest import TYPES, Stage, digits_spec
from tests.warning_saves import warning_saves_problem

pytestmark = [pytest.mark.integration, pytest.mark.training]

EVENTS = ROOT / "events"
GONE = ("stopping", "stopped", "shutting-down", "terminated")


def _last_reason(stage: Stage, job_id: str) -> Reason:
    return stage.job(job_id).history[-1].reason


def _attempts_told(job: Job) -> str:
    """What a failed story prints of how a job's attempts went (CI keeps only the assertion's text)."""
    attempts = [
        (a.number, a.market, a.zone, a.end_reason, a.exit_codes, a.error_line, a.interrupted_at) for a in job.attempts
    ]
    history = [(h.at.isoformat(), h.target.value, h.reason.value, h.attempt, h.detail) for h in job.history]
    return f"attempts {attempts}; history {history}"


def _attempt_number(stage: Stage, job_id: str) -> int:
    current = stage.job(job_id).current_attempt
    return current.number if current else 0


# ---- 1. happy path ------------------------------------------------------------------------------------


@pytest.mark.timeout(240)
def test_a_short_digits_job_succeeds_and_leaves_nothing_running(stage: Stage) -> None:
    # given a short digits job
    job_id = stage.submit(digits_spec(steps=120, checkpoint_every=40))

    # when it runs to the end
    job = stage.wait_state(job_id, JobState.SUCCEEDED, JobState.FAILED, timeout=150)

    # then it succeeded on its first attempt, with a trained model
    assert job.state is JobState.SUCCEEDED, job.status_detail
    assert [a.number for a in job.attempts] == [1]
    (instance,) = job.attempts[0].instance_ids
    final = stage.trainer_line(instance, "final")
    assert final is not None, stage.log_text(instance)[-2000:]
    assert final["step"] == 120
    assert isinstance(final["accuracy"], float)
    assert final["accuracy"] > 0.5
    assert job.checkpoint_step is not None
    assert job.checkpoint_step >= 80  # step 40 and 80 at least were committed and heard
    # and its instance is terminated, nothing of the stack runs any more
    stage.wait_nothing_running()
    assert stage.ec2_states() == {instance: "terminated"}
    assert stage.failed_deliveries() == []


# ---- 2. spot interruption, exact resume ---------------------------------------------------------------


@pytest.mark.timeout(240)
def test_a_spot_interruption_resumes_in_another_pool_from_the_preempted_checkpoint(stage: Stage) -> None:
    # given a job training slowly enough to be interrupted in the middle
    job_id = stage.submit(digits_spec(steps=120, checkpoint_every=40, step_sleep=0.15))
    first = stage.wait_running(job_id)
    (victim,) = first.instance_ids
    stage.wait("the first periodic checkpoint", lambda: any(c.step == 40 for c in stage.checkpoints(1)), 120)

    # when EC2 announces the spot interruption (the notice, then the termination 10 s later)
    stage.runner.interrupt_spot(victim, notice_seconds=10)

    # then a replacement is launched in another pool
    stage.wait("the replacement attempt", lambda: _attempt_number(stage, job_id) >= 2, 60)
    # the warning's checkpoint-now (SSM), IMDS notice and SIGTERM saved once, or joined the save just made
    preempted = stage.preemption_checkpoint(job_id, 1)
    assert 40 <= preempted.step < 120

    job = stage.wait_state(job_id, JobState.SUCCEEDED, JobState.FAILED, timeout=150)
    assert job.state is JobState.SUCCEEDED, job.status_detail
    assert job.interruptions == 1
    assert [a.number for a in job.attempts] == [1, 2]
    reclaimed, replacement = job.attempts
    assert reclaimed.end_reason == "interrupted"
    assert replacement.pool is not None
    assert replacement.pool != reclaimed.pool
    assert replacement.market is Market.SPOT
    # and it resumed exactly where the reclaimed attempt saved, and finished the run
    (new_instance,) = replacement.instance_ids
    resumed = stage.trainer_line(new_instance, "resumed")
    assert resumed is not None, stage.log_text(new_instance)[-2000:]
    assert resumed["step"] == preempted.step
    final = stage.trainer_line(new_instance, "final")
    assert final is not None
    assert final["step"] == 120
    assert final["resumed_from"] == preempted.step
    assert final["accuracy"] > 0.5
    stage.wait_nothing_running()


# ---- 3. capacity fallback -----------------------------------------------------------------------------


@pytest.mark.timeout(240)
def test_no_capacity_for_the_first_instance_type_falls_back_to_the_next(stage: Stage) -> None:
    # given EC2 has no g5.12xlarge capacity anywhere
    stage.cloud.inject_capacity_error(instance_type="g5.12xlarge")

    # when a job that prefers g5.12xlarge, then g6.12xlarge, is submitted
    job_id = stage.submit(digits_spec(steps=120, checkpoint_every=40))
    attempt = stage.wait_running(job_id)

    # then every g5.12xlarge rung was tried and refused, and it launched on g6.12xlarge
    assert TYPES == ["g5.12xlarge", "g6.12xlarge"]
    assert attempt.instance_type == "g6.12xlarge"
    assert attempt.tries, "the refused rungs are recorded on the attempt"
    assert {t.instance_type for t in attempt.tries} == {"g5.12xlarge"}
    assert {t.error_code for t in attempt.tries} == {"InsufficientInstanceCapacity"}
    (instance,) = attempt.instance_ids
    described = stage.cloud.client("ec2").describe_instances(InstanceIds=[instance])
    assert described["Reservations"][0]["Instances"][0]["InstanceType"] == "g6.12xlarge"
    # and the job trains there to the end
    job = stage.wait_state(job_id, JobState.SUCCEEDED, JobState.FAILED, timeout=150)
    assert job.state is JobState.SUCCEEDED, job.status_detail
    final = stage.trainer_line(instance, "final")
    assert final is not None
    assert final["step"] == 120


# ---- 4. duplicate submission --------------------------------------------------------------------------


@pytest.mark.timeout(240)
def test_the_same_submission_sent_twice_is_one_job_with_one_set_of_instances(stage: Stage) -> None:
    # given one spec with one client_token
    spec = digits_spec(steps=120, checkpoint_every=40, step_sleep=0.2)

    # when it is sent twice, back to back (a client retrying after a timeout)
    first_id = stage.submit(spec)
    second_id = stage.submit(spec)
    assert first_id == second_id

    # then both messages are consumed
    def records_consumed() -> int:
        return sum(
            len((d.event or {}).get("Records", []))
            for _, d in stage.deliveries("SQS")
            if d.function == "SubmitFunction" and d.ok
        )

    stage.wait("both submissions consumed", lambda: records_consumed() >= 2, 60)
    stage.wait_running(first_id)
    # and there is one job, with one attempt and one instance
    running = list(stage.session.store.list_by_state(JobState.RUNNING, limit=100))
    queued_or_launching = [
        job
        for state in (JobState.QUEUED, JobState.LAUNCHING)
        for job in stage.session.store.list_by_state(state, limit=100)
    ]
    assert [j.job_id for j in running] == [first_id]
    assert queued_or_launching == []
    job = stage.job(first_id)
    assert len(job.attempts) == 1
    assert len(job.attempts[0].instance_ids) == 1
    assert stage.live_instances() == list(job.attempts[0].instance_ids)
    assert sorted(stage.ec2_states()) == list(job.attempts[0].instance_ids)


# ---- 5. idle alarm ------------------------------------------------------------------------------------


def _idle_alarm(stack: str, instance_id: str) -> dict[str, Any]:
    sample = json.loads((EVENTS / "idle" / "gpu-idle-alarm.json").read_text())
    name = f"gpujobs-idle-{stack}-{instance_id}"
    detail = sample["detail"]
    detail["alarmName"] = name
    detail["configuration"]["metrics"][0]["metricStat"]["metric"]["dimensions"] = {"InstanceId": instance_id}
    return {
        "source": "aws.cloudwatch",
        "detail_type": "CloudWatch Alarm State Change",
        "detail": detail,
        "resources": [f"arn:aws:cloudwatch:us-east-1:123456789012:alarm:{name}"],
    }


class StopWatch:
    """Which delivery's handler took the instances away (the first after which the stop is executed)."""

    def __init__(self, stage: Stage, job_id: str) -> None:
        self.stage, self.job_id = stage, job_id
        self.executed_by: Delivery | None = None

    def __call__(self, delivery: Delivery) -> None:  # runs on the cloud's loop thread, between handlers
        if self.executed_by is not None:
            return
        job = self.stage.job(self.job_id)
        if job.stop_request is not None and job.stop_request.executed_at is not None:
            self.executed_by = delivery


def _assert_stopped_after_a_newer_checkpoint(stage: Stage, job_id: str, watch: StopWatch, reason: Reason) -> None:
    job = stage.wait_state(job_id, JobState.STOPPED, JobState.FAILED, JobState.SUCCEEDED, timeout=90)
    assert job.state is JobState.STOPPED, job.status_detail
    assert job.history[-1].reason is reason
    request = job.stop_request
    assert request is not None
    assert request.reason is reason
    asked_at = request.checkpoint_step_at_request
    assert asked_at is not None
    assert job.checkpoint_step is not None
    assert job.checkpoint_step > asked_at
    # the instances went only when a checkpoint newer than the request was committed
    assert watch.executed_by is not None
    assert watch.executed_by.kind == "Checkpoint Committed", watch.executed_by.line()
    assert int(watch.executed_by.event["detail"]["step"]) > asked_at
    (instance,) = job.attempts[-1].instance_ids
    stopper_at = next(at for at, d in stage.deliveries() if d is watch.executed_by)
    # The job may read STOPPED before EC2's own event is delivered (the reconciler can settle the attempt
    # first from DescribeInstances, as it would on AWS when the event is late): wait for the event itself.
    stage.wait("the instance's state change", lambda: stage.first_state_change(instance, GONE) is not None, 60)
    first_gone = stage.first_state_change(instance, GONE)
    assert first_gone is not None
    assert first_gone >= stopper_at
    stage.wait_nothing_running()
    assert stage.ec2_states()[instance] == "terminated"  # spot: terminated, not stopped


@pytest.mark.timeout(240)
def test_an_idle_alarm_stops_the_job_only_after_a_newer_checkpoint(stage: Stage) -> None:
    """Locally no SSM agent runs, so the checkpoint-now signal does not reach the trainer: the stop
    completes at the next periodic checkpoint (every 20 steps here), which is what the control plane
    waits for either way."""
    job_id = stage.submit(digits_spec(steps=2000, checkpoint_every=20, step_sleep=0.05))
    (instance,) = stage.wait_running(job_id).instance_ids
    stage.wait("a first checkpoint", lambda: stage.job(job_id).checkpoint_step is not None, 120)
    watch = StopWatch(stage, job_id)
    stage.cloud.on_delivery(watch)

    # when the GPU-idle alarm of its instance goes to ALARM
    assert stage.cloud.stack is not None
    stage.cloud.put_event(**_idle_alarm(stage.cloud.stack.stack_name, instance))

    # then a stop is requested, checkpoint first
    stage.wait("the idle stop request", lambda: stage.job(job_id).stop_request is not None, 30)
    # and the job ends STOPPED (idle) once a newer checkpoint is committed, and not before
    _assert_stopped_after_a_newer_checkpoint(stage, job_id, watch, Reason.IDLE)


# ---- 6. budget breach ---------------------------------------------------------------------------------


@pytest.mark.timeout(240)
def test_an_actual_budget_breach_stops_running_jobs_after_a_checkpoint_and_holds_new_ones(stage: Stage) -> None:
    job_id = stage.submit(digits_spec(steps=2000, checkpoint_every=20, step_sleep=0.05))
    stage.wait_running(job_id)
    stage.wait("a first checkpoint", lambda: stage.job(job_id).checkpoint_step is not None, 120)
    watch = StopWatch(stage, job_id)
    stage.cloud.on_delivery(watch)

    # when AWS Budgets says the stack's budget is actually exceeded
    stack = stage.cloud.stack_name
    sample = json.loads((EVENTS / "budget" / "actual-breach-sns.json").read_text())["Records"][0]["Sns"]
    budget = f"gpujobs-{stack}-all"
    stage.cloud.client("sns").publish(
        TopicArn=stage.cloud.outputs["BudgetAlertsTopicArn"],
        Subject=sample["Subject"].replace("gpujobs-gpujobs-all", budget),
        Message=sample["Message"].replace("gpujobs-gpujobs-all", budget),
    )

    # then the running job is stopped after a newer checkpoint (budget-exceeded)
    stage.wait("the budget stop request", lambda: stage.job(job_id).stop_request is not None, 30)
    _assert_stopped_after_a_newer_checkpoint(stage, job_id, watch, Reason.BUDGET_EXCEEDED)

    # and a new submission is held in the queue, launching nothing
    held_id = stage.submit(digits_spec(name="digits-held"))
    stage.wait(
        "the new job to be held", lambda: stage.state(held_id) is not None and bool(stage.job(held_id).hold_reason)
    )
    held = stage.job(held_id)
    assert held.state is JobState.QUEUED
    assert held.hold_reason is not None
    assert "budget" in held.hold_reason
    assert all(not a.instance_ids for a in held.attempts)
    stage.cloud.run_reconciler()  # a reconciler pass in the same period does not release the hold
    assert stage.state(held_id) is JobState.QUEUED
    assert stage.live_instances() == []


# ---- 7. cancel ----------------------------------------------------------------------------------------


@pytest.mark.timeout(240)
def test_gpujobs_cancel_terminates_the_running_instance(stage: Stage, capsys: pytest.CaptureFixture[str]) -> None:
    job_id = stage.submit(digits_spec(steps=2000, checkpoint_every=100, step_sleep=0.05))
    (instance,) = stage.wait_running(job_id).instance_ids
    stage.wait("training to start", lambda: stage.progress(instance) >= 10, 120)

    # when the user cancels it from the CLI (the queue and table the local cloud exports)
    with mock.patch.dict(os.environ, stage.cloud.exports()):
        assert gpujobs_cli(["cancel", job_id]) == 0
    assert job_id in capsys.readouterr().out

    # then the job is CANCELLED and its instance terminated, nothing relaunched
    job = stage.wait_state(job_id, JobState.CANCELLED, timeout=60)
    assert job.history[-1].reason is Reason.USER_CANCELLED
    assert len(job.attempts) == 1
    stage.wait_nothing_running()
    assert stage.ec2_states() == {instance: "terminated"}
    assert stage.job(job_id).state is JobState.CANCELLED


# ---- 8. a gang -------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_two_node_gang_interrupted_on_one_node_regroups_around_its_replacement(stage: Stage) -> None:
    """Issue 21: only the reclaimed node is replaced. The survivor's instance stays up, its bootstrap
    rendezvous again (its generation tag raised) with the replacement, launched into the same pool
    and attempt, and the gang resumes at the same world size from the warning's checkpoint."""
    job_id = stage.submit(digits_spec(steps=120, checkpoint_every=40, step_sleep=0.15, nodes=2))
    first = stage.wait_running(job_id, timeout=90)
    assert len(first.instance_ids) == 2
    survivor, victim = first.instance_ids
    stage.wait("the first periodic checkpoint", lambda: any(c.step == 40 for c in stage.checkpoints(1)), 150)

    # when one node (not rank 0's, as launched) gets the spot notice
    stage.runner.interrupt_spot(victim, notice_seconds=10)

    # then only that node is replaced, in the same attempt, and the gang resumes from the warning's save
    stage.wait("the replacement node", lambda: (stage.job(job_id).current_attempt or first).generation >= 1, 60)
    job = stage.wait_state(job_id, JobState.SUCCEEDED, JobState.FAILED, timeout=200)
    assert job.state is JobState.SUCCEEDED, job.status_detail
    assert [a.number for a in job.attempts] == [1], _attempts_told(job)
    (attempt,) = job.attempts
    assert attempt.instance_ids[0] == survivor
    assert victim not in attempt.instance_ids
    assert len(attempt.instance_ids) == 2
    (replacement,) = attempt.instance_ids[1:]
    assert attempt.left == (victim,)
    assert attempt.generation == 1
    runs = [line["step"] for i in attempt.instance_ids for line in stage.trainer_lines(i, "resumed")]
    step = max(runs)
    assert sorted(runs) == [0, step]  # printed by global rank 0: of the first gang, then of the regrouped one
    assert step >= 40
    saved = [(c.step, c.reason) for c in stage.checkpoints(1, job_id=job_id) if c.step <= step]
    assert warning_saves_problem(saved, step) is None  # from the warning's save: one warning, one save
    finals = [line for i in attempt.instance_ids if (line := stage.trainer_line(i, "final"))]
    assert [(line["step"], line["resumed_from"]) for line in finals] == [(120, step)]
    assert finals[0]["accuracy"] > 0.5
    survivor_log = stage.runner.log_path(survivor).read_text(errors="replace")
    assert "the gang regroups as generation 1" in survivor_log
    assert survivor_log.count("starting the workload as node") == 2  # one instance, two runs of the workload
    assert "starting the workload" in stage.runner.log_path(replacement).read_text(errors="replace")
    stage.wait_nothing_running()


# ---- 9. a lost state change ----------------------------------------------------------------------------


@pytest.mark.timeout(240)
@pytest.mark.parametrize("session_options", [{"reconcile_every": 3600.0}], ids=["reconciler-on-demand"])
def test_an_instance_lost_without_events_is_relaunched_by_the_reconciler(
    stage: Stage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The machine dies (`runner.crash`: every process SIGKILLed, terminated in EC2, so no `Job Exited`)
    and EventBridge loses its state-change notifications: the test drops them at the runner's `emit`
    (the one place the local cloud hands EC2 events to EventBridge), nothing else is bypassed.

    The scheduled reconciler is off in this session (`reconcile_every` one hour) so that only the
    two runs the story makes repair anything. The report grace (`gpujobs.domain.fate.REPORT_GRACE`,
    90 s) is monkeypatched to 2 s to keep the story short; the handlers run in this process, so
    they see the patched value. The behaviour is the same: the first run records the instance as
    gone and waits for reports still in flight; the run after the grace relaunches.
    """
    job_id = stage.submit(digits_spec(steps=2000, checkpoint_every=20, step_sleep=0.05))
    (victim,) = stage.wait_running(job_id).instance_ids
    stage.wait("a first checkpoint", lambda: stage.job(job_id).checkpoint_step is not None, 120)

    emit = stage.runner.emit

    def lossy_emit(**event: Any) -> None:
        if event["detail_type"] == STATE_CHANGE and event["detail"]["instance-id"] == victim:
            return  # lost on the way
        emit(**event)

    monkeypatch.setattr(stage.runner, "emit", lossy_emit)
    monkeypatch.setattr(fate, "REPORT_GRACE", timedelta(seconds=2))

    # when the instance dies and nobody hears of it
    stage.runner.crash(victim)
    assert stage.ec2_states()[victim] == "terminated"
    assert stage.first_state_change(victim, GONE) is None
    assert stage.job(job_id).state is JobState.RUNNING  # the control plane does not know yet

    # then the reconciler records it as gone, and waits for reports still in flight
    first = stage.cloud.run_reconciler()
    assert first["repairs"].get("lost state changes repaired") == 1, first
    job = stage.job(job_id)
    assert job.state is JobState.RUNNING
    assert job.attempts[0].gone == (victim,)
    assert not job.attempts[0].is_over

    # and after the grace, it relaunches the job, which resumes from its newest checkpoint
    stage.wait("the report grace", lambda: stage.job(job_id).attempts[0].gone_at is not None, 5)
    time.sleep(2.5)
    second = stage.cloud.run_reconciler()
    job = stage.job(job_id)
    assert len(job.attempts) == 2, (second, job.status_detail)
    lost = job.attempts[0]
    assert lost.end_reason == "interrupted"  # a spot instance gone without a report
    assert job.state in (JobState.LAUNCHING, JobState.RUNNING)
    checkpoint = job.checkpoint_step
    assert checkpoint is not None
    (new_instance,) = stage.wait_running(job_id, attempt=2).instance_ids
    stage.wait("the replacement to resume", lambda: stage.trainer_line(new_instance, "resumed") is not None, 120)
    resumed = stage.trainer_line(new_instance, "resumed")
    assert resumed is not None
    assert resumed["step"] == checkpoint
