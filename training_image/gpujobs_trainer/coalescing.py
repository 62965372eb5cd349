"""One save per warning: what to do at a step boundary, decided the same way on every rank.

A spot warning reaches a job three ways within seconds: the control plane's checkpoint-now
(SSM -> SIGUSR1, to every node, each at its own moment), the IMDS ``instance-action`` notice (on the
reclaimed node only, seen at the next poll) and, at the end, SIGTERM. Acted on one by one, as each
rank's flag came up, they gave a save each (the two-node demo committed steps 196, 197 and 198 in a
row); for a 70 GB checkpoint that is the whole two minutes.
So requests coalesce, and none of them waits:

- A checkpoint-now request starts a save at the next step boundary (it also makes the IMDS watcher
  look at the notice at once). It used to wait up to ``COALESCE_SECONDS`` for a preemption to join
  it first, and a kill in that window lost every step since the last commit.
- A preemption (the notice, SIGTERM) that comes within ``COALESCE_SECONDS`` of a save's start
  joins that save: training stops at once, the save in flight (or just committed) is the
  preemption checkpoint, and the job exits 75. The steps run since that save started (at most
  that window's worth) are trained again by the replacement.
- Any save serves every request that arrived before it started, and a request that arrives
  while a save is in flight is served by that save: either checkpoint is newer than anything the
  requester could have seen committed.
- A later preemption saves once more only if steps ran since the newest save; with none it waits
  for that save to commit (`CheckpointManager.save` skips a step already committed).

The ranks agree by one all_reduce(MAX) per step (reference: training-round2.md §7): preempt, how
long the oldest pending request has waited, rank 0's periodic timer, whether a save is still in
flight on any rank, and whether a save started within the window. The decision is a pure function
of those agreed values, so every rank saves the same step and stops at the same step; requests are
counted before the collective and only those are served, so one arriving during the decision is
kept for the next step.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpujobs_trainer.interruption import StopFlags

COALESCE_SECONDS = 2.0
"""How long after a save starts a preemption joins it rather than saving again. It covers the spread
of one warning's signals (the SSM command over the nodes of a gang, the watcher's extra poll,
SIGTERM); what it costs is the steps trained in it, which the replacement trains again."""


class Verdict(enum.Enum):
    """What every rank does at this step boundary."""

    CONTINUE = "continue"
    """Train on (pending requests may have been served by the save in flight)."""
    SAVE_ON_DEMAND = "on-demand"
    SAVE_PERIODIC = "periodic"
    STOP = "stop"
    """Preempted: save unless this step is already saved, then exit 75."""
    JOIN = "join"
    """Preempted just after a save started: that save is the preemption checkpoint; stop, exit 75."""


@dataclass(frozen=True)
class Agreed:
    """The all-reduced (MAX over ranks) view of one step boundary."""

    preempt: bool
    oldest_request_ms: int
    """Milliseconds the oldest pending request has waited, plus one; 0 when none is pending."""
    periodic_due: bool
    save_in_flight: bool
    fresh_save: bool = False
    """A save started less than ``COALESCE_SECONDS`` ago (on some rank): a preemption joins it."""

    def encode(self) -> list[int]:
        flags = (self.preempt, self.periodic_due, self.save_in_flight, self.fresh_save)
        return [int(flags[0]), self.oldest_request_ms, *(int(flag) for flag in flags[1:])]

    @classmethod
    def decode(cls, values: list[int]) -> Agreed:
        preempt, oldest, periodic, in_flight, fresh = values
        return cls(bool(preempt), oldest, bool(periodic), bool(in_flight), bool(fresh))


def decide(agreed: Agreed, *, step: int, every_steps: int) -> tuple[Verdict, bool]:
    """The verdict for ``step``, and whether the pending requests count as served by it."""
    if agreed.preempt:
        return (Verdict.JOIN if agreed.fresh_save else Verdict.STOP), True
    requested = agreed.oldest_request_ms > 0
    if requested and agreed.save_in_flight:
        return Verdict.CONTINUE, True
    if requested:
        return Verdict.SAVE_ON_DEMAND, True
    if agreed.periodic_due or (every_steps > 0 and step % every_steps == 0):
        return Verdict.SAVE_PERIODIC, True
    return Verdict.CONTINUE, False


class SaveCoordinator:
    """Collects this rank's requests, agrees with the other ranks, and returns the verdict."""

    def __init__(
        self,
        flags: StopFlags,
        *,
        all_reduce_max: Callable[[list[int]], list[int]],
        coalesce_seconds: float = COALESCE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.flags = flags
        self.all_reduce_max = all_reduce_max
        """The trainer's own group's collective (`distributed.ControlGroup.all_reduce_max`)."""
        self.coalesce_seconds = coalesce_seconds
        self.clock = clock
        self.last_save_started: float | None = None
        self.last_save_step: int | None = None

    def at_step(self, step: int, *, periodic_due: bool, every_steps: int, save_in_flight: bool) -> Verdict:
        """Collective: every rank calls it at every step boundary, in the same order."""
        count, oldest = self.flags.pending_requests()  # before the collective: later ones wait a step
        now = self.clock()
        waited_ms = 0 if oldest is None else 1 + max(0, int((now - oldest) * 1000))
        started = self.last_save_started
        fresh = started is not None and now - started < self.coalesce_seconds
        mine = Agreed(self.flags.preempt, waited_ms, periodic_due, save_in_flight, fresh)
        agreed = Agreed.decode(self.all_reduce_max(mine.encode()))
        verdict, served = decide(agreed, step=step, every_steps=every_steps)
        if served:
            self.flags.serve_requests(count)
        return verdict

    def saved(self, step: int, *, started: float) -> None:
        """A save of ``step`` started at ``started`` (and is in flight, or done if it blocked): it
        serves every request that arrived until now, and a preemption within the window joins it."""
        count, _ = self.flags.pending_requests()
        self.flags.serve_requests(count)
        self.last_save_started, self.last_save_step = started, step
