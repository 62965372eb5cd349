"""The offline side of the `gpujobs` CLI, driven through main(argv) as a user would type it:
validate, schema, --help, usage errors and the text views. AWS is never reached here."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from gpujobs.domain.job import Attempt, Job, LaunchTry, Market
from gpujobs.domain.spec import JobSpec, json_schema, load_spec
from gpujobs.domain.states import JobState, Reason
from gpujobs_cli import commands, render
from gpujobs_cli import main as cli_main
from gpujobs_cli.main import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def no_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to find the stack fails the test: these commands must stay offline."""

    def refuse(**kwargs: object) -> None:
        raise AssertionError(f"AWS was contacted: {kwargs}")

    monkeypatch.setattr(commands, "discover", refuse)


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ---- validate ---------------------------------------------------------------------------------
@pytest.mark.usefixtures("no_aws")
def test_validate_accepts_an_example_and_names_it(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["validate", str(EXAMPLES / "digits.yaml")])

    assert code == 0
    assert capsys.readouterr().out == "ok: digits\n"


@pytest.mark.usefixtures("no_aws")
def test_validate_prints_one_line_per_problem_naming_file_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write(
        tmp_path,
        "bad.yaml",
        "name: Digits\nimage: repo/train:1\ncommand: [python]\ninstance_types: [g5.xlarge]\nnodes: 0\n"
        "idle: {for_minutes: 4}\n",
    )

    code = main(["validate", spec])

    lines = capsys.readouterr().out.splitlines()
    assert code == 1
    assert len(lines) == 3
    assert {line.split(": ")[1] for line in lines} == {"name", "nodes", "idle.for_minutes"}
    assert all(line.startswith(f"{spec}: ") for line in lines)


@pytest.mark.usefixtures("no_aws")
def test_validate_checks_the_allow_list_only_when_given(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    digits = str(EXAMPLES / "digits.yaml")

    assert main(["validate", digits]) == 0
    assert main(["validate", digits, "--allowed-instance-types", "g5.xlarge, p5.48xlarge"]) == 1
    out = capsys.readouterr().out
    assert f"{digits}: instance_types: g6.xlarge not in this stack's allow-list" in out


@pytest.mark.usefixtures("no_aws")
def test_validate_reports_a_broken_document_as_a_spec_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write(tmp_path, "broken.json", '{"name": "digits",')

    assert main(["validate", spec]) == 1
    assert capsys.readouterr().out.startswith(f"{spec}: (spec): invalid JSON")


@pytest.mark.usefixtures("no_aws")
def test_validate_reads_standard_input(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    class Stdin:
        buffer = __import__("io").BytesIO((EXAMPLES / "cpu-smoke.json").read_bytes())

    monkeypatch.setattr("sys.stdin", Stdin)

    assert main(["validate", "-"]) == 0
    assert capsys.readouterr().out == "ok: cpu-smoke\n"


@pytest.mark.usefixtures("no_aws")
def test_a_missing_file_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "nope.yaml")

    code = main(["validate", missing])

    err = capsys.readouterr().err
    assert code == 2
    assert err == f"gpujobs: cannot read {missing}: No such file or directory\n"


# ---- submit, offline half ---------------------------------------------------------------------
@pytest.mark.usefixtures("no_aws")
def test_submit_of_an_invalid_spec_sends_nothing_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write(tmp_path, "bad.json", json.dumps({"name": "digits", "image": "a b", "command": []}))

    code = main(["submit", spec])

    captured = capsys.readouterr()
    assert code == 1
    assert captured.out == ""
    problems = captured.err.splitlines()
    assert {p.split(": ")[1] for p in problems} == {"image", "command", "instance_types"}


@pytest.mark.usefixtures("no_aws")
def test_submit_refuses_a_client_token_that_contradicts_the_spec(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = json.loads((EXAMPLES / "cpu-smoke.json").read_text()) | {"client_token": "from-spec"}
    spec = write(tmp_path, "job.json", json.dumps(doc))

    assert main(["submit", spec, "--client-token", "from-flag"]) == 2
    assert "conflicts with the spec's client_token" in capsys.readouterr().err


@pytest.mark.usefixtures("no_aws")
def test_submit_refuses_a_client_token_that_is_too_long(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["submit", str(EXAMPLES / "cpu-smoke.json"), "--client-token", "t" * 65]) == 1
    assert "client_token: " in capsys.readouterr().err


# ---- schema and help --------------------------------------------------------------------------
def test_schema_prints_the_models_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == 0

    out = capsys.readouterr().out
    assert json.loads(out) == json_schema()
    assert out.startswith('{\n  "')


@pytest.mark.parametrize(
    "command",
    [[], ["validate"], ["submit"], ["status"], ["list"], ["cancel"], ["schema"], ["metrics"], ["tensorboard"]],
)
def test_every_command_has_help_with_examples(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*command, "--help"]) == 0

    out = capsys.readouterr().out
    assert out.startswith("usage: gpujobs")
    assert "examples:" in out
    assert "--stack" in out


# ---- gpujobs local: a plugin from the local cloud's package ---------------------------------------
def test_help_mentions_the_local_cloud(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0

    assert "gpujobs local demo | up | tour" in capsys.readouterr().out


def test_local_reaches_the_local_cloud_through_its_entry_point(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["local", "--help"]) == 0

    out = capsys.readouterr().out
    assert out.startswith("usage: gpujobs local {demo,up,tour}")
    assert "tour" in out


@pytest.mark.parametrize("how", ["no-entry-point", "unimportable"])
def test_local_without_the_local_cloud_is_one_line_and_exit_2(
    how: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    offered = {
        "no-entry-point": (),
        "unimportable": (EntryPoint("local", "gpujobs_local_missing.cli:main", cli_main.PLUGIN_GROUP),),
    }[how]
    monkeypatch.setattr(cli_main, "entry_points", lambda **_selection: offered)

    assert main(["local", "demo"]) == 2

    captured = capsys.readouterr()
    assert captured.err == "gpujobs: `gpujobs local` needs a development install of this repository (make setup)\n"
    assert captured.out == ""


@pytest.mark.parametrize(
    "argv",
    [["frobnicate"], [], ["status"], ["list", "--limit", "0"], ["list", "--limit", "many"], ["submit", "x", "--bogus"]],
    ids=["unknown-command", "no-command", "status-without-id", "limit-zero", "limit-not-number", "unknown-option"],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "usage: gpujobs" in capsys.readouterr().err


@pytest.mark.usefixtures("no_aws")
def test_an_unknown_state_is_a_usage_error_before_aws_is_asked(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "--state", "DONE"]) == 2
    assert "unknown state DONE" in capsys.readouterr().err


def test_states_are_case_insensitive_repeatable_and_comma_separated() -> None:
    assert commands.parse_states(None) == [JobState.QUEUED, JobState.LAUNCHING, JobState.RUNNING, JobState.INTERRUPTED]
    assert commands.parse_states(["running,failed", "RUNNING"]) == [JobState.RUNNING, JobState.FAILED]
    assert commands.parse_states(["all"]) == list(JobState)


# ---- the text views ---------------------------------------------------------------------------
def running_job() -> Job:
    spec = load_spec((EXAMPLES / "digits.yaml").read_bytes())
    job = Job.submitted(job_id="j-0123456789abcdef", spec=spec, now=NOW, message_id="m-1")
    start = NOW + timedelta(minutes=1)
    refused = LaunchTry(
        at=start,
        instance_type="g5.xlarge",
        zone="us-east-1a",
        subnet_id="subnet-1",
        market=Market.SPOT,
        error_code="InsufficientInstanceCapacity",
        message="no spot capacity",
    )
    attempt = Attempt(number=1, started_at=start, tries=(refused,))
    job = job.with_attempt(attempt, now=start).transition(JobState.LAUNCHING, Reason.LAUNCH_STARTED, now=start)
    launched = attempt.model_copy(
        update={
            "instance_ids": ("i-0abc",),
            "instance_type": "g6.xlarge",
            "zone": "us-east-1b",
            "market": Market.SPOT,
            "checkpoint_step": 300,
        }
    )
    later = start + timedelta(minutes=2)
    return job.with_attempt(launched, now=later).transition(
        JobState.RUNNING, Reason.INSTANCES_LAUNCHED, now=later, detail="1 x g6.xlarge in us-east-1b (spot)"
    )


def test_status_view_shows_state_attempts_tries_and_history() -> None:
    text = render.job_status(running_job())

    assert "state     RUNNING" in text
    assert "detail    1 x g6.xlarge in us-east-1b (spot)" in text
    attempts = text.split("attempts:")[1].split("failed launch tries:")[0]
    assert "g6.xlarge" in attempts
    assert "i-0abc" in attempts
    assert "300" in attempts
    assert "InsufficientInstanceCapacity" in text.split("failed launch tries:")[1]
    history = text.split("history:")[1]
    assert "(new)" in history
    assert "launch-started" in history
    assert "instances-launched" in history
    assert "2025-06-01 12:03:00Z" in history


def test_status_view_of_a_rejected_job_lists_its_problems() -> None:
    job = Job.rejected(job_id="j-1", problems=["nodes: too many", "name: bad"], excerpt="{}", now=NOW, message_id="m-2")

    text = render.job_status(job)

    assert "state     REJECTED" in text
    assert "problems:\n  nodes: too many\n  name: bad" in text


def test_list_view_is_a_table_with_a_truncated_detail() -> None:
    spec = JobSpec.model_validate(json.loads((EXAMPLES / "cpu-smoke.json").read_text()))
    job = Job.submitted(job_id="j-2", spec=spec, now=NOW, message_id=None).model_copy(
        update={"status_detail": "x" * 200}
    )

    lines = render.job_list([running_job(), job]).splitlines()

    assert lines[0].split() == ["JOB", "ID", "NAME", "TEAM", "STATE", "ATTEMPT", "UPDATED", "DETAIL"]
    assert lines[1].split()[:5] == ["j-0123456789abcdef", "digits", "default", "RUNNING", "1"]
    assert lines[2].split()[:5] == ["j-2", "cpu-smoke", "default", "QUEUED", "-"]
    assert lines[2].endswith("x" * (render.DETAIL_WIDTH - 3) + "...")
