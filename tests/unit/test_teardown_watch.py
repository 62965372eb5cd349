"""The launcher ends workers that outlive their reported outcome by the grace, and only those.

Pure: an injected clock, worker list and kill; the outcome files are real files in a folder.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from gpujobs_trainer.outcome import WorkerOutcome, write_outcome
from gpujobs_trainer.teardown import TeardownWatch


class World:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.now = 0.0
        self.alive = [101, 102]
        self.kills: list[tuple[int, int]] = []

    def watch(self, grace: float = 60.0) -> TeardownWatch:
        return TeardownWatch(
            self.folder,
            expected_workers=2,
            torchrun_pid=100,
            grace=grace,
            clock=lambda: self.now,
            workers=lambda pid: list(self.alive) if pid == 100 else [],
            kill=lambda pid, sig: self.kills.append((pid, sig)),
        )

    def report(self, rank: int, code: int = 0) -> None:
        write_outcome(str(self.folder), WorkerOutcome(rank=rank, exit_code=code, reason="succeeded", step=3))


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def test_workers_still_there_a_grace_after_every_report_are_killed(world: World) -> None:
    watch = world.watch()
    world.report(0)
    world.report(1)
    watch.tick()  # sees both reports at t=0
    world.now = 59.0
    watch.tick()
    assert world.kills == []
    world.now = 60.0
    watch.tick()
    assert world.kills == [(101, signal.SIGKILL), (102, signal.SIGKILL)]
    world.now = 200.0
    watch.tick()
    assert len(world.kills) == 2  # once


def test_a_worker_that_has_not_reported_keeps_everyone_alive_however_long(world: World) -> None:
    watch = world.watch()
    world.report(0)
    for world.now in (0.0, 100.0, 10_000.0):
        watch.tick()
    assert world.kills == []


def test_the_grace_counts_from_the_last_report_not_the_first(world: World) -> None:
    watch = world.watch()
    world.report(0)
    watch.tick()
    world.now = 500.0
    world.report(1)  # rank 1 was still saving its final checkpoint
    watch.tick()
    world.now = 530.0
    watch.tick()
    assert world.kills == []
    world.now = 560.0
    watch.tick()
    assert [pid for pid, _ in world.kills] == [101, 102]


def test_workers_that_exited_on_their_own_are_left_alone(world: World) -> None:
    watch = world.watch()
    world.report(0)
    world.report(1)
    watch.tick()
    world.alive = []
    world.now = 61.0
    watch.tick()
    assert world.kills == []
