"""`domain.idle_detection`: a pure judgement of the record, the instances fed no GPU metric and the time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpujobs.domain.effects import Outcome
from gpujobs.domain.idle_detection import GPU_METRIC_GRACE, note_idle_detection_off
from gpujobs.domain.job import Attempt, Job
from gpujobs.domain.spec import validate_spec
from gpujobs.domain.states import JobState, Reason

START = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
SPEC = {
    "name": "x",
    "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/t:1",
    "command": ["python", "t.py"],
    "instance_types": ["g5.xlarge"],
}


def running(**spec: object) -> Job:
    job = Job.submitted(job_id="j-0123456789abcdef", spec=validate_spec({**SPEC, **spec}), now=START, message_id="m")
    attempt = Attempt(number=1, started_at=START, instance_ids=("i-a", "i-b"), instance_type="g5.xlarge")
    launching = job.transition(JobState.LAUNCHING, Reason.LAUNCH_STARTED, now=START)
    return launching.with_attempt(attempt, now=START).transition(JobState.RUNNING, Reason.INSTANCES_LAUNCHED, now=START)


def test_an_instance_fed_nothing_past_the_grace_is_noted_once() -> None:
    job = running()
    after = START + GPU_METRIC_GRACE

    early = note_idle_detection_off(job, silent={"i-b"}, now=after - timedelta(seconds=1))
    noted = note_idle_detection_off(job, silent={"i-b", "i-other"}, now=after)

    assert early.job is None
    assert noted.outcome is Outcome.IDLE_DETECTION_OFF
    assert noted.job is not None
    assert noted.job.state is JobState.RUNNING
    assert noted.job.status_detail.startswith("idle detection is off for this job: no GPU metric from i-b since ")
    assert "2026-12-01 09:00 UTC" in noted.job.status_detail
    assert noted.effects == ()
    again = note_idle_detection_off(noted.job, silent={"i-b"}, now=after + timedelta(hours=1))
    assert (again.outcome, again.job) == (Outcome.ALREADY_HANDLED, None)


def test_nothing_is_noted_for_instances_fed_for_a_cpu_job_or_a_job_not_running() -> None:
    late = START + timedelta(hours=2)

    assert note_idle_detection_off(running(), silent={"i-other"}, now=late).job is None
    assert note_idle_detection_off(running(gpus_per_node=0), silent={"i-a"}, now=late).job is None
    cancelled = running().transition(JobState.CANCELLED, Reason.USER_CANCELLED, now=late)
    assert note_idle_detection_off(cancelled, silent={"i-a"}, now=late).job is None
