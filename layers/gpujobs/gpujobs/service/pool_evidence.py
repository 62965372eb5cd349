"""The port of the stack's spot evidence: every reclaim its jobs met, per pool (`domain.pools`).

Deployed, it is a few items of the jobs table (`adapters.pool_evidence`); in tests and the local
cloud, `gpujobs_fakes.memory.InMemoryPoolEvidence`. A stack wired without one ranks each launch by
its own job's record only.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gpujobs.domain.pools import Reclaim


class PoolEvidence(Protocol):
    """The stack's own spot reclaims, per pool, that rank the ladder's zones (`domain.pools`)."""

    def record(self, reclaims: Sequence[Reclaim]) -> None:
        """Keep these reclaims (each job attempt's once, however often recorded)."""

    def recent(self, *, now: datetime) -> list[Reclaim]:
        """The reclaims recorded within `domain.pools.HORIZON` before `now`."""
        ...


class NoEvidence:
    """A stack that records no evidence: each launch ranks by its own job's record only."""

    def record(self, reclaims: Sequence[Reclaim]) -> None:
        pass

    def recent(self, *, now: datetime) -> list[Reclaim]:  # noqa: ARG002 - nothing is recorded
        return []
