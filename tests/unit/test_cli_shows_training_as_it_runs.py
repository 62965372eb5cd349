"""`gpujobs status` shows a running job's live step, the metrics its script logged and its
throughput, read from the heartbeats the control plane recorded (`decisions.on_heartbeat`)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from gpujobs.domain.decisions import on_heartbeat
from gpujobs.domain.job import Attempt, Job, Market
from gpujobs.domain.reports import HeartbeatReport
from gpujobs.domain.spec import load_spec
from gpujobs.domain.states import JobState, Reason
from gpujobs_cli import render

STARTED = datetime(2026, 3, 1, tzinfo=UTC)
SPEC = {"name": "j", "image": "r/i:1", "command": ["x"], "instance_types": ["g5.xlarge"]}


def running(attempt: int = 1) -> Job:
    job = Job.submitted(job_id="j-1", spec=load_spec(json.dumps(SPEC)), now=STARTED, message_id="m")
    for number in range(1, attempt + 1):
        ended = STARTED if number < attempt else None
        job = job.with_attempt(
            Attempt(
                number=number, started_at=STARTED, instance_ids=(f"i-{number}",), market=Market.SPOT, ended_at=ended
            ),
            now=STARTED,
        )
    job = job.transition(JobState.LAUNCHING, Reason.LAUNCH_STARTED, now=STARTED)
    return job.transition(JobState.RUNNING, Reason.INSTANCES_LAUNCHED, now=STARTED)


def heard(job: Job, step: int, *, attempt: int = 1, minutes: int = 1, metrics: bool = True) -> Job:
    report = HeartbeatReport(
        job_id=job.job_id,
        attempt=attempt,
        step=step,
        metrics=(("loss", 0.4321), ("lr", 3e-4)) if metrics else None,
        steps_per_second=2.5 if metrics else None,
        samples_per_second=160.0 if metrics else None,
    )
    decided = on_heartbeat(job, report, now=STARTED + timedelta(minutes=minutes))
    assert decided.job is not None
    return decided.job


def test_a_running_job_shows_its_live_step_logged_metrics_and_throughput() -> None:
    text = render.job_status(heard(running(), 1200), now=STARTED)

    assert "progress  step 1200 at 2026-03-01 00:01:00Z" in text
    assert "metrics   loss 0.4321  lr 0.0003  (step 1200)" in text
    assert "speed     2.5 steps/s, 160 samples/s" in text


def test_a_replacement_shows_no_metrics_of_the_attempt_before_it() -> None:
    before = heard(running(attempt=2).model_copy(), 1200, attempt=2)
    job = running(attempt=3).model_copy(update={"progress": before.progress})
    job = heard(job, 1100, attempt=3, metrics=False)  # its trainer reports no metrics (an older release)

    text = render.job_status(job, now=STARTED)

    assert "progress  step 1100" in text
    assert "metrics" not in text
    assert "speed" not in text


def test_the_series_prints_one_row_per_recorded_heartbeat_with_a_column_per_metric() -> None:
    job = heard(heard(running(), 100, minutes=1), 200, minutes=2)

    lines = render.metric_series(job).splitlines()

    assert lines[0].split() == ["TIME", "ATTEMPT", "STEP", "LOSS", "LR", "STEPS/S", "SAMPLES/S"]
    assert [line.split()[2:] for line in lines[1:]] == [
        ["1", "100", "0.4321", "0.0003", "2.5", "160"],
        ["1", "200", "0.4321", "0.0003", "2.5", "160"],
    ]


def test_a_job_that_logged_nothing_says_how_to_log() -> None:
    assert "run.log(...)" in render.metric_series(running())
