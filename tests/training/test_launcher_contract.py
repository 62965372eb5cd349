"""The launcher's pure parts: environment -> torchrun command line, outcomes -> one exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpujobs_trainer import CONFIG_ERROR_EXIT_CODE, CRASH_EXIT_CODE, PREEMPTED_EXIT_CODE, SUCCESS_EXIT_CODE
from gpujobs_trainer.errors import COMMAND_NOT_EXECUTABLE_EXIT_CODE, COMMAND_NOT_FOUND_EXIT_CODE, ConfigError
from gpujobs_trainer.events import EventBridgePublisher
from gpujobs_trainer.launch import (
    expand_argv,
    plan_from_env,
    python_script,
    regroup_may_follow,
    split_command,
    torchrun_argv,
)
from gpujobs_trainer.outcome import JobOutcome, WorkerOutcome, decide_exit, read_outcomes, write_outcome
from gpujobs_trainer.outputs import tensorboard_env
from gpujobs_trainer.workers import child_pids

COMMAND = ["python", "train.py", "--note", "a; rm -rf / $(whoami)"]


def test_a_single_node_job_uses_a_standalone_rendezvous_and_the_command_as_argv() -> None:
    plan = plan_from_env({"GPUJOBS_JOB_ID": "j1", "GPUJOBS_ATTEMPT": "3"}, COMMAND, gpu_count=0)
    argv = torchrun_argv(plan, python="py")
    assert argv[:3] == ["py", "-m", "torch.distributed.run"]
    assert "--standalone" in argv
    assert argv[argv.index("--nproc-per-node") + 1] == "1"
    assert argv[-len(COMMAND) - 1 :] == ["--no-python", *COMMAND]  # passed through verbatim, no shell


def test_a_multi_node_job_meets_at_the_rank0_ip_with_a_fresh_rendezvous_per_attempt() -> None:
    env = {
        "GPUJOBS_NNODES": "4",
        "GPUJOBS_NODE_RANK": "2",
        "GPUJOBS_MASTER_ADDR": "10.0.0.5",
        "GPUJOBS_MASTER_PORT": "29999",
        "GPUJOBS_JOB_ID": "j1",
        "GPUJOBS_ATTEMPT": "3",
    }
    argv = torchrun_argv(plan_from_env(env, COMMAND, gpu_count=8))

    def value(flag: str) -> str:
        return argv[argv.index(flag) + 1]

    assert (value("--nnodes"), value("--node-rank"), value("--nproc-per-node")) == ("4", "2", "8")
    assert (value("--master-addr"), value("--master-port")) == ("10.0.0.5", "29999")
    assert value("--rdzv-id") == "j1-attempt-3"
    assert "--standalone" not in argv
    assert value("--max-restarts") == "0"


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"GPUJOBS_NNODES": "2"}, "GPUJOBS_MASTER_ADDR"),
        ({"GPUJOBS_NNODES": "2", "GPUJOBS_NODE_RANK": "2", "GPUJOBS_MASTER_ADDR": "h"}, "outside 0..1"),
        ({"GPUJOBS_NPROC_PER_NODE": "two"}, "GPUJOBS_NPROC_PER_NODE must be an integer"),
        ({"GPUJOBS_TEARDOWN_GRACE_SECONDS": "soon"}, "GPUJOBS_TEARDOWN_GRACE_SECONDS must be an integer"),
        ({"GPUJOBS_TEARDOWN_GRACE_SECONDS": "-1"}, "GPUJOBS_TEARDOWN_GRACE_SECONDS must be >= 0 seconds"),
    ],
)
def test_an_inconsistent_launch_environment_is_named(env: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        plan_from_env(env, COMMAND, gpu_count=0)


@pytest.mark.parametrize(("raw", "grace"), [("", 60), ("0", 0), ("5", 5)])
def test_the_teardown_grace_comes_from_the_environment(raw: str, grace: int) -> None:
    assert plan_from_env({"GPUJOBS_TEARDOWN_GRACE_SECONDS": raw}, COMMAND, gpu_count=0).teardown_grace == grace


def test_the_command_is_everything_after_the_double_dash() -> None:
    assert split_command(["--", *COMMAND]) == COMMAND


def _outcomes(*codes: int) -> list[WorkerOutcome]:
    return [WorkerOutcome(rank=i, exit_code=c, reason="x") for i, c in enumerate(codes)]


@pytest.mark.parametrize(
    ("torchrun_code", "codes", "expected"),
    [
        (0, (0, 0), (SUCCESS_EXIT_CODE, "succeeded")),
        (1, (75, 75), (PREEMPTED_EXIT_CODE, "preempted")),  # torchrun says 1 after SIGTERM
        (1, (75,), (CRASH_EXIT_CODE, "crashed")),  # one worker never reported: not a clean save
        (1, (75, 1), (CRASH_EXIT_CODE, "crashed")),
        (1, (78, 78), (CONFIG_ERROR_EXIT_CODE, "config-error")),
        (-9, (), (CRASH_EXIT_CODE, "crashed")),
        (1, (0, 0), (SUCCESS_EXIT_CODE, "succeeded")),  # both reported success, then one died in teardown
        (1, (0,), (CRASH_EXIT_CODE, "crashed")),  # the other worker never reported: it crashed in training
        (1, (0, 1), (CRASH_EXIT_CODE, "crashed")),
    ],
)
def test_worker_outcomes_map_to_one_exit_code(
    torchrun_code: int, codes: tuple[int, ...], expected: tuple[int, str]
) -> None:
    outcome = decide_exit(torchrun_code=torchrun_code, outcomes=_outcomes(*codes), expected_workers=2)
    assert (outcome.exit_code, outcome.reason) == expected


def test_outcome_files_round_trip(tmp_path: Path) -> None:
    write_outcome(str(tmp_path), WorkerOutcome(rank=1, exit_code=75, reason="preempted", step=120))
    assert read_outcomes(tmp_path) == [WorkerOutcome(rank=1, exit_code=75, reason="preempted", step=120)]


def test_the_launcher_finds_the_worker_processes_it_must_signal() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        import os

        assert child.pid in child_pids(os.getpid())
    finally:
        child.kill()
        child.wait()


def test_a_missing_command_exits_with_the_configuration_code() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpujobs_trainer.launch", "--"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == CONFIG_ERROR_EXIT_CODE
    assert "no training command given" in result.stderr


@pytest.mark.parametrize(
    ("program", "code", "line"),
    [
        ("trian.sh", COMMAND_NOT_FOUND_EXIT_CODE, "trian.sh: command not found"),
        ("/no/such/train.sh", COMMAND_NOT_FOUND_EXIT_CODE, "/no/such/train.sh: No such file or directory"),
        ("NOT_EXECUTABLE", COMMAND_NOT_EXECUTABLE_EXIT_CODE, "Permission denied"),
        ("PYTHON", COMMAND_NOT_FOUND_EXIT_CODE, "can't open file '/opt/x/trian.py': No such file or directory"),
    ],
)
def test_a_command_that_cannot_run_exits_as_a_shell_would_with_its_line_last(
    tmp_path: Path, program: str, code: int, line: str
) -> None:
    # given a command whose program (or python's script) is misspelt, missing or not executable
    not_executable = tmp_path / "train.sh"
    not_executable.write_text("#!/bin/sh\n")
    program = str(not_executable) if program == "NOT_EXECUTABLE" else program
    command = [sys.executable, "-u", "/opt/x/trian.py"] if program == "PYTHON" else [program]

    result = subprocess.run(
        [sys.executable, "-m", "gpujobs_trainer.launch", "--", *command, "--steps", "10"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": str(tmp_path), "GPUJOBS_NPROC_PER_NODE": "1"},
    )

    # then the launcher exits with the shell's code, the reason its last line on stderr
    assert result.returncode == code, result.stderr
    assert result.stderr.strip().splitlines()[-1].endswith(line)
    assert "torch.distributed.run" not in result.stderr


class _BrokenEvents:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def put_events(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(kwargs)
        raise ConnectionError("bus is down")


def test_a_failing_event_bus_is_logged_never_raised(caplog: pytest.LogCaptureFixture) -> None:
    client = _BrokenEvents()
    publisher = EventBridgePublisher("bus", client=client)
    publisher.publish("Training Heartbeat", {"step": 1})
    publisher.close()
    entry = client.calls[0]["Entries"][0]
    assert entry["Source"] == "gpujobs.trainer"
    assert json.loads(entry["Detail"]) == {"step": 1}
    assert "bus is down" in caplog.text


@pytest.mark.parametrize(
    ("command", "script"),
    [
        (["python", "train.py", "--steps", "5"], "train.py"),
        (["python3.11", "-u", "-W", "ignore", "-X", "dev", "/opt/t.py"], "/opt/t.py"),
        (["python", "-m", "pkg.train"], None),
        (["python", "-c", "print(1)"], None),
        (["torchrun", "train.py"], None),
    ],
)
def test_the_script_python_would_open_is_found_past_its_options(command: list[str], script: str | None) -> None:
    assert python_script(command) == script


@pytest.mark.parametrize(
    ("nodes", "instance_id", "mode", "code", "bootstrap_reports"),
    [
        ("2", "i-0abc", "gpujobs", PREEMPTED_EXIT_CODE, True),  # a gang may regroup: the bootstrap knows
        ("1", "i-0abc", "gpujobs", PREEMPTED_EXIT_CODE, False),  # one node: nothing to regroup around
        ("2", "", "gpujobs", PREEMPTED_EXIT_CODE, False),  # no bootstrap to start it again
        ("2", "i-0abc", "directory", PREEMPTED_EXIT_CODE, False),  # a script without the library never regroups
        ("2", "i-0abc", "gpujobs", SUCCESS_EXIT_CODE, False),
        ("2", "i-0abc", "gpujobs", CRASH_EXIT_CODE, False),
    ],
)
def test_a_gang_node_stopped_at_a_warning_leaves_its_exit_report_to_the_bootstrap(
    nodes: str, instance_id: str, mode: str, code: int, bootstrap_reports: bool
) -> None:
    """A survivor of another node's warning exits 75 and may be started again in the regrouped gang:
    reported then, its 75 would end an attempt that goes on (`domain.regroup`)."""
    env = {
        "GPUJOBS_NNODES": nodes,
        "GPUJOBS_NODE_RANK": "0",
        "GPUJOBS_MASTER_ADDR": "10.0.0.5",
        "GPUJOBS_JOB_ID": "j1",
        "GPUJOBS_ATTEMPT": "1",
        "GPUJOBS_INSTANCE_ID": instance_id,
        "GPUJOBS_CHECKPOINT_MODE": mode,
    }
    plan = plan_from_env(env, COMMAND, gpu_count=1)

    assert regroup_may_follow(plan, JobOutcome(code, "")) is bootstrap_reports


def test_gpujobs_references_in_the_command_are_expanded_and_nothing_else() -> None:
    """The command is argv, never a shell: a script that takes its folder as an argument gets it
    from `${GPUJOBS_CHECKPOINT_DIR}` without `sh -c` (issue 22), and nothing else is interpreted."""
    env = {"GPUJOBS_CHECKPOINT_DIR": "/var/lib/gpujobs/ckpt", "GPUJOBS_OUTPUT_DIR": "/out", "HOME": "/home/u"}
    command = ["python", "train.py", "--ckpt=${GPUJOBS_CHECKPOINT_DIR}/last", "${GPUJOBS_OUTPUT_DIR}", *COMMAND[2:]]
    command += ["$HOME", "${HOME}", "$GPUJOBS_OUTPUT_DIR", "$${GPUJOBS_OUTPUT_DIR}x"]

    expanded = expand_argv(command, env)

    assert expanded[:4] == ("python", "train.py", "--ckpt=/var/lib/gpujobs/ckpt/last", "/out")
    assert expanded[4:6] == tuple(COMMAND[2:])  # "; rm -rf / $(whoami)" stays one literal argument
    assert expanded[6:] == ("$HOME", "${HOME}", "$GPUJOBS_OUTPUT_DIR", "$/outx")


def test_a_reference_to_a_variable_the_job_does_not_have_is_a_configuration_error() -> None:
    with pytest.raises(ConfigError, match=r"\$\{GPUJOBS_CHEKPOINT_DIR\}, which this job does not set"):
        expand_argv(["python", "train.py", "${GPUJOBS_CHEKPOINT_DIR}"], {"GPUJOBS_CHECKPOINT_DIR": "/ckpt"})

    result = subprocess.run(
        [sys.executable, "-m", "gpujobs_trainer.launch", "--", "python", "train.py", "${GPUJOBS_NOPE}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("GPUJOBS_")},
    )
    assert result.returncode == CONFIG_ERROR_EXIT_CODE
    assert "${GPUJOBS_NOPE}, which this job does not set" in result.stderr.splitlines()[-1]


def test_the_workload_gets_a_tensorboard_folder_inside_its_uploaded_outputs(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"

    given = tensorboard_env({"GPUJOBS_OUTPUT_DIR": str(outputs)})

    assert given == {"GPUJOBS_TB_DIR": str(outputs / "tensorboard")}
    assert (outputs / "tensorboard").is_dir()  # before the workload starts: a SummaryWriter may open it at once
    assert expand_argv(["python", "train.py", "--logdir", "${GPUJOBS_TB_DIR}"], given)[-1] == given["GPUJOBS_TB_DIR"]
    assert tensorboard_env({"GPUJOBS_TB_DIR": str(tmp_path / "mine")}) == {"GPUJOBS_TB_DIR": str(tmp_path / "mine")}
