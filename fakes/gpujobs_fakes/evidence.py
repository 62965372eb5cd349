"""The stack's spot evidence in memory (`service.pool_evidence`): reclaims as the DynamoDB adapter
keeps them (one entry per job attempt however often recorded, read back within the horizon), and
placement scores as a table a test sets."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from gpujobs.domain.pools import HORIZON, Reclaim


class InMemoryPoolEvidence:
    def __init__(self) -> None:
        self._reclaims: dict[tuple[tuple[str, str], str], Reclaim] = {}
        self._lock = threading.Lock()
        self.writes = 0

    def record(self, reclaims: Sequence[Reclaim]) -> None:
        with self._lock:
            for r in reclaims:
                self.writes += 1
                self._reclaims[(r.pool, r.key or f"@{r.at.isoformat()}")] = r

    def recent(self, *, now: datetime) -> list[Reclaim]:
        with self._lock:
            return [r for r in self._reclaims.values() if now - HORIZON <= r.at <= now]


@dataclass
class FixedPlacementScores:
    """`scores`: zone -> score for every ask (a zone missing is unscored); `asked` records each ask's
    (types, nodes), so a test can see what a walk asked for."""

    scores: dict[str, int] = field(default_factory=dict)
    asked: list[tuple[tuple[str, ...], int]] = field(default_factory=list)

    def zone_scores(self, instance_types: Sequence[str], *, nodes: int) -> Mapping[str, int]:
        self.asked.append((tuple(instance_types), nodes))
        return dict(self.scores)
