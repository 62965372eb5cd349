"""pytest plugin: the call ledger. Every AWS call a stack principal makes in any test is recorded
and, when the run ends, checked against the rendered template's IAM (tests/iam).

Parallel runs (pytest-xdist): the controller picks one folder before its workers start and each
process writes its own `ledger-<worker>.jsonl` there when its session ends; the controller, whose
session ends after every worker's, reads them all and checks the whole run. A run without xdist is
its own controller. `GPUJOBS_CALL_LEDGER_DIR` names the folder (default: pytest's cache dir,
`call-ledger/`, emptied when a run starts); `--no-call-ledger-check` records without judging.

A call IAM would refuse fails the run, naming the test, the principal, the action, the resource and
the statement it lacks. tests/integration/test_every_call_is_allowed.py runs the flows that matter
most itself, so it proves the same on any subset of the suite.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.iam.recorder import RECORDER, Call, install

LEDGER_DIR_ENV = "GPUJOBS_CALL_LEDGER_DIR"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--no-call-ledger-check", action="store_true", help="record the AWS call ledger but do not check it"
    )


def _worker(config: pytest.Config) -> str | None:
    workerinput = getattr(config, "workerinput", None)
    return None if workerinput is None else str(workerinput["workerid"])


def pytest_configure(config: pytest.Config) -> None:
    install()
    if _worker(config) is None and not os.environ.get(LEDGER_DIR_ENV):
        cache = getattr(config, "cache", None)  # None under -p no:cacheprovider
        if cache is not None:
            folder = Path(str(cache.mkdir("call-ledger")))
            for old in folder.glob("ledger-*.jsonl"):  # the previous run's
                old.unlink()
        else:
            folder = Path(tempfile.mkdtemp(prefix="gpujobs-call-ledger-"))
        os.environ[LEDGER_DIR_ENV] = str(folder)  # workers inherit it


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    RECORDER.test = item.nodeid
    yield
    RECORDER.test = ""


def pytest_sessionfinish(session: pytest.Session) -> None:
    folder = Path(os.environ[LEDGER_DIR_ENV])
    worker = _worker(session.config) or "main"
    with (folder / f"ledger-{worker}.jsonl").open("w", encoding="utf-8") as f:
        for call in RECORDER.calls:
            if call.principal is not None:
                f.write(call.to_json() + "\n")
    if _worker(session.config) is not None or session.config.getoption("--no-call-ledger-check"):
        return
    calls = [Call.from_json(line) for path in sorted(folder.glob("ledger-*.jsonl")) for line in path.open()]
    from tests.iam.check import refusals, summary

    refused = refusals(calls)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"call ledger ({folder}): {summary(calls, refused)}")
        for line in refused:
            reporter.write_line(f"  REFUSED {line}", red=True)
    if refused and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
