"""`gpujobs list --team T` against moto: only team T's jobs, from the same ByState index query, each
with its cost so far; and `status --json` carries that cost too."""

from __future__ import annotations

import json
from datetime import timedelta

import boto3
import pytest

from gpujobs.adapters.dynamodb import job_item
from gpujobs.domain.job import Attempt, Job, Market
from gpujobs.domain.spec import load_spec
from gpujobs.domain.states import JobState, Reason
from gpujobs_cli.main import main
from tests.integration.test_cli_moto import EXAMPLES, NOW, Stack, aws, env_stack, stack_resources

__all__ = ["aws", "env_stack", "stack_resources"]  # fixtures, re-exported for pytest

pytestmark = pytest.mark.integration


def add_team_job(stack: Stack, job_id: str, team: str, *, minutes: int) -> Job:
    text = (EXAMPLES / "digits.yaml").read_text().replace("gpus_per_node: 1", f"gpus_per_node: 1\nteam: {team}")
    job = stack.store.create(
        Job.submitted(job_id=job_id, spec=load_spec(text), now=NOW + timedelta(minutes=minutes), message_id=None)
    )
    held = Attempt(
        number=1,
        started_at=NOW,
        instance_ids=("i-0abc",),
        instance_type="g5.xlarge",
        zone="us-east-1a",
        market=Market.ON_DEMAND,
    )
    later = NOW + timedelta(minutes=minutes)
    running = job.with_attempt(held, now=later).transition(JobState.LAUNCHING, Reason.LAUNCH_STARTED, now=later)
    return stack.store.save(running.transition(JobState.RUNNING, Reason.INSTANCES_LAUNCHED, now=later))


def test_list_team_shows_only_that_teams_jobs(env_stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    for n in range(6):  # more than one page of the index for the other team
        add_team_job(env_stack, f"j-other{n}", "vision", minutes=n)
    add_team_job(env_stack, "j-mine", "ml-platform", minutes=10)

    assert main(["list", "--team", "ml-platform", "--limit", "1"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].split()[6] == "COST"
    assert [r.split()[0] for r in rows[1:]] == ["j-mine"]
    assert rows[1].split()[5].startswith("$")  # on demand: the list price, not an estimate

    assert main(["list", "--team", "vision", "--json"]) == 0
    jobs = json.loads(capsys.readouterr().out)
    assert sorted(j["job_id"] for j in jobs) == [f"j-other{n}" for n in range(6)]
    assert all(j["team"] == "vision" and j["spend"]["cost_usd"] > 0 for j in jobs)


def test_list_team_with_no_jobs_says_so(env_stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    add_team_job(env_stack, "j-other", "vision", minutes=0)

    assert main(["list", "--team", "nlp"]) == 0
    assert capsys.readouterr().out == "no jobs of team nlp in QUEUED, LAUNCHING, RUNNING, INTERRUPTED\n"


def test_status_json_carries_the_cost_so_far(env_stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    add_team_job(env_stack, "j-mine", "ml-platform", minutes=0)

    assert main(["status", "j-mine", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["state"] == "RUNNING"
    assert printed["spend"]["cost_usd"] > 0
    assert printed["spend"]["estimated"] is False
    assert printed["spend"]["paid_gpu_hours"] is None  # only once the job has ended


def test_list_warns_of_a_record_this_cli_cannot_read_and_lists_the_rest(
    env_stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    add_team_job(env_stack, "j-mine", "ml-platform", minutes=0)
    newer = add_team_job(env_stack, "j-newer", "ml-platform", minutes=1)
    item = job_item(newer)
    doc = json.loads(item["doc"]["S"])
    doc["history"][-1]["reason"] = "first-heartbeat-overdue"  # a reason a newer release added
    item["doc"] = {"S": json.dumps(doc)}
    boto3.client("dynamodb", region_name="us-east-1").put_item(TableName=env_stack.table_name, Item=item)

    assert main(["list", "--team", "ml-platform", "--json"]) == 0
    captured = capsys.readouterr()
    assert [j["job_id"] for j in json.loads(captured.out)] == ["j-mine"]
    assert "warning: job j-newer: record unreadable by this release: history.2.reason" in captured.err
