"""A failed effect is counted in `EffectsFailed` by the AWS call that failed (EffectsFailedAlarm sums
the series), and changes nothing else: the record is what the decision wrote, and the next decision
issues the effect again from it, counted again only if it fails again."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from gpujobs.domain.effects import EFFECTS_FAILED
from gpujobs.domain.hangs import HANG_DUMP_WAIT
from gpujobs.domain.job import Job
from gpujobs.domain.job_metrics import JobMetric
from gpujobs.domain.reports import CheckpointReport, HeartbeatReport
from gpujobs.domain.states import JobState
from gpujobs_fakes.memory import RecordingMetrics
from tests.service.conftest import World, spec


@pytest.fixture
def metrics(world: World) -> RecordingMetrics:
    recorder = RecordingMetrics()
    world.rewire(metrics=recorder)
    return recorder


def failed(metrics: RecordingMetrics) -> dict[str, int]:
    return dict(metrics.counts(EFFECTS_FAILED, "Effect"))


def running(world: World, **overrides: object) -> tuple[Job, str]:
    job = world.submit(spec(**overrides)).job
    assert job.state is JobState.RUNNING
    (iid,) = job.instance_ids
    return job, iid


def test_an_idle_alarm_that_cannot_be_created_is_counted_and_created_on_the_next_tick(
    world: World, metrics: RecordingMetrics
) -> None:
    world.alarms.faults.fail_next("create")

    job, iid = running(world)

    assert failed(metrics) == {"PutMetricAlarm": 1}
    assert iid not in world.alarms.alarms
    world.reconciler.run()
    assert iid in world.alarms.alarms
    assert failed(metrics) == {"PutMetricAlarm": 1}
    assert world.store.get(job.job_id).state is JobState.RUNNING


def test_a_cancel_whose_terminate_fails_is_counted_and_the_job_is_cancelled_all_the_same(
    world: World, metrics: RecordingMetrics
) -> None:
    job, iid = running(world)
    world.compute.faults.fail_next("terminate")

    cancelled = world.service.cancel(job.job_id)

    assert cancelled.state is JobState.CANCELLED
    assert world.compute.instances[iid].state == "running"
    assert iid not in world.alarms.alarms  # the effect after the failed one is still carried out
    assert failed(metrics) == {"Terminate": 1}
    world.service.cancel(job.job_id)  # a second cancel terminates what the first could not
    assert iid in world.compute.terminated
    assert failed(metrics) == {"Terminate": 1}


def test_a_checkpoint_signal_that_fails_is_counted_and_the_stop_stays_requested(
    world: World, metrics: RecordingMetrics
) -> None:
    job, iid = running(world)
    world.signaller.faults.fail_next("checkpoint_now")

    world.reactions.idle_alarm(iid)

    after = world.store.get(job.job_id)
    assert failed(metrics) == {"SendCommand": 1}
    assert world.signaller.signals == []
    assert after.state is JobState.RUNNING
    assert after.stop_request is not None
    assert world.compute.instances[iid].state == "running"


def test_a_policy_stop_whose_stop_call_fails_is_counted_and_issued_again(
    world: World, metrics: RecordingMetrics
) -> None:
    job, iid = running(world, capacity="on-demand")
    world.reactions.idle_alarm(iid)
    world.compute.faults.fail_next("stop")

    world.reactions.report(CheckpointReport(job_id=job.job_id, attempt=1, step=7, uri="s3://b/step-7"))

    assert failed(metrics) == {"Stop": 1}
    assert world.compute.instances[iid].state == "running"
    assert world.store.get(job.job_id).state is JobState.RUNNING
    world.reconciler.run()
    assert world.compute.instances[iid].state == "stopped"
    assert failed(metrics) == {"Stop": 1}


def test_a_hung_attempt_whose_terminate_fails_is_counted_and_the_run_goes_on(
    world: World, metrics: RecordingMetrics
) -> None:
    job, iid = running(world)
    world.reactions.report(HeartbeatReport(job_id=job.job_id, attempt=1, step=10))
    world.clock.advance(minutes=16)
    world.reconciler.run()  # asks for the stacks first (`domain.hangs`)
    world.clock.advance(minutes=HANG_DUMP_WAIT.total_seconds() / 60)
    world.compute.faults.fail_next("terminate")

    report = world.reconciler.run()

    assert failed(metrics) == {"Terminate": 1}
    assert report.repairs["errors"] == 0
    assert world.compute.instances[iid].state == "running"
    world.reconciler.run()
    assert iid in world.compute.terminated


class BrokenMetrics:
    def record(self, metrics: Sequence[JobMetric]) -> None:
        raise RuntimeError("CloudWatch is down")


def test_a_recorder_that_fails_too_never_stops_the_effects_that_follow(world: World) -> None:
    job, iid = running(world)
    world.rewire(metrics=BrokenMetrics())
    world.compute.faults.fail_next("terminate")

    assert world.service.cancel(job.job_id).state is JobState.CANCELLED
    assert iid not in world.alarms.alarms
