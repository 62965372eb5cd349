"""One attempt's reports cannot make the control plane write at any rate it likes (issue 18).

Heartbeats are recorded at most once per `heartbeat_record_interval`; the rest are acknowledged
without a write and counted (`ReportsRateLimited`). Checkpoints and exits are never limited (they
change state), and a flood of identical ones decides nothing to write. Decided at injected times.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpujobs.domain.decisions import RATE_LIMITED_METRIC, heartbeat_record_interval, on_report
from gpujobs.domain.effects import Outcome
from gpujobs.domain.job import Admission, Job, Market
from gpujobs.domain.launching import Gang, claim_launch, record_launch
from gpujobs.domain.reports import CheckpointReport, ExitReport, HeartbeatReport, Report
from gpujobs.domain.spec import validate_spec

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
JOB_ID = "j-0000000000000001"
GANG = Gang(("i-1", "i-2"), "g5.xlarge", "us-east-1a", Market.SPOT, "subnet-a")


def running(heartbeat_seconds: int = 60) -> Job:
    spec = {
        "name": "digits",
        "image": "img:1",
        "command": ["python", "train.py"],
        "instance_types": ["g5.xlarge"],
        "nodes": 2,
        "trainer": {"heartbeat_seconds": heartbeat_seconds},
    }
    job = Job.submitted(job_id=JOB_ID, spec=validate_spec(spec), now=NOW, message_id="m-1")
    claimed = claim_launch(job, now=NOW, hold=None, admission=Admission(at=NOW)).job
    assert claimed is not None
    launched = record_launch(claimed, attempt_number=1, gang=GANG, tries=(), now=NOW).job
    assert launched is not None
    return launched


def flood(job: Job, reports: list[tuple[Report, datetime]]) -> tuple[Job, int, float]:
    """Apply each report as the service would; the job, the writes it cost and the metric counted."""
    writes, limited = 0, 0.0
    for report, at in reports:
        decision = on_report(job, report, now=at)
        limited += decision.metrics.get(RATE_LIMITED_METRIC, 0)
        if decision.job is not None:
            job, writes = decision.job, writes + 1
    return job, writes, limited


def test_a_heartbeat_flood_is_written_once_per_interval_and_the_rest_are_counted() -> None:
    job = running()
    second = timedelta(seconds=1)
    heartbeats = [(HeartbeatReport(JOB_ID, 1, step=n), NOW + n * second / 10) for n in range(1, 1201)]  # 10/s, 2 min

    after, writes, limited = flood(job, heartbeats)

    assert heartbeat_record_interval(job) == timedelta(seconds=30)
    assert writes == 4  # at 0.1 s, 30.1 s, 60.1 s, 90.1 s
    assert limited == 1200 - 4
    record = after.attempt(1)
    assert record is not None
    assert record.last_heartbeat_at == NOW + timedelta(seconds=90.1)


def test_a_limited_heartbeat_is_ignored_and_says_why() -> None:
    job, _, _ = flood(running(), [(HeartbeatReport(JOB_ID, 1, step=5), NOW)])

    decision = on_report(job, HeartbeatReport(JOB_ID, 1, step=6), now=NOW + timedelta(seconds=29))

    assert decision.outcome is Outcome.RATE_LIMITED
    assert decision.outcome.ignored
    assert decision.job is None
    assert decision.effects == ()
    assert decision.metrics == {RATE_LIMITED_METRIC: 1}
    assert "within 30s" in decision.detail


def test_a_trainer_at_its_own_period_is_never_limited() -> None:
    for period in (10, 20, 60, 300):
        job = running(heartbeat_seconds=period)
        beats = [(HeartbeatReport(JOB_ID, 1, step=n), NOW + n * timedelta(seconds=period)) for n in range(1, 21)]

        after, writes, limited = flood(job, beats)

        assert (writes, limited) == (20, 0), period
        record = after.attempt(1)
        assert record is not None
        assert record.heartbeat_step == 20


def test_a_flood_of_identical_checkpoints_and_exits_writes_each_once() -> None:
    job = running()
    checkpoint = CheckpointReport(JOB_ID, 1, step=100, uri="s3://b/ckpt/100")
    exit_report = ExitReport(JOB_ID, 1, exit_code=1, instance_id="i-1", message="boom")
    reports: list[tuple[Report, datetime]] = [(checkpoint, NOW + timedelta(milliseconds=n)) for n in range(500)]
    reports += [(exit_report, NOW + timedelta(seconds=1, milliseconds=n)) for n in range(500)]

    after, writes, limited = flood(job, reports)

    assert writes == 2
    assert limited == 0
    assert after.checkpoint_step == 100
    record = after.attempt(1)
    assert record is not None
    assert record.exit_codes == {"i-1": 1}


def test_checkpoints_and_exits_are_never_limited_however_close() -> None:
    job, _, _ = flood(running(), [(HeartbeatReport(JOB_ID, 1, step=1), NOW)])
    reports: list[tuple[Report, datetime]] = [
        (CheckpointReport(JOB_ID, 1, step=1, uri="s3://b/1"), NOW),
        (CheckpointReport(JOB_ID, 1, step=2, uri="s3://b/2"), NOW),
        (ExitReport(JOB_ID, 1, exit_code=0, instance_id="i-1"), NOW),
        (ExitReport(JOB_ID, 1, exit_code=0, instance_id="i-2"), NOW),
    ]

    after, writes, limited = flood(job, reports)

    assert (writes, limited) == (4, 0)
    assert after.checkpoint_step == 2
    record = after.attempt(1)
    assert record is not None
    assert record.exit_codes == {"i-1": 0, "i-2": 0}
