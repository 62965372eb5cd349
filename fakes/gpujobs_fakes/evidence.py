"""The stack's spot evidence in memory (`service.pool_evidence`), as the DynamoDB adapter keeps it:
one entry per job attempt however often it is recorded, read back within the horizon."""

from __future__ import annotations

import threading
from collections.abc import Sequence
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
