"""`gpujobs status` says how much time a job with a deadline has to spare: in text and in --json."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from gpujobs.domain.job import Attempt, Job, Market
from gpujobs.domain.spec import load_spec
from gpujobs.domain.states import JobState, Reason
from gpujobs_cli import commands, render
from gpujobs_cli.main import main
from gpujobs_fakes.memory import InMemoryJobStore

SUBMITTED = datetime(2026, 3, 1, tzinfo=UTC)


def job(*, deadline: bool = True) -> Job:
    body: dict[str, object] = {"name": "j", "image": "r/i:1", "command": ["x"], "instance_types": ["p3.2xlarge"]}
    if deadline:
        body["deadline"] = {"hours": 52, "expected_hours": 48, "total_steps": 4800}
    return Job.submitted(job_id="j-1", spec=load_spec(json.dumps(body)), now=SUBMITTED, message_id="m")


def training(step: int) -> Job:
    """Running on spot since submission; its heartbeat says `step`, its last checkpoint less."""
    attempt = Attempt(number=1, started_at=SUBMITTED, instance_ids=("i-1",), market=Market.SPOT, heartbeat_step=step)
    launching = (
        job().with_attempt(attempt, now=SUBMITTED).transition(JobState.LAUNCHING, Reason.LAUNCH_STARTED, now=SUBMITTED)
    )
    running = launching.transition(JobState.RUNNING, Reason.INSTANCES_LAUNCHED, now=SUBMITTED)
    return running.model_copy(update={"checkpoint_step": step - 50})


def test_a_running_job_shows_hours_to_its_deadline_and_its_slack_from_its_heartbeat() -> None:
    now = SUBMITTED + timedelta(hours=41.8)
    # 3936 of 4800 steps: 8.64 h of work left, 10.2 h to go, 39 min for one changeover
    text = render.job_status(training(3936), now=now)
    assert "deadline  in 10.2 h, slack 0.9 h (due 2026-03-03 04:00:00Z)" in text
    assert render.deadline_json(training(3936), now) == {
        "due": "2026-03-03T04:00:00+00:00",
        "hours_left": 10.2,
        "slack_hours": 0.9,
    }


def test_a_late_job_says_so() -> None:
    text = render.job_status(job(), now=SUBMITTED + timedelta(hours=53))
    assert "deadline  passed 1.0 h ago, slack -49.6 h" in text


def test_a_job_without_a_deadline_shows_none() -> None:
    plain = job(deadline=False)
    assert "deadline" not in render.job_status(plain, now=SUBMITTED)
    assert render.deadline_json(plain, SUBMITTED) is None


def test_status_json_carries_the_deadline_beside_the_record(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    store = InMemoryJobStore()
    store.create(training(3936))
    monkeypatch.setattr(commands, "_discover", lambda _args, needs: None)
    monkeypatch.setattr(commands, "_store", lambda _resources: store)

    assert main(["status", "j-1", "--json"]) == 0

    shown = json.loads(capsys.readouterr().out)
    assert shown["job_id"] == "j-1"
    assert shown["spec"]["deadline"] == {"hours": 52.0, "expected_hours": 48.0, "total_steps": 4800}
    assert shown["deadline"]["due"] == "2026-03-03T04:00:00+00:00"
    assert set(shown["deadline"]) == {"due", "hours_left", "slack_hours"}


def test_an_ended_job_shows_its_newest_checkpoint_and_a_running_one_where_it_would_resume() -> None:
    """Issue 22: a SUCCEEDED job used to say it "resumes from checkpoint step 400"."""
    running = training(4000)
    done = running.transition(JobState.SUCCEEDED, Reason.COMPLETED, now=SUBMITTED + timedelta(hours=49))

    assert "resumes   from checkpoint step 3950" in render.job_status(running, now=SUBMITTED)
    ended = render.job_status(done, now=SUBMITTED + timedelta(hours=50))
    assert "checkpoint newest committed at step 3950" in ended
    assert "resumes" not in ended


def test_a_directory_job_shows_its_folders_newest_sync_not_a_training_step() -> None:
    """Issue 22: a `checkpoint: directory` job's checkpoint "step" is its folder's sync number."""
    body = {
        "name": "j",
        "image": "r/i:1",
        "command": ["x"],
        "instance_types": ["p3.2xlarge"],
        "checkpoint": "directory",
    }
    synced_at = SUBMITTED + timedelta(minutes=40)
    attempt = Attempt(
        number=1,
        started_at=SUBMITTED,
        instance_ids=("i-1",),
        market=Market.SPOT,
        checkpoint_step=7,
        checkpoint_at=synced_at,
    )
    submitted = Job.submitted(job_id="j-1", spec=load_spec(json.dumps(body)), now=SUBMITTED, message_id="m")
    launching = submitted.with_attempt(attempt, now=SUBMITTED).transition(
        JobState.LAUNCHING, Reason.LAUNCH_STARTED, now=SUBMITTED
    )
    running = launching.transition(JobState.RUNNING, Reason.INSTANCES_LAUNCHED, now=SUBMITTED).model_copy(
        update={"checkpoint_step": 7}
    )

    shown = render.job_status(running, now=SUBMITTED + timedelta(hours=1))

    assert "checkpoint the script's folder, sync #7 at 2026-03-01 00:40:00Z" in shown
    assert "(the next attempt restores it)" in shown
    assert "step 7" not in shown
