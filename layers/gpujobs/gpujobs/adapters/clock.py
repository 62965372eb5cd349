"""The wall clock, in UTC: `service.ports.Clock` for the deployed stack (tests inject their own)."""

from __future__ import annotations

from datetime import UTC, datetime


class UtcClock:
    def now(self) -> datetime:
        return datetime.now(UTC)
