"""The ports of the spot evidence that ranks a ladder's zones (`domain.pools`).

`PoolEvidence`: every reclaim the stack's jobs met, per pool. Deployed, a few items of the jobs
table (`adapters.pool_evidence`); in tests and the local cloud, `gpujobs_fakes.evidence`. A stack
wired without one ranks each launch by its own job's record only.

`PlacementScores`: EC2's spot placement score of each zone for a job's types and node count.
Deployed, GetSpotPlacementScores, cached (`adapters.placement_scores`); in tests,
`gpujobs_fakes.evidence.FixedPlacementScores`. Without one, no zone is scored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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


class PlacementScores(Protocol):
    """EC2's forecast of spot capacity per zone of the stack's region (`domain.pools.rank`)."""

    def zone_scores(self, instance_types: Sequence[str], *, nodes: int) -> Mapping[str, int]:
        """Zone name -> score (1 to 10, higher is likelier to launch and last) for `nodes` instances
        of any of `instance_types`; a zone left out was not scored. Never raises: no answer is {}."""
        ...


class NoPlacementScores:
    """A stack that asks EC2 for no scores: zones keep the order of their reclaims and subnets."""

    def zone_scores(self, instance_types: Sequence[str], *, nodes: int) -> Mapping[str, int]:  # noqa: ARG002
        return {}
