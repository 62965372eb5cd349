"""The dashboard's metrics by pool and team are read off each write of a job's record: a launch, the
capacity refusals before it, and an attempt's estimated cost when it ends; and each is written as an
EMF line with its own dimensions, which CloudWatch turns into the metric the dashboard graphs."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from gpujobs.domain.decisions import on_exit
from gpujobs.domain.job import Admission, Job, LaunchTry, Market
from gpujobs.domain.job_metrics import CAPACITY_REFUSALS, LAUNCHES, TEAM_COST, JobMetric, metrics_of_change
from gpujobs.domain.launching import Gang, claim_launch, record_launch
from gpujobs.domain.reports import ExitReport
from gpujobs.domain.spec import validate_spec
from gpujobs.runtime.observability import JOBS_IN_STATE_METRIC, EmfMetrics, count_jobs_by_state

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
SPEC = {"name": "digits", "image": "img:1", "command": ["python"], "instance_types": ["g5.xlarge"], "team": "vision"}
PRICES = {"g5.xlarge": 1.0, "g6.xlarge": 0.8}


def claimed() -> Job:
    job = Job.submitted(job_id="j-0000000000000001", spec=validate_spec(SPEC), now=NOW, message_id="m-1")
    decided = claim_launch(job, now=NOW, hold=None, admission=Admission(at=NOW)).job
    assert decided is not None
    return decided


def refused(instance_type: str, market: Market) -> LaunchTry:
    return LaunchTry(
        at=NOW,
        instance_type=instance_type,
        zone="us-east-1a",
        subnet_id="subnet-a",
        market=market,
        error_code="InsufficientInstanceCapacity",
    )


def test_a_launch_after_refusals_counts_each_refusal_and_the_launch_by_pool() -> None:
    before = claimed()
    tries = (refused("g5.xlarge", Market.SPOT), refused("g5.xlarge", Market.ON_DEMAND))
    gang = Gang(("i-1", "i-2"), "g6.xlarge", "us-east-1b", Market.SPOT, "subnet-b")
    after = record_launch(before, attempt_number=1, gang=gang, tries=tries, now=NOW).job
    assert after is not None

    found = metrics_of_change(before, after, hourly_usd=PRICES)

    assert sorted(found, key=lambda m: (m.name, m.dimensions)) == [
        JobMetric(CAPACITY_REFUSALS, 1.0, (("InstanceType", "g5.xlarge"), ("Market", "on-demand"))),
        JobMetric(CAPACITY_REFUSALS, 1.0, (("InstanceType", "g5.xlarge"), ("Market", "spot"))),
        JobMetric(LAUNCHES, 1.0, (("InstanceType", "g6.xlarge"), ("Market", "spot"))),
    ]
    assert metrics_of_change(after, after, hourly_usd=PRICES) == ()  # a write that changed nothing counts nothing


def test_an_attempt_that_ends_counts_its_estimated_cost_for_its_team() -> None:
    gang = Gang(("i-1", "i-2"), "g6.xlarge", "us-east-1b", Market.SPOT, "subnet-b")
    running = record_launch(claimed(), attempt_number=1, gang=gang, tries=(), now=NOW).job
    assert running is not None
    later = NOW + timedelta(hours=3)
    one = on_exit(
        running, ExitReport(job_id=running.job_id, attempt=1, exit_code=0, instance_id="i-1", node_rank=None), now=later
    ).job
    assert one is not None
    ended = on_exit(
        one, ExitReport(job_id=one.job_id, attempt=1, exit_code=0, instance_id="i-2", node_rank=None), now=later
    ).job
    assert ended is not None

    assert metrics_of_change(running, one, hourly_usd=PRICES) == ()  # still running
    [cost] = metrics_of_change(one, ended, hourly_usd=PRICES)

    assert cost.name == TEAM_COST
    assert cost.dimensions == (("Team", "vision"),)
    assert cost.value == pytest.approx(3 * 2 * 0.8)  # 3 hours x 2 instances x the list price


def test_each_metric_is_an_emf_line_with_its_own_dimensions(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    monkeypatch.delenv("POWERTOOLS_DEV", raising=False)
    EmfMetrics().record([JobMetric(LAUNCHES, 1.0, (("InstanceType", "g6.xlarge"), ("Market", "spot")))])
    count_jobs_by_state({"RUNNING": 2}, ["QUEUED", "RUNNING"])

    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]

    launch, queued, running = lines
    assert (launch["Launches"], launch["InstanceType"], launch["Market"]) == ([1.0], "g6.xlarge", "spot")
    [directive] = launch["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == "GpuJobs"
    assert {"InstanceType", "Market"} <= set(directive["Dimensions"][0])
    assert (queued[JOBS_IN_STATE_METRIC], queued["State"]) == ([0.0], "QUEUED")
    assert (running[JOBS_IN_STATE_METRIC], running["State"]) == ([2.0], "RUNNING")


def test_nothing_is_written_where_metrics_are_disabled(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local cloud disables metrics; its handlers' output stays readable."""
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")

    EmfMetrics().record([JobMetric(LAUNCHES, 1.0, (("InstanceType", "g6.xlarge"), ("Market", "spot")))])
    count_jobs_by_state({"RUNNING": 2}, ["RUNNING"])

    assert capsys.readouterr().out == ""
