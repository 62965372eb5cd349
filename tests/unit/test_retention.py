"""`domain.retention`: an ended job's objects are due `retention` after its end, never while it is active."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpujobs.domain.effects import Outcome
from gpujobs.domain.job import Job
from gpujobs.domain.retention import ended_at, objects_deleted, objects_due, objects_kept
from gpujobs.domain.spec import validate_spec
from gpujobs.domain.states import JobState, Reason
from gpujobs.runtime.settings import Settings, SettingsError

START = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
DAYS_30 = timedelta(days=30)
SPEC = {
    "name": "x",
    "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/t:1",
    "command": ["python", "t.py"],
    "instance_types": ["g5.xlarge"],
    "checkpoint": "directory",
}


def queued() -> Job:
    return Job.submitted(job_id="j-0123456789abcdef", spec=validate_spec(SPEC), now=START, message_id="m")


def cancelled(at: datetime) -> Job:
    job = queued().transition(JobState.LAUNCHING, Reason.LAUNCH_STARTED, now=START)
    return job.transition(JobState.CANCELLED, Reason.USER_CANCELLED, now=at)


def test_an_active_job_is_never_due_however_old() -> None:
    job = queued()

    assert ended_at(job) is None
    assert not objects_kept(job)
    assert not objects_due(job, now=START + timedelta(days=400), retention=DAYS_30)
    assert objects_deleted(job, now=START + timedelta(days=400), retention=DAYS_30).job is None


def test_an_ended_job_is_due_retention_after_its_end_not_after_its_submission() -> None:
    end = START + timedelta(days=45)  # ran 45 days: its oldest objects are older than the retention
    job = cancelled(end)

    assert ended_at(job) == end
    assert objects_kept(job)
    assert not objects_due(job, now=end + DAYS_30 - timedelta(seconds=1), retention=DAYS_30)
    assert objects_due(job, now=end + DAYS_30, retention=DAYS_30)


def test_deleting_is_noted_once_and_takes_the_job_out_of_the_kept() -> None:
    end = START + timedelta(days=2)
    now = end + DAYS_30
    decision = objects_deleted(cancelled(end), now=now, retention=DAYS_30)

    assert decision.outcome is Outcome.OBJECTS_DELETED
    assert decision.job is not None
    assert decision.job.objects_deleted_at == now
    assert decision.job.state is JobState.CANCELLED
    assert not objects_kept(decision.job)
    assert objects_deleted(decision.job, now=now + DAYS_30, retention=DAYS_30).outcome is Outcome.ALREADY_HANDLED


def test_the_reconcilers_retention_comes_from_the_template_parameter_and_a_bad_value_is_named() -> None:
    base = {"JOBS_TABLE": "t", "EVENT_BUS_NAME": "b", "GPUJOBS_STACK_NAME": "s"}

    assert Settings.from_env(base).checkpoint_retention_days == 30
    assert Settings.from_env({**base, "CHECKPOINT_RETENTION_DAYS": "90"}).checkpoint_retention_days == 90
    with pytest.raises(SettingsError, match="CHECKPOINT_RETENTION_DAYS must be at least 1, not 0"):
        Settings.from_env({**base, "CHECKPOINT_RETENTION_DAYS": "0"})
    with pytest.raises(SettingsError, match="CHECKPOINT_RETENTION_DAYS must be a whole number of days, not '3d'"):
        Settings.from_env({**base, "CHECKPOINT_RETENTION_DAYS": "3d"})
