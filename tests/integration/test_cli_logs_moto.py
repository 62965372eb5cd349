"""`gpujobs logs` and the log tail of `gpujobs status`, against moto's CloudWatch Logs.

Streams are written as the nodes write them (`contract.job_log_stream`), jobs as the control plane
records them; the CLI only reads both.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from gpujobs.adapters.dynamodb import DynamoJobStore
from gpujobs.contract import bootstrap_log_stream, job_log_group, job_log_stream
from gpujobs.domain.job import Attempt, Job
from gpujobs.domain.spec import load_spec
from gpujobs.domain.states import JobState, Reason
from gpujobs_cli import commands
from gpujobs_cli.main import main
from gpujobs_local.template import table_definition

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GROUP = job_log_group("gpujobs-test")
JOB = "j-00000000000000aa"
TEAM = "ml-platform"  # examples/digits-2node.yaml's
NOW = datetime.now(UTC).replace(microsecond=0)


@dataclass
class Logs:
    client: Any
    store: DynamoJobStore

    def write(self, stream: str, lines: list[str], *, at: datetime = NOW) -> None:
        self.client.create_log_stream(logGroupName=GROUP, logStreamName=stream)
        events = [{"timestamp": int(at.timestamp() * 1000) + i, "message": line} for i, line in enumerate(lines)]
        self.client.put_log_events(logGroupName=GROUP, logStreamName=stream, logEvents=events)

    def job(self, *attempts: Attempt, state: JobState = JobState.RUNNING, example: str = "digits-2node.yaml") -> Job:
        spec = load_spec((EXAMPLES / example).read_bytes())
        job = self.store.create(Job.submitted(job_id=JOB, spec=spec, now=NOW, message_id=None))
        return self.store.save(job.model_copy(update={"attempts": attempts, "state": state}))


def attempt(number: int, *, ended: bool = False, reason: str | None = None, codes: tuple[int, int] = (0, 0)) -> Attempt:
    instances = (f"i-{number}0000000000000a", f"i-{number}0000000000000b")
    return Attempt(
        number=number,
        started_at=NOW,
        instance_ids=instances,
        ended_at=NOW if ended else None,
        end_reason=reason,
        exit_codes=dict(zip(instances, codes, strict=True)) if ended else {},
    )


@pytest.fixture
def logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[Logs]:
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "GPUJOBS_TABLE": "gpujobs-jobs",
        "GPUJOBS_LOG_GROUP": GROUP,
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "GPUJOBS_QUEUE_URL", "GPUJOBS_STACK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(commands, "utc_now", lambda: NOW)  # NOW is the module's import; the suite may run long after
    with mock_aws():
        ddb = boto3.client("dynamodb")
        ddb.create_table(**table_definition(table_name="gpujobs-jobs"))
        client = boto3.client("logs")
        client.create_log_group(logGroupName=GROUP)
        yield Logs(client, DynamoJobStore(table_name="gpujobs-jobs", client=ddb))


def test_logs_prints_node_0_of_the_newest_attempt_by_default(logs: Logs, capsys: pytest.CaptureFixture[str]) -> None:
    logs.job(attempt(1, ended=True, reason=Reason.CRASHED_RETRYING.value, codes=(1, 0)), attempt(2))
    logs.write(job_log_stream(JOB, 1, 0, team=TEAM), ["attempt 1 node 0"])
    logs.write(job_log_stream(JOB, 2, 0, team=TEAM), ["step 1 loss 2.30", "step 2 loss 2.10"])
    logs.write(job_log_stream(JOB, 2, 1, team=TEAM), ["attempt 2 node 1"])

    assert main(["logs", JOB]) == 0

    assert capsys.readouterr().out == "step 1 loss 2.30\nstep 2 loss 2.10\n"


def test_an_attempt_the_release_before_teams_in_names_ran_is_read_from_its_streams(
    logs: Logs, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given an attempt whose nodes wrote `<job>/<attempt>/<node>`, as the previous release named them
    logs.job(attempt(1))
    logs.write(job_log_stream(JOB, 1, 0, team=None), ["written before the upgrade"])
    logs.write(bootstrap_log_stream(JOB, 1, 0, team=None), ["gpujobs-bootstrap: old"])

    # When its user reads them with this release, then they are found there
    assert main(["logs", JOB]) == 0
    assert capsys.readouterr().out == "written before the upgrade\n"
    assert main(["logs", JOB, "--bootstrap", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stream"] == bootstrap_log_stream(JOB, 1, 0, team=None)


def test_attempt_node_bootstrap_and_since_choose_what_is_printed(
    logs: Logs, capsys: pytest.CaptureFixture[str]
) -> None:
    logs.job(attempt(1, ended=True, reason=Reason.CRASHED_RETRYING.value), attempt(2))
    logs.write(job_log_stream(JOB, 1, 1, team=TEAM), ["an hour ago"], at=NOW - timedelta(hours=1))
    logs.client.put_log_events(
        logGroupName=GROUP,
        logStreamName=job_log_stream(JOB, 1, 1, team=TEAM),
        logEvents=[{"timestamp": int(NOW.timestamp() * 1000), "message": "just now"}],
    )
    logs.write(bootstrap_log_stream(JOB, 1, 1, team=TEAM), ["gpujobs-bootstrap: starting the workload"])

    assert main(["logs", JOB, "--attempt", "1", "--node", "1"]) == 0
    assert capsys.readouterr().out == "an hour ago\njust now\n"
    assert main(["logs", JOB, "--attempt", "1", "--node", "1", "--since", "10m"]) == 0
    assert capsys.readouterr().out == "just now\n"
    assert main(["logs", JOB, "--attempt", "1", "--node", "1", "--bootstrap", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["message"] == "gpujobs-bootstrap: starting the workload"
    assert printed["stream"] == bootstrap_log_stream(JOB, 1, 1, team=TEAM)


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["logs", "j-00000000000000ff"], "no job j-00000000000000ff"),
        (["logs", JOB, "--attempt", "7"], f"{JOB} has no attempt 7 (its attempts: 1)"),
        (["logs", JOB, "--node", "2"], "--node takes 0 to 1, not 2"),
        (["logs", JOB], f"no log yet in {GROUP} for {job_log_stream(JOB, 1, 0, team=TEAM)}"),
        (["logs", JOB, "--since", "soon"], "'soon' is not a duration"),
    ],
)
def test_what_has_no_log_is_one_clear_line(
    logs: Logs, capsys: pytest.CaptureFixture[str], argv: list[str], error: str
) -> None:
    logs.job(attempt(1))

    assert main(argv) != 0

    assert error in capsys.readouterr().err


def test_follow_prints_lines_as_they_come_and_ends_with_the_attempt(
    logs: Logs, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    job = logs.job(attempt(1))
    stream = job_log_stream(JOB, 1, 0, team=TEAM)
    story = iter(["the node starts", "it prints", "the attempt ends"])

    def time_passes(_seconds: float) -> None:
        step = next(story)
        if step == "the node starts":
            logs.write(stream, ["step 1"])
        elif step == "it prints":
            logs.client.put_log_events(
                logGroupName=GROUP,
                logStreamName=stream,
                logEvents=[{"timestamp": int(time.time() * 1000), "message": "step 2"}],
            )
        else:
            logs.client.put_log_events(
                logGroupName=GROUP,
                logStreamName=stream,
                logEvents=[{"timestamp": int(time.time() * 1000) + 1, "message": "done"}],
            )
            current = logs.store.get(job.job_id)
            ended = current.attempts[0].model_copy(update={"ended_at": NOW, "end_reason": "completed"})
            logs.store.save(current.model_copy(update={"attempts": (ended,)}))

    monkeypatch.setattr(commands, "sleep", time_passes)

    assert main(["logs", JOB, "--follow"]) == 0

    captured = capsys.readouterr()
    assert captured.out == "step 1\nstep 2\ndone\n"
    assert f"waiting for {stream} to start" in captured.err


def test_follow_stopped_with_ctrl_c_prints_no_traceback(
    logs: Logs, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    logs.job(attempt(1))
    logs.write(job_log_stream(JOB, 1, 0, team=TEAM), ["step 1"])

    def ctrl_c(_seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(commands, "sleep", ctrl_c)

    assert main(["logs", JOB, "--follow"]) == 130

    captured = capsys.readouterr()
    assert captured.out == "step 1\n"
    assert "Traceback" not in captured.err


def test_status_of_a_failed_job_shows_the_last_lines_of_the_node_that_failed(
    logs: Logs, capsys: pytest.CaptureFixture[str]
) -> None:
    logs.job(attempt(1, ended=True, reason=Reason.CRASHED_TOO_OFTEN.value, codes=(0, 1)), state=JobState.FAILED)
    logs.write(
        job_log_stream(JOB, 1, 1, team=TEAM), [f"line {i}" for i in range(30)] + ["RuntimeError: CUDA out of memory"]
    )

    assert main(["status", JOB]) == 0

    out = capsys.readouterr().out
    assert f"last lines of attempt 1, node 1 (gpujobs logs {JOB} --attempt 1 --node 1):" in out
    assert out.rstrip().endswith("  RuntimeError: CUDA out of memory")
    assert "  line 21\n" in out
    assert "  line 20\n" not in out


def test_status_of_a_running_job_shows_no_log(logs: Logs, capsys: pytest.CaptureFixture[str]) -> None:
    logs.job(attempt(1))
    logs.write(job_log_stream(JOB, 1, 0, team=TEAM), ["step 1"])

    assert main(["status", JOB]) == 0

    assert "last lines" not in capsys.readouterr().out


def test_log_lines_reach_the_terminal_without_control_characters(
    logs: Logs, capsys: pytest.CaptureFixture[str]
) -> None:
    logs.job(attempt(1))
    logs.write(job_log_stream(JOB, 1, 0, team=TEAM), ["\x1b]0;pwned\x07red\x1b[31m"])

    assert main(["logs", JOB]) == 0

    assert capsys.readouterr().out == "\\x1b]0;pwned\\x07red\\x1b[31m\n"


def test_a_regrouped_gangs_node_is_read_from_its_newest_generation(
    logs: Logs, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 21: after a regroup, node K of the gang's generation g writes `.../K/g<g>`; the first gang's
    stream keeps what was printed before the warning."""
    logs.job(attempt(1).model_copy(update={"generation": 2}))
    logs.write(job_log_stream(JOB, 1, 1, team=TEAM), ["before the warning"])
    logs.write(job_log_stream(JOB, 1, 1, team=TEAM, generation=2), ["resumed in the regrouped gang"])
    logs.write(bootstrap_log_stream(JOB, 1, 1, team=TEAM), ["gpujobs-bootstrap: the gang regroups as generation 2"])

    assert main(["logs", JOB, "--node", "1"]) == 0
    assert capsys.readouterr().out == "resumed in the regrouped gang\n"
    assert main(["logs", JOB, "--node", "1", "--bootstrap", "--json"]) == 0  # a survivor keeps its first stream
    assert json.loads(capsys.readouterr().out)["stream"] == bootstrap_log_stream(JOB, 1, 1, team=TEAM)
