"""A FAILED job whose gang is kept for inspection (`keep_on_failure`): `gpujobs status` says until
when and that it is billed; `gpujobs shell`/`exec` reach its container while the keep lasts, and
say why not once it is over or a cancel released it."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpujobs.domain.job import Attempt, Job, Kept, Market
from gpujobs.domain.spec import load_spec
from gpujobs.domain.states import JobState
from gpujobs_cli import commands, drills, render, shell
from gpujobs_cli.commands import CommandError
from gpujobs_cli.main import main
from gpujobs_fakes.memory import InMemoryJobStore
from tests.unit.test_shell_and_exec_reach_only_a_running_container import GANG, JOB_ID, NOW, SPEC, StubSsm

KEPT_UNTIL = NOW + timedelta(minutes=30)


def a_failed_job(*, released_at: object = None) -> Job:
    attempt = Attempt(
        number=1, started_at=NOW - timedelta(hours=1), instance_ids=GANG, ended_at=NOW, end_reason="crashed"
    )
    kept = Kept(attempt=1, since=NOW, until=KEPT_UNTIL, released_at=released_at)
    spec = load_spec(SPEC + "keep_on_failure: 30m\nmax_attempts: 1\n")
    return Job(
        job_id=JOB_ID, state=JobState.FAILED, created_at=NOW, updated_at=NOW, spec=spec, attempts=(attempt,), kept=kept
    )


def test_status_says_until_when_a_failed_gang_is_kept_and_that_it_is_billed() -> None:
    text = render.job_status(a_failed_job(), now=NOW + timedelta(minutes=5))

    assert "kept      for inspection until 10:30 UTC, billed" in text


def test_status_says_when_the_keep_is_over_or_a_cancel_released_it() -> None:
    over = render.job_status(a_failed_job(), now=KEPT_UNTIL)
    released = render.job_status(a_failed_job(released_at=NOW + timedelta(minutes=3)), now=NOW + timedelta(minutes=5))

    assert "billed" not in over
    assert "kept      for inspection until 2026-12-06 10:30" in over
    assert "over" in over.split("kept      ")[1].splitlines()[0]
    assert "released by a cancel" in released


@pytest.fixture
def kept_gang(monkeypatch: pytest.MonkeyPatch) -> StubSsm:
    store, ssm = InMemoryJobStore(), StubSsm({"Status": "Success", "ResponseCode": 0, "StandardOutputContent": "ok\n"})
    store.create(a_failed_job())
    monkeypatch.setattr(shell, "discover", _discover(ssm))
    monkeypatch.setattr(shell, "_store", lambda _resources: store)
    monkeypatch.setattr(shell, "sleep", lambda _seconds: None)
    monkeypatch.setattr(shell.shutil, "which", lambda name: f"/usr/local/bin/{name}")
    monkeypatch.setattr(shell, "_run_plugin", lambda argv: 0)
    return ssm


def _discover(ssm: StubSsm) -> object:
    from gpujobs_cli.resources import EXEC_DOCUMENT, SHELL_DOCUMENT, TABLE, Resources

    def discover(**_: object) -> Resources:
        values = {TABLE: "jobs", SHELL_DOCUMENT: "gpujobs-ShellDocument-X", EXEC_DOCUMENT: "gpujobs-ExecDocument-X"}
        found = Resources(stack="gpujobs", region="us-east-1", values=values)
        found._clients["ssm"] = ssm
        return found

    return discover


def test_shell_and_exec_reach_the_kept_container_of_a_failed_job_while_the_keep_lasts(
    kept_gang: StubSsm, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(commands, "utc_now", lambda: NOW + timedelta(minutes=10))

    assert main(["shell", JOB_ID, "--node", "1"]) == 0
    assert main(["exec", JOB_ID, "--", "ls", "/tmp"]) == 0

    (_, session), (_, command) = [r for r in kept_gang.requests if r[0] in ("StartSession", "SendCommand")]
    assert (session["Target"], session["Parameters"]["containerName"]) == (GANG[1], [f"gpujobs-{JOB_ID}-a1"])
    assert command["InstanceIds"] == [GANG[0]]


def test_once_the_keep_is_over_there_is_no_shell_and_it_says_why(
    kept_gang: StubSsm, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(commands, "utc_now", lambda: KEPT_UNTIL)

    assert main(["shell", JOB_ID]) == 3
    assert capsys.readouterr().err.strip() == (
        f"gpujobs: {JOB_ID} is FAILED (its keep for inspection is over): no container of it runs now"
    )
    assert kept_gang.requests == []


def test_a_kept_failed_gang_has_nothing_to_drill_though_a_shell_reaches_it() -> None:
    job = a_failed_job().model_copy(
        update={"attempts": (a_failed_job().attempts[0].model_copy(update={"market": Market.SPOT}),)}
    )
    during_the_keep = NOW + timedelta(minutes=10)

    assert shell.find_target(job, node=0, now=during_the_keep).instance_id == GANG[0]
    with pytest.raises(
        CommandError, match=f"{JOB_ID} is FAILED \\(its gang is kept for inspection\\): nothing to interrupt"
    ):
        drills.drill_target(job, node=0, now=during_the_keep)


def test_a_drill_of_a_node_already_gone_is_refused_naming_it() -> None:
    attempt = Attempt(number=1, started_at=NOW, instance_ids=GANG, market=Market.SPOT, gone=(GANG[1],))
    running = Job(
        job_id=JOB_ID, state=JobState.RUNNING, created_at=NOW, updated_at=NOW, spec=load_spec(SPEC), attempts=(attempt,)
    )

    assert drills.drill_target(running, node=0, now=NOW) == GANG[0]
    with pytest.raises(CommandError, match=f"node 1 of {JOB_ID} \\({GANG[1]}\\) is gone"):
        drills.drill_target(running, node=1, now=NOW)
