"""`gpujobs local up/demo --instance-python PATH` (or `$GPUJOBS_LOCAL_INSTANCE_PYTHON`): the interpreter
each local instance runs the bootstrap with, checked before anything starts. The runs themselves are
in tests/integration/test_local_instances.py and tests/e2e/test_the_bootstrap_runs_on_the_amis_python.py.
"""

from __future__ import annotations

import sys

import pytest

from gpujobs_local.cli import build_parser
from gpujobs_local.demo import main as demo
from gpujobs_local.session import INSTANCE_PYTHON_ENV


def test_the_flag_takes_a_python_that_can_run_the_bootstrap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(INSTANCE_PYTHON_ENV, raising=False)

    assert build_parser().parse_args([]).instance_python is None  # this Python, as before
    assert build_parser().parse_args(["--instance-python", sys.executable]).instance_python == sys.executable


def test_the_environment_names_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(INSTANCE_PYTHON_ENV, sys.executable)

    assert build_parser().parse_args([]).instance_python == sys.executable


@pytest.mark.parametrize("command", ["up", "demo"])
def test_a_python_that_cannot_run_the_bootstrap_is_refused_before_the_cloud_starts(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(INSTANCE_PYTHON_ENV, raising=False)
    argv = ["--instance-python", "/nonexistent/python3"]

    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv) if command == "up" else demo(argv)

    assert exited.value.code == 2
    said = capsys.readouterr().err
    assert "argument --instance-python: instance python '/nonexistent/python3' cannot be run" in said


def test_a_bad_default_from_the_environment_is_refused_too(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(INSTANCE_PYTHON_ENV, "/nonexistent/python3")

    with pytest.raises(SystemExit):
        build_parser().parse_args([])

    assert "instance python '/nonexistent/python3' cannot be run" in capsys.readouterr().err
