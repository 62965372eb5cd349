"""Budget scopes: which policy applies to a team's launches."""

from __future__ import annotations

from collections.abc import Iterable

from gpujobs.service.ports import BudgetMode, BudgetPolicy

_SEVERITY = {BudgetMode.NORMAL: 0, BudgetMode.SPOT_ONLY: 1, BudgetMode.HOLD: 2}


def strictest(policies: Iterable[BudgetPolicy | None], team: str) -> BudgetPolicy:
    """The most restrictive of the team's own policy and the stack-wide one ("all")."""
    found = [p for p in policies if p is not None]
    if not found:
        return BudgetPolicy(scope=team, mode=BudgetMode.NORMAL)
    return max(found, key=lambda p: _SEVERITY[p.mode])
