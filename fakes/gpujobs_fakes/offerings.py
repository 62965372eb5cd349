"""Where instance types are offered, in memory: the offerings port (`service.offerings`) for tests.

Like the adapter, it answers for the types asked about only, an empty set for a type no zone offers
and nothing for a type it was never told about (undescribed: `domain.offerings.offered` lets it be
tried). `asked` records each call's types, so a test can see a ladder walk asked once.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field


@dataclass
class FakeOfferings:
    """`zones`: instance type -> the zones offering it; a type missing is undescribed."""

    zones: dict[str, frozenset[str]] = field(default_factory=dict)
    asked: list[frozenset[str]] = field(default_factory=list)

    def zones_offering(self, instance_types: Collection[str]) -> dict[str, frozenset[str]]:
        self.asked.append(frozenset(instance_types))
        return {name: self.zones[name] for name in instance_types if name in self.zones}

    def offer(self, instance_type: str, *zones: str) -> None:
        """From now on, exactly `zones` offer `instance_type` (none: it is offered nowhere here)."""
        self.zones[instance_type] = frozenset(zones)
