"""`gpujobs queue`, `gpujobs quota` and the queue line of `gpujobs status`, on moto: the table
built from template.yaml, jobs and the GPU ledger written by the store as the control plane writes
them, and the team configuration in SSM as the stack names it."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import boto3
import pytest

from gpujobs.domain.job import Admission, Attempt, Job
from gpujobs.domain.spec import validate_spec
from gpujobs.domain.states import JobState, Reason
from gpujobs_cli import commands, queue
from gpujobs_cli.main import main
from tests.integration.test_cli_moto import NOW, Stack, aws, env_stack, stack_resources

__all__ = ["aws", "env_stack", "stack_resources"]  # fixtures, re-exported for pytest

pytestmark = pytest.mark.integration

TEAMS = {
    "teams": {
        "vision": {"principals": ["AROAEXAMPLEID1234567"], "gpus": 8, "weight": 2},
        "speech": {"principals": ["AROAEXAMPLEID1234567"], "gpus": 4, "borrow": True},
    },
    "fleet": {"max_gpus": 16},
}


@pytest.fixture
def teams_stack(env_stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Stack:
    boto3.client("ssm").put_parameter(Name="/platform/teams", Value=json.dumps(TEAMS), Type="String")
    monkeypatch.setenv("GPUJOBS_TEAMS_PARAMETER", "/platform/teams")
    monkeypatch.setattr(commands, "utc_now", lambda: NOW)
    monkeypatch.setattr(queue, "utc_now", lambda: NOW)
    return env_stack


def add(stack: Stack, n: int, team: str, *, gpus: int = 4, running: bool = False, age: int = 60, **spec: Any) -> Job:
    document = {
        "name": f"{team}-{n}",
        "image": "img:1",
        "command": ["python", "train.py"],
        "instance_types": ["p4d.24xlarge"],
        "gpus_per_node": gpus,
        "team": team,
        "max_runtime_minutes": 120,
        **spec,
    }
    job = stack.store.create(
        Job.submitted(
            job_id=f"j-{n:016x}", spec=validate_spec(document), now=NOW - timedelta(minutes=age), message_id=None
        )
    )
    if not running:
        return stack.store.save(
            job.transition(JobState.QUEUED, Reason.ADMISSION_WAIT, now=NOW, detail="waits", hold_reason="waits")
        )
    attempt = Attempt(
        number=1, started_at=NOW - timedelta(minutes=30), instance_ids=(f"i-{n}",), instance_type="p4d.24xlarge"
    )
    claimed = job.model_copy(update={"admission": Admission(at=NOW - timedelta(minutes=30)), "attempts": (attempt,)})
    launching = claimed.transition(JobState.LAUNCHING, Reason.LAUNCH_STARTED, now=NOW)
    return stack.store.save(launching.transition(JobState.RUNNING, Reason.INSTANCES_LAUNCHED, now=NOW))


def test_quota_shows_each_teams_gpus_against_its_quota_and_the_fleet(
    teams_stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    add(teams_stack, 1, "vision", running=True)
    add(teams_stack, 2, "vision", running=True)
    add(teams_stack, 3, "vision")

    assert main(["quota", "--json"]) == 0

    shown = json.loads(capsys.readouterr().out)
    vision = next(t for t in shown["teams"] if t["team"] == "vision")
    assert (vision["gpus"], vision["own"], vision["quota"], vision["waiting"], vision["weight"]) == (8, 8, 8, 1, 2.0)
    assert vision["by_family"] == {"p4d": 8}
    assert shown["fleet"] == {"gpus": 8, "max_gpus": 16, "drain": False}
    assert main(["quota"]) == 0
    text = capsys.readouterr().out
    assert "vision" in text
    assert "fleet: 8 GPU(s) held (16 at most); 1 job(s) waiting" in text


def test_queue_lists_waiting_jobs_in_the_order_they_start_with_why_and_the_latest_start(
    teams_stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    add(teams_stack, 1, "vision", running=True)
    add(teams_stack, 2, "vision", running=True)
    late = add(teams_stack, 3, "vision", age=10)
    early = add(teams_stack, 4, "vision", age=50)
    urgent = add(teams_stack, 5, "vision", age=5, priority="high")

    assert main(["queue", "--json"]) == 0

    shown = json.loads(capsys.readouterr().out)
    assert [p["job_id"] for p in shown] == [urgent.job_id, early.job_id, late.job_id]
    assert [p["in_team"] for p in shown] == [1, 2, 3]
    assert "its team's quota is in use: vision holds 8 of its 8 GPU(s), it asks 4" in shown[0]["why"]
    # the running jobs end at their 120 min cap at the latest, 90 min from now: two start then
    assert shown[0]["latest_start"] == (NOW + timedelta(minutes=90)).isoformat()
    assert shown[1]["latest_start"] == (NOW + timedelta(minutes=90)).isoformat()
    assert shown[2]["latest_start"] == (NOW + timedelta(minutes=210)).isoformat()


def test_status_of_a_waiting_job_says_its_place_and_why(teams_stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    add(teams_stack, 1, "vision", running=True)
    add(teams_stack, 2, "vision", running=True)
    add(teams_stack, 3, "vision", age=50)
    second = add(teams_stack, 4, "vision", age=10)

    assert main(["status", second.job_id]) == 0

    out = capsys.readouterr().out
    assert "queue     2nd in team vision's queue, 2nd overall: " in out
    assert "starts by" in out


def test_a_team_configuration_the_user_may_not_read_is_said_and_the_queue_shown_without_quotas(
    env_stack: Stack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUJOBS_TEAMS_PARAMETER", "/nobody/wrote/this")
    add(env_stack, 1, "vision")

    assert main(["queue"]) == 0

    captured = capsys.readouterr()
    assert "quotas not shown: cannot read the team configuration /nobody/wrote/this (ParameterNotFound)" in captured.err
    assert "j-0000000000000001" in captured.out
