"""Helpers for the training tests: launching the digits job, a fake IMDSv2, comparing states.

Every subprocess has a hard timeout: a distributed job that goes wrong usually hangs instead of
failing, and a hung test must fail, not block the suite.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gpujobs_local.imds import FakeImds

__all__ = ["FakeImds"]  # moved to gpujobs_local.imds; re-exported for the tests that import it here

REPO = Path(__file__).resolve().parents[2]
TRAIN_SCRIPT = REPO / "training_image" / "examples" / "digits" / "train.py"
PYTHON = sys.executable
TOTAL_STEPS = 400
JOB_TIMEOUT = 120.0
_PROGRESS = re.compile(r"\[digits\] step\s+(\d+)/")


def job_env(checkpoint_uri: str, **extra: str) -> dict[str, str]:
    """The environment the bootstrap would give a 2-process single-node job, IMDS off."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUJOBS_", "AWS_"))}
    env.update(
        {
            "GPUJOBS_CHECKPOINT_URI": checkpoint_uri,
            "GPUJOBS_NPROC_PER_NODE": "2",
            "GPUJOBS_JOB_ID": "job-test",
            "GPUJOBS_ATTEMPT": "1",
            "GPUJOBS_IMDS": "off",
            "GPUJOBS_CHECKPOINT_EVERY_MINUTES": "0",
            "GPUJOBS_COLLECTIVE_TIMEOUT_SECONDS": "60",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra)
    return env


@dataclass
class Job:
    """A running ``gpujobs_trainer.launch`` process whose output is collected line by line."""

    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    _reader: threading.Thread | None = None
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def start_reading(self) -> None:
        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                with self._cond:
                    self.lines.append(line.rstrip("\n"))
                    self._cond.notify_all()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()

    def wait_for(self, predicate: Callable[[str], bool], timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for line in self.lines[seen:]:
                    if predicate(line):
                        return line
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and seen == len(self.lines)):
                    raise AssertionError("expected output never came:\n" + self.output)
                self._cond.wait(min(left, 0.2))

    def wait_for_step(self, step: int, timeout: float = 120.0) -> None:
        self.wait_for(lambda line: bool((m := _PROGRESS.search(line)) and int(m.group(1)) >= step), timeout)

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    def finish(self, timeout: float = JOB_TIMEOUT) -> JobResult:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError(f"job hung for {timeout}s:\n{self.output}") from None
        if self._reader is not None:
            self._reader.join(timeout=10)
        return JobResult(exit_code=code, lines=list(self.lines))

    @property
    def output(self) -> str:
        return "\n".join(self.lines[-80:])


@dataclass(frozen=True)
class JobResult:
    exit_code: int
    lines: list[str]

    def events(self, name: str) -> list[dict[str, Any]]:
        # Two ranks share the pipe, so another process's output may share a line with ours.
        found = []
        decoder = json.JSONDecoder()
        for line in self.lines:
            start = line.find('{"event"')
            while start >= 0:  # `print` writes the newline separately: two ranks' records may share a line
                try:
                    record, length = decoder.raw_decode(line[start:])
                except ValueError:
                    start = line.find('{"event"', start + 1)
                    continue
                if record.get("event") == name:
                    found.append(record)
                start = line.find('{"event"', start + length)
        return found

    @property
    def resumed_from(self) -> int:
        return int(self.events("resumed")[0]["step"])

    @property
    def final(self) -> dict[str, Any]:
        finals = self.events("final")
        assert finals, "no final result line:\n" + self.output
        return finals[0]

    @property
    def output(self) -> str:
        return "\n".join(self.lines[-80:])


def start_job(env: Mapping[str, str], *args: str, script: Path = TRAIN_SCRIPT) -> Job:
    """``python -m gpujobs_trainer.launch -- python SCRIPT ARGS`` in its own process group (the
    digits example unless ``script`` names another)."""
    proc = subprocess.Popen(
        [PYTHON, "-m", "gpujobs_trainer.launch", "--", PYTHON, str(script), *args],
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        cwd=REPO,
    )
    job = Job(proc)
    job.start_reading()
    return job


def run_job(env: Mapping[str, str], *args: str, timeout: float = JOB_TIMEOUT, script: Path = TRAIN_SCRIPT) -> JobResult:
    return start_job(env, *args, script=script).finish(timeout)


def commit_of(checkpoint_dir: Path, step: int) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((checkpoint_dir / f"step-{step:08d}" / "COMMIT.json").read_text())
    return data


def recommit(step_dir: Path, **changes: Any) -> None:
    """Rewrite a step's COMMIT.json so that it vouches for the files there now (names, sizes and
    SHA-256), with ``changes`` to its other fields: what anyone who can write the folder can forge."""
    marker_path = step_dir / "COMMIT.json"
    marker = json.loads(marker_path.read_text())
    marker["files"] = [
        {"name": p.name, "size": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        for p in sorted(step_dir.iterdir())
        if p.name != marker_path.name
    ]
    marker.update(changes)
    marker_path.write_text(json.dumps(marker))


def committed_steps(checkpoint_dir: Path) -> list[int]:
    return sorted(int(p.parent.name[5:]) for p in checkpoint_dir.glob("step-*/COMMIT.json"))


def assert_bit_identical(dump_a: Path, dump_b: Path) -> None:
    """Model weights, optimizer moments and LR schedule of two runs are exactly equal."""
    a = torch.load(dump_a, weights_only=True)
    b = torch.load(dump_b, weights_only=True)
    assert a["model"].keys() == b["model"].keys()
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), f"weight {name} differs"
    state_a, state_b = a["optimizer"]["state"], b["optimizer"]["state"]
    assert state_a, "optimizer state missing"
    assert state_a.keys() == state_b.keys()
    for index in state_a:
        assert state_a[index].keys() == state_b[index].keys()
        for key in state_a[index]:
            assert torch.equal(state_a[index][key], state_b[index][key]), f"optimizer {index}.{key} differs"
    assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]
    assert a["scheduler"] == b["scheduler"]
