"""One local cloud per story: the real stack on moto, the real handlers, instances as local processes.

`stage` starts a `local_session` in the test's tmp folder, watches every delivery (what the
control plane heard, when), and when the test is over closes the session and checks that nothing
it ran is left: no process group of any instance, no listening moto or fake IMDS port.

A story can change the session's options by parametrizing `session_options`, e.g.
``@pytest.mark.parametrize("session_options", [{"reconcile_every": 3600}], ids=["manual-reconciler"])``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpujobs.domain.job import Attempt, Job
from gpujobs.domain.job_ids import job_id_for
from gpujobs.domain.states import JobState
from gpujobs.service.ports import JobNotFoundError
from gpujobs_local.cloud import Delivery, LocalCloud
from gpujobs_local.instances import InstanceRunner
from gpujobs_local.session import ROOT, LocalSession, local_session
from tests.warning_saves import warning_saves_problem

TRAIN = ROOT / "training_image" / "examples" / "digits" / "train.py"
TYPES = ["g5.12xlarge", "g6.12xlarge"]
_PROGRESS = re.compile(r"\[digits\] step\s+(\d+)/")


def digits_spec(
    *,
    steps: int = 120,
    checkpoint_every: int = 40,
    step_sleep: float = 0.0,
    nodes: int = 1,
    name: str = "digits-e2e",
    team: str = "e2e",
    token: str | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """The digits example as a job spec, short by default, with a fresh client_token."""
    command = [
        "python", str(TRAIN), "--steps", str(steps), "--log-every", "10",
        "--checkpoint-every-steps", str(checkpoint_every),
    ]  # fmt: skip
    if step_sleep:
        command += ["--step-sleep", str(step_sleep)]
    return {
        "name": name,
        "image": "local/gpujobs-train:dev",
        "command": command,
        "nodes": nodes,
        "gpus_per_node": 2,
        "instance_types": list(TYPES),
        "capacity": "spot-first",
        "client_token": token or f"e2e-{uuid.uuid4().hex[:12]}",
        "team": team,
        **overrides,
    }


@dataclass(frozen=True)
class Committed:
    """A `Checkpoint Committed` report as the control plane received it."""

    step: int
    attempt: int
    reason: str
    at: float  # time.monotonic() when the handler got it


@dataclass
class Stage:
    """The session plus what a story needs to watch it: deliveries with times, logs, EC2's view."""

    session: LocalSession
    heard: list[tuple[float, Delivery]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def cloud(self) -> LocalCloud:
        return self.session.cloud

    @property
    def runner(self) -> InstanceRunner:
        return self.session.runner

    def _observe(self, delivery: Delivery) -> None:
        with self._lock:
            self.heard.append((time.monotonic(), delivery))

    # ---- what the control plane heard ------------------------------------------------------------
    def deliveries(self, kind: str | None = None) -> list[tuple[float, Delivery]]:
        with self._lock:
            return [(at, d) for at, d in self.heard if kind is None or d.kind == kind]

    def checkpoints(self, attempt: int | None = None, *, job_id: str | None = None) -> list[Committed]:
        found: list[Committed] = []
        for at, d in self.deliveries("Checkpoint Committed"):
            detail = (d.event or {}).get("detail", {})
            if job_id is not None and detail.get("job_id") != job_id:
                continue
            seen = Committed(int(detail.get("step", -1)), int(detail.get("attempt", 0)), str(detail.get("reason")), at)
            if (attempt is None or seen.attempt == attempt) and all(
                (c.step, c.attempt, c.reason) != (seen.step, seen.attempt, seen.reason) for c in found
            ):
                found.append(seen)
        return found

    def preemption_checkpoint(self, job_id: str, attempt: int = 1, timeout: float = 60) -> Committed:
        """The checkpoint an interrupted attempt handed over: the newest commit the control plane
        recorded for it, once it recorded the attempt's exit 75. Fails unless the attempt's saves
        are what one warning may leave (`tests.warning_saves`: the preemption may join a save just
        started instead of saving again). Reports the control plane refused (forged, another job's)
        count for nothing: the record says what was accepted."""

        def recorded() -> Attempt | None:
            found = self.job(job_id).attempt(attempt)
            return found if found is not None and 75 in found.exit_codes.values() else None

        self.wait(f"attempt {attempt}'s exit 75 to be recorded", lambda: recorded() is not None, timeout)
        ended = recorded()
        assert ended is not None
        assert ended.checkpoint_step is not None, f"attempt {attempt} handed over no checkpoint"
        commits = [c for c in self.checkpoints(attempt, job_id=job_id) if c.step <= ended.checkpoint_step]
        problem = warning_saves_problem([(c.step, c.reason) for c in commits], ended.checkpoint_step)
        assert problem is None, problem
        (newest,) = [c for c in commits if c.step == ended.checkpoint_step]
        return newest

    def failed_deliveries(self) -> list[str]:
        return [d.line() for _, d in self.deliveries() if d.error is not None]

    def first_state_change(self, instance_id: str, states: tuple[str, ...]) -> float | None:
        """When the control plane first heard that `instance_id` went into one of `states`."""
        for at, d in self.deliveries("EC2 Instance State-change Notification"):
            detail = (d.event or {}).get("detail", {})
            if detail.get("instance-id") == instance_id and detail.get("state") in states:
                return at
        return None

    # ---- jobs ----------------------------------------------------------------------------------------
    def submit(self, spec: dict[str, Any], *, sender: str | None = None) -> str:
        """Send `spec` as `sender` (None: moto's default user); the id a valid spec's job gets."""
        self.session.send(spec, sender=sender)
        return job_id_for(client_token=spec["client_token"], team=spec["team"], message_id=None)

    def job(self, job_id: str) -> Job:
        return self.session.job(job_id)

    def state(self, job_id: str) -> JobState | None:
        try:
            return self.job(job_id).state
        except JobNotFoundError:
            return None

    def attempt(self, job_id: str, number: int) -> Attempt:
        found = self.job(job_id).attempt(number)
        assert found is not None, f"{job_id} has no attempt {number}"
        return found

    def wait(self, what: str, predicate: Callable[[], bool], timeout: float = 90.0) -> None:
        try:
            self.cloud.wait_until(predicate, timeout=timeout, what=what)
        except TimeoutError as exc:
            problems = self.failed_deliveries()
            raise AssertionError(f"{exc}; failed deliveries: {problems[-5:]}") from None

    def wait_state(self, job_id: str, *states: JobState, timeout: float = 90.0) -> Job:
        self.wait(f"{job_id} to be {'/'.join(s.value for s in states)}", lambda: self.state(job_id) in states, timeout)
        return self.job(job_id)

    def wait_running(self, job_id: str, attempt: int = 1, timeout: float = 60.0) -> Attempt:
        def running() -> bool:
            job = self.job(job_id) if self.state(job_id) is not None else None
            current = job.current_attempt if job else None
            return (
                job is not None and job.state is JobState.RUNNING and current is not None and current.number == attempt
            )

        self.wait(f"{job_id} attempt {attempt} running", running, timeout)
        return self.attempt(job_id, attempt)

    # ---- instances -------------------------------------------------------------------------------------
    def log_text(self, instance_id: str) -> str:
        path = self.runner.log_path(instance_id)
        return path.read_text(errors="replace") if path.exists() else ""

    def progress(self, instance_id: str) -> int:
        """The newest step rank 0 on this instance has printed (-1: none yet)."""
        return max((int(m.group(1)) for m in _PROGRESS.finditer(self.log_text(instance_id))), default=-1)

    def trainer_line(self, instance_id: str, event: str) -> dict[str, Any] | None:
        """The trainer's `{"event": "resumed"|"final", ...}` line in this instance's log, if printed."""
        return next(iter(self.trainer_lines(instance_id, event)), None)

    def trainer_lines(self, instance_id: str, event: str) -> list[dict[str, Any]]:
        """Every such line, in order: one per run of the workload that printed it (a regrouped gang's
        survivor runs it twice)."""
        return [
            json.loads(line)
            for line in self.log_text(instance_id).splitlines()
            if line.startswith("{") and f'"event": "{event}"' in line
        ]

    def ec2_states(self) -> dict[str, str]:
        """Every instance of the stack as EC2 (moto) sees it: id -> state name."""
        ec2 = self.cloud.client("ec2")
        states: dict[str, str] = {}
        for page in ec2.get_paginator("describe_instances").paginate():
            for reservation in page["Reservations"]:
                for inst in reservation["Instances"]:
                    states[inst["InstanceId"]] = inst["State"]["Name"]
        return states

    def live_instances(self) -> list[str]:
        return sorted(i for i, s in self.ec2_states().items() if s not in ("terminated", "stopped"))

    def machine_is_off(self, instance_id: str) -> bool:
        """EC2 says it is gone, the runner emitted its end, and none of its processes runs."""
        inst = self.runner.instances.get(instance_id)
        return (
            self.ec2_states().get(instance_id) in ("terminated", "stopped")
            and inst is not None
            and inst.state in ("terminated", "stopped")
            and not inst.alive
            and not any(_group_alive(g) for g in inst.pgids)
        )

    def wait_nothing_running(self, timeout: float = 60.0) -> None:
        self.wait(
            "every instance of the stack to be off",
            lambda: not self.live_instances() and all(self.machine_is_off(i) for i in self.runner.instances),
            timeout,
        )


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _listening_here(endpoint: str) -> bool:
    """Whether this process still holds a listening socket on the endpoint's port.

    Asking whether anything answers on the port is not enough: once the session frees it, the
    other test worker's next local cloud may be given the same ephemeral port. What the story must
    not leave behind is its own listener, so look for a LISTEN socket on that port among this
    process's open files (the local cloud's servers all run in this process).
    """
    port = urllib.parse.urlparse(endpoint).port or 80
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{inode}]")
    if not inodes:
        return False
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            if os.readlink(fd) in inodes:
                return True
    return False


def fake_nvidia_smi_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> Path:
    """A PATH folder holding `nvidia-smi` as this Python `script`, put first on PATH before `stage`
    starts the cloud (its instances inherit it: docs/instance.md, step 3); the folder."""
    tools = tmp_path / "fake-gpu-tools"
    tools.mkdir()
    smi = tools / "nvidia-smi"
    smi.write_text(f"#!{sys.executable}\n" + script)
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    return tools


@pytest.fixture
def session_options() -> dict[str, Any]:
    return {}


@pytest.fixture
def stage(tmp_path: Path, session_options: dict[str, Any]) -> Iterator[Stage]:
    """A fresh local cloud for one story; afterwards, nothing of it may be left running."""
    saved_env = dict(os.environ)
    with local_session(workdir=tmp_path / "cloud", **session_options) as session:
        watched = Stage(session=session)
        session.cloud.on_delivery(watched._observe)
        endpoints = [session.cloud.endpoint_url]
        try:
            yield watched
        finally:
            endpoints += [inst.imds.endpoint for inst in session.runner.instances.values()]
    with contextlib.suppress(Exception):
        os.environ.clear()
        os.environ.update(saved_env)
    groups = session.runner.process_groups()
    assert groups, "the runner saw no process group: the story never ran an instance?"
    alive = sorted(g for g in groups if _group_alive(g))
    assert not alive, f"process groups still alive after the session closed: {alive}"
    still_listening = [e for e in endpoints if _listening_here(e)]
    assert not still_listening, f"still listening after the session closed: {still_listening}"
