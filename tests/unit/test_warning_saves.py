"""The judge of what a spot warning may save (tests/warning_saves.py) accepts every timing the
trainer's coalescing allows and nothing else."""

from __future__ import annotations

import pytest

from tests.warning_saves import warning_saves_problem


@pytest.mark.parametrize(
    ("commits", "stopped_at"),
    [
        ([(40, "periodic"), (57, "preempted")], 57),  # the warning's one save
        ([(40, "periodic")], 40),  # the preemption joined the periodic save just started
        ([(40, "periodic"), (44, "on-demand")], 44),  # it joined checkpoint-now's save
        ([(40, "periodic"), (44, "on-demand"), (52, "preempted")], 52),  # it came later than the window
    ],
)
def test_what_one_warning_may_save(commits: list[tuple[int, str]], stopped_at: int) -> None:
    assert warning_saves_problem(commits, stopped_at) is None


@pytest.mark.parametrize(
    ("commits", "stopped_at", "wrong"),
    [
        ([], 0, "committed nothing"),
        ([(40, "periodic"), (57, "preempted")], 40, "not on its newest commit"),
        ([(40, "periodic"), (44, "on-demand"), (48, "on-demand"), (52, "preempted")], 52, "more saves"),
        ([(40, "periodic"), (44, "preempted"), (52, "on-demand")], 52, "not the last commit"),
        ([(40, "periodic"), (44, "final")], 44, "unexpected reason"),
    ],
)
def test_what_no_warning_saves(commits: list[tuple[int, str]], stopped_at: int, wrong: str) -> None:
    problem = warning_saves_problem(commits, stopped_at)
    assert problem is not None
    assert wrong in problem
