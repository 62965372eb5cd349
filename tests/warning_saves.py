"""What a spot warning may save, judged from the checkpoints an interrupted attempt committed.

One warning reaches a job three ways (checkpoint-now over SSM, the IMDS notice, SIGTERM) and they
coalesce (`gpujobs_trainer.coalescing`): checkpoint-now saves at once ("on-demand"); a preemption
that comes within `COALESCE_SECONDS` of a save's start joins that save, periodic or on-demand, and
saves nothing more; a later one saves once more ("preempted"). Which of these a run sees depends on
when the signals land, so a story asserts what holds for every timing: the attempt stopped on its
newest commit, the warning made at most two saves, and a "preempted" save is the last.
"""

from __future__ import annotations

from collections.abc import Sequence

WARNING_REASONS = ("on-demand", "preempted")


def warning_saves_problem(commits: Sequence[tuple[int, str]], stopped_at: int) -> str | None:
    """None when `commits` ((step, reason) of one interrupted attempt) are what a warning may leave
    with the attempt stopped at `stopped_at`; otherwise what is wrong."""
    if not commits:
        return "the attempt committed nothing"
    newest = max(step for step, _ in commits)
    if stopped_at != newest:
        return f"the attempt stopped at step {stopped_at}, not on its newest commit {newest}"
    saves = [(step, reason) for step, reason in commits if reason != "periodic"]
    if any(reason not in WARNING_REASONS for _, reason in saves):
        return f"a save of an unexpected reason: {saves}"
    if len(saves) > 2 or len({step for step, _ in saves}) != len(saves):
        return f"more saves than one warning makes: {saves}"
    if any(reason == "preempted" and step != newest for step, reason in saves):
        return f"a preemption save that is not the last commit: {saves}"
    return None
