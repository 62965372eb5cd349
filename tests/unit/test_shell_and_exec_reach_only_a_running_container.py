"""Stories of `gpujobs shell` and `gpujobs exec`: into the container of node K of a running job,
through the stack's SSM documents, with the argv carried as data and never as shell text.

SSM is a stub that records each request (moto's Session Manager support is limited); the job is
read from an in-memory store; the session-manager-plugin is a recorded argv, never run."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpujobs.domain.job import Attempt, Job
from gpujobs.domain.spec import load_spec
from gpujobs.domain.states import JobState
from gpujobs_cli import shell
from gpujobs_cli.main import main
from gpujobs_cli.resources import EXEC_DOCUMENT, SHELL_DOCUMENT, TABLE, Resources
from gpujobs_fakes.memory import InMemoryJobStore

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 12, 6, 10, 0, tzinfo=UTC)
JOB_ID = "j-0123456789abcdef"
GANG = ("i-0000000000000000a", "i-0000000000000000b")
SPEC = "name: train\nimage: repo/train:1\ninstance_types: [g5.xlarge]\ncommand: [python, train.py]\nnodes: 2\n"


class InvocationDoesNotExistError(Exception):
    pass


class StubSsm:
    """Records requests; GetCommandInvocation answers 'not yet', then in progress, then `final`."""

    class exceptions:  # noqa: N801 - boto3's attribute name
        InvocationDoesNotExist = InvocationDoesNotExistError

    class meta:  # noqa: N801
        endpoint_url = "https://ssm.us-east-1.amazonaws.com"

    def __init__(self, final: dict[str, Any] | None = None) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.answers: list[dict[str, Any] | None] = [None, {"Status": "InProgress"}, final or {}]

    def start_session(self, **request: Any) -> dict[str, Any]:
        self.requests.append(("StartSession", request))
        return {"SessionId": "alice-0abc", "TokenValue": "token", "StreamUrl": "wss://ssmmessages/alice-0abc"}

    def send_command(self, **request: Any) -> dict[str, Any]:
        self.requests.append(("SendCommand", request))
        return {"Command": {"CommandId": "cmd-1"}}

    def get_command_invocation(self, **request: Any) -> dict[str, Any]:
        self.requests.append(("GetCommandInvocation", request))
        answer = self.answers.pop(0)
        if answer is None:
            raise InvocationDoesNotExistError
        return answer


def running_job(state: JobState = JobState.RUNNING, *, gone: tuple[str, ...] = (), ended: bool = False) -> Job:
    attempt = Attempt(
        number=2, started_at=NOW, instance_ids=GANG, gone=gone, ended_at=NOW if ended else None, end_reason=None
    )
    first = Attempt(number=1, started_at=NOW, instance_ids=("i-0000000000000000f",), ended_at=NOW)
    return Job(
        job_id=JOB_ID, state=state, created_at=NOW, updated_at=NOW, spec=load_spec(SPEC), attempts=(first, attempt)
    )


@pytest.fixture
def cloud(monkeypatch: pytest.MonkeyPatch) -> tuple[InMemoryJobStore, StubSsm, list[list[str]]]:
    store, ssm, ran = InMemoryJobStore(), StubSsm({"Status": "Success", "ResponseCode": 0}), []
    store.create(running_job())
    values = {TABLE: "jobs", SHELL_DOCUMENT: "gpujobs-ShellDocument-X", EXEC_DOCUMENT: "gpujobs-ExecDocument-X"}

    def discover(**_: object) -> Resources:
        found = Resources(stack="gpujobs", region="us-east-1", values=dict(values))
        found._clients["ssm"] = ssm
        return found

    monkeypatch.setattr(shell, "discover", discover)
    monkeypatch.setattr(shell, "_store", lambda _resources: store)
    monkeypatch.setattr(shell, "sleep", lambda _seconds: None)
    monkeypatch.setattr(shell.shutil, "which", lambda name: f"/usr/local/bin/{name}")
    monkeypatch.setattr(shell, "_run_plugin", lambda argv: ran.append(argv) or 0)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return store, ssm, ran


def test_shell_opens_a_session_on_node_ks_instance_with_the_stacks_document_and_its_container(
    cloud: tuple[InMemoryJobStore, StubSsm, list[list[str]]], capsys: pytest.CaptureFixture[str]
) -> None:
    _, ssm, ran = cloud

    code = main(["shell", JOB_ID, "--node", "1"])

    request = {
        "Target": GANG[1],
        "DocumentName": "gpujobs-ShellDocument-X",
        "Parameters": {"containerName": [f"gpujobs-{JOB_ID}-a2"]},
    }
    assert code == 0
    assert ssm.requests == [("StartSession", request)]
    (argv,) = ran
    assert argv[0] == "/usr/local/bin/session-manager-plugin"
    assert json.loads(argv[1]) == {
        "SessionId": "alice-0abc",
        "TokenValue": "token",
        "StreamUrl": "wss://ssmmessages/alice-0abc",
    }
    assert argv[2:5] == ["us-east-1", "StartSession", ""]
    assert json.loads(argv[5]) == request
    assert argv[6] == "https://ssm.us-east-1.amazonaws.com"
    assert f"gpujobs-{JOB_ID}-a2 on {GANG[1]} (node 1)" in capsys.readouterr().err


def test_without_the_plugin_shell_says_where_to_get_it_and_starts_no_session(
    cloud: tuple[InMemoryJobStore, StubSsm, list[list[str]]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, ssm, ran = cloud
    monkeypatch.setattr(shell.shutil, "which", lambda _name: None)

    code = main(["shell", JOB_ID])

    assert code == 2
    error = capsys.readouterr().err
    assert "session-manager-plugin" in error
    assert shell.PLUGIN_INSTALL_URL in error
    assert ssm.requests == []
    assert ran == []


def test_exec_sends_the_argv_as_data_prints_the_output_and_exits_with_the_commands_code(
    cloud: tuple[InMemoryJobStore, StubSsm, list[list[str]]], capsys: pytest.CaptureFixture[str]
) -> None:
    _, ssm, _ = cloud
    ssm.answers[-1] = {
        "Status": "Failed",
        "ResponseCode": 3,
        "StandardOutputContent": "out\n",
        "StandardErrorContent": "err\n",
    }
    argv = ["sh", "-c", "echo $HOME; rm -rf / # not for a shell here", "it's", "--", "--json"]

    code = main(["exec", JOB_ID, "--", *argv])

    (kind, sent), *polls = ssm.requests
    assert kind == "SendCommand"
    assert sent["InstanceIds"] == [GANG[0]]
    assert sent["DocumentName"] == "gpujobs-ExecDocument-X"
    assert sent["Parameters"]["containerName"] == [f"gpujobs-{JOB_ID}-a2"]
    (encoded,) = sent["Parameters"]["argv"]
    assert re.fullmatch(r"[A-Za-z0-9+/]+=*", encoded)
    assert json.loads(base64.b64decode(encoded)) == argv
    assert [p for p, _ in polls] == ["GetCommandInvocation"] * 3
    assert code == 3
    captured = capsys.readouterr()
    assert captured.out == "out\n"
    assert captured.err.startswith("err\n")
    assert "failed: exit code 3" in captured.err


def test_exec_json_gives_the_code_and_both_streams(
    cloud: tuple[InMemoryJobStore, StubSsm, list[list[str]]], capsys: pytest.CaptureFixture[str]
) -> None:
    _, ssm, _ = cloud
    ssm.answers[-1] = {"Status": "Success", "ResponseCode": 0, "StandardOutputContent": "GPU 0\n"}

    code = main(["exec", JOB_ID, "--node", "1", "--json", "--", "nvidia-smi", "-L"])

    assert code == 0
    assert json.loads(capsys.readouterr().out) == {
        "instance_id": GANG[1],
        "node": 1,
        "exit_code": 0,
        "stdout": "GPU 0\n",
        "stderr": "",
        "status": "Success",
    }


def test_a_command_ssm_timed_out_exits_255(
    cloud: tuple[InMemoryJobStore, StubSsm, list[list[str]]], capsys: pytest.CaptureFixture[str]
) -> None:
    _, ssm, _ = cloud
    ssm.answers[-1] = {"Status": "TimedOut", "ResponseCode": -1}

    assert main(["exec", JOB_ID, "--", "sleep", "9999"]) == 255
    assert "timedout: exit code -1" in capsys.readouterr().err


def test_exec_without_a_command_is_a_usage_error_before_any_aws_call(
    cloud: tuple[InMemoryJobStore, StubSsm, list[list[str]]], capsys: pytest.CaptureFixture[str]
) -> None:
    _, ssm, _ = cloud

    assert main(["exec", JOB_ID, "--"]) == 2
    assert "exec needs a command after --" in capsys.readouterr().err
    assert ssm.requests == []


@pytest.mark.parametrize(
    "case",
    [
        (running_job(JobState.SUCCEEDED, ended=True), 0, f"{JOB_ID} is SUCCEEDED: no container of it runs now"),
        (running_job(JobState.QUEUED), 0, f"{JOB_ID} is QUEUED: no container of it runs now"),
        (running_job(gone=(GANG[1],)), 1, f"node 1 of {JOB_ID} ({GANG[1]}) is gone"),
        (running_job(), 2, f"{JOB_ID} runs on 2 node(s): --node takes 0 to 1, not 2"),
    ],
)
def test_there_is_no_shell_where_no_container_runs(
    cloud: tuple[InMemoryJobStore, StubSsm, list[list[str]]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    case: tuple[Job, int, str],
) -> None:
    job, node, says = case
    _, ssm, _ = cloud
    store = InMemoryJobStore()
    store.create(job)
    monkeypatch.setattr(shell, "_store", lambda _resources: store)

    assert main(["shell", JOB_ID, "--node", str(node)]) in (2, 3)
    assert main(["exec", JOB_ID, "--node", str(node), "--", "true"]) in (2, 3)
    assert capsys.readouterr().err.splitlines() == [f"gpujobs: {says}"] * 2
    assert ssm.requests == []


def _document(logical_id: str) -> dict[str, Any]:
    text = (ROOT / "template.yaml").read_text(encoding="utf-8")

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    return dict(yaml.load(text, Loader=Loader)["Resources"][logical_id]["Properties"])


def test_the_exec_document_runs_the_argv_it_decodes_as_argv_and_refuses_anything_but_base64(tmp_path: Path) -> None:
    """The document's own command, run here with `docker` a script that prints its argv."""
    content = _document("ExecDocument")["Content"]
    (step,) = content["mainSteps"]
    (line,) = step["inputs"]["runCommand"]
    allowed = re.compile(content["parameters"]["argv"]["allowedPattern"])
    docker = tmp_path / "docker"
    docker.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    docker.chmod(0o755)
    argv = ["python", "-c", "print('$(reboot)'); import os", "a b", "; reboot"]
    encoded = shell.argv_parameter(argv)

    assert allowed.fullmatch(encoded)
    for hostile in ("a; reboot", "$(reboot)", "YWJj\nreboot", "YW Jj", "`x`"):
        assert not allowed.fullmatch(hostile), hostile
    command = line.replace("{{ containerName }}", f"gpujobs-{JOB_ID}-a2").replace("{{ argv }}", encoded)
    done = subprocess.run(
        ["sh", "-c", command], capture_output=True, text=True, check=False, env={"PATH": f"{tmp_path}:/usr/bin:/bin"}
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["exec", f"gpujobs-{JOB_ID}-a2", *argv]


def test_the_shell_document_only_execs_into_a_gpujobs_container() -> None:
    props = _document("ShellDocument")
    content = props["Content"]
    allowed = re.compile(content["parameters"]["containerName"]["allowedPattern"])

    assert props["DocumentType"] == "Session"
    assert content["sessionType"] == "InteractiveCommands"
    assert list(content["parameters"]) == ["containerName"]
    assert content["properties"]["linux"]["commands"].startswith("docker exec --interactive --tty {{ containerName }} ")
    assert allowed.fullmatch(f"gpujobs-{JOB_ID}-a2")
    for hostile in (f"gpujobs-{JOB_ID}-a2; reboot", f"gpujobs-{JOB_ID}-a2 --privileged", "$(reboot)"):
        assert not allowed.search(hostile), hostile
