"""What the platform team allots: each team's GPU quota, fair-share weight and borrowing, and the
fleet's cap and drain switch (the team configuration, docs/deploy.md "Quotas and fair share").

```json
{"teams": {"vision": {"principals": ["AROA..."], "gpus": 16, "gpus_by_family": {"p5": 8},
                      "weight": 2, "borrow": true, "lend": true, "max_priority": "high"}},
 "fleet": {"max_gpus": 64, "drain": false}}
```

A team without `gpus` has no quota (it is limited only by the fleet's cap); a stack without a
configuration has neither, as before quotas existed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpujobs.domain.spec_parts import Priority

QUOTA_FIELDS = frozenset({"gpus", "gpus_by_family", "weight", "borrow", "lend", "max_priority", "paused"})
MAX_GPUS = 1_000_000


class QuotaConfigError(ValueError):
    """A quota field is malformed; the message names it (`teams.<team>.<field>`, `fleet.<field>`)."""


@dataclass(frozen=True)
class TeamQuota:
    gpus: int | None = None
    """GPUs the team's jobs may hold at once of its own; None: no quota."""
    gpus_by_family: Mapping[str, int] = field(default_factory=dict)
    """Within `gpus`, at most this many in gangs of each named instance family (`p5`, `g6e`)."""
    weight: float = 1.0
    """Its share when teams compete (`domain.admission`): GPUs held per unit of weight are evened out."""
    borrow: bool = False
    """It may run jobs beyond its quota on other teams' idle quota (preemptible when they want it back)."""
    lend: bool = True
    """Its idle quota may be borrowed by teams that borrow."""
    max_priority: Priority = Priority.HIGH
    paused: bool = False
    """No new admissions for the team; its admitted jobs go on."""


@dataclass(frozen=True)
class FleetPolicy:
    max_gpus: int | None = None
    """GPUs the whole stack may hold at once (what the account's quotas allow); None: no cap."""
    drain: bool = False
    """No new admissions at all; admitted jobs go on (relaunches and replacements included)."""


def parse_team_quota(where: str, entry: Mapping[str, Any]) -> TeamQuota:
    gpus = entry.get("gpus")
    if gpus is not None:
        gpus = _whole(gpus, f"{where}.gpus")
    families = entry.get("gpus_by_family", {})
    if not isinstance(families, dict) or not all(isinstance(k, str) and k for k in families):
        raise QuotaConfigError(
            f"{where}.gpus_by_family: expected a mapping of instance family to GPUs, e.g. {{'p5': 8}}"
        )
    by_family = {family: _whole(v, f"{where}.gpus_by_family.{family}") for family, v in families.items()}
    weight = entry.get("weight", 1)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight) or weight <= 0:
        raise QuotaConfigError(f"{where}.weight: expected a number above 0")
    priority = entry.get("max_priority", Priority.HIGH.value)
    if priority not in {p.value for p in Priority}:
        raise QuotaConfigError(f"{where}.max_priority: expected one of {', '.join(p.value for p in Priority)}")
    return TeamQuota(
        gpus=gpus,
        gpus_by_family=by_family,
        weight=float(weight),
        borrow=_flag(entry, "borrow", where, default=False),
        lend=_flag(entry, "lend", where, default=True),
        max_priority=Priority(priority),
        paused=_flag(entry, "paused", where, default=False),
    )


def parse_fleet(entry: Any) -> FleetPolicy:
    if entry is None:
        return FleetPolicy()
    if not isinstance(entry, dict) or not set(entry) <= {"max_gpus", "drain"}:
        raise QuotaConfigError('fleet: expected {"max_gpus": <GPUs>, "drain": <true|false>}')
    cap = entry.get("max_gpus")
    return FleetPolicy(
        max_gpus=None if cap is None else _whole(cap, "fleet.max_gpus"),
        drain=_flag(entry, "drain", "fleet", default=False),
    )


def _whole(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_GPUS:
        raise QuotaConfigError(f"{where}: expected a whole number of GPUs from 0 to {MAX_GPUS}")
    return value


def _flag(entry: Mapping[str, Any], name: str, where: str, *, default: bool) -> bool:
    value = entry.get(name, default)
    if not isinstance(value, bool):
        raise QuotaConfigError(f"{where}.{name}: expected true or false")
    return value
