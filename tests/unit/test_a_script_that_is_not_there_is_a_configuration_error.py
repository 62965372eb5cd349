"""The launcher checks the training command before torchrun runs it: torchrun would report a worker
that cannot open its script (Python exits 2) as a crash (1), and the job would burn every attempt.
Checked first, it is a configuration error (78) whose words reach the exit report."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpujobs_trainer import CONFIG_ERROR_EXIT_CODE
from gpujobs_trainer.preflight import command_problem


def test_a_python_script_that_is_not_there_is_named_as_python_would(tmp_path: Path) -> None:
    missing = tmp_path / "examples" / "train.py"

    problem = command_problem(["python", "-u", str(missing), "--steps", "600"])

    assert problem == f"python: can't open file {str(missing)!r}: [Errno 2] No such file or directory"


def test_a_program_that_is_not_there_or_cannot_run_is_named(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o644)

    assert command_problem(["no-such-program-gpujobs", "x"]) == "no-such-program-gpujobs: command not found"
    assert command_problem([str(tmp_path / "nope")]) == f"{tmp_path / 'nope'}: No such file or directory"
    assert command_problem([str(script)]) == f"{script}: Permission denied"


@pytest.mark.parametrize(
    "command",
    [
        ["python", "-m", "some.module"],
        ["python", "-c", "print(1)"],
        ["python", "-W", "ignore", "-"],
        [sys.executable, __file__],
        ["sh", "-c", "python nowhere.py"],  # not ours to guess: the shell runs it
    ],
)
def test_what_may_run_is_left_to_run(command: list[str]) -> None:
    assert command_problem(command) is None


def test_the_launcher_exits_78_naming_the_missing_script(tmp_path: Path) -> None:
    missing = tmp_path / "train.py"
    env = {**os.environ, "GPUJOBS_NPROC_PER_NODE": "1", "GPUJOBS_EVENT_BUS": ""}

    done = subprocess.run(
        [sys.executable, "-m", "gpujobs_trainer.launch", "--", "python", str(missing)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == CONFIG_ERROR_EXIT_CODE
    assert f"can't open file {str(missing)!r}" in done.stderr
