"""Budget modes and policies: what a scope may launch, and when a policy lapses.

A scope is a team, or "all" for the whole stack. Its policy says how its launches are restricted
(`BudgetMode`) and for which monthly period; a team's launches follow the strictest of its own
policy and the stack-wide one. The alert text that sets a policy is read in `budget_alerts`; the
store that keeps policies is a service port (`BudgetBook`).

Two rules keep a policy from being relaxed by accident. A new alert's policy replaces the stored
one only when it is at least as strict, or when the stored one belongs to an earlier period
(`may_replace`): a late forecast never turns a hold into spot-only within its month, whichever of
two racing functions writes last, because the store applies the rule as a conditional write. And
only a hold is ever lifted early, when the budget has room again (`lifts_early`); spot-only after
a forecast lasts until its period rolls over, since a forecast says nothing a raised limit undoes.

A policy holds a job's launches (`launch_hold`) when it is a hold, and also when it is spot-only
and the job may launch on on-demand only now (an on-demand spec, or a spot-first one past
`max_interruptions`): such a job waits, QUEUED with the reason, until the policy allows a market,
rather than failing for a market its spec never lacked.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime
from enum import StrEnum

from gpujobs.contract import ALL_TEAMS_SCOPE, budget_name
from gpujobs.domain.job import Job
from gpujobs.domain.spec import TEAM_PATTERN

ALL_SCOPE = ALL_TEAMS_SCOPE
"""The scope of the stack-wide budget; a team can never be called this."""


class BudgetMode(StrEnum):
    NORMAL = "normal"
    """Within budget: launches are not restricted."""
    SPOT_ONLY = "spot-only"
    """A forecasted breach: launches may use spot only."""
    HOLD = "hold"
    """An actual breach: no launches; running jobs of the scope are checkpointed and stopped."""


_SEVERITY = {BudgetMode.NORMAL: 0, BudgetMode.SPOT_ONLY: 1, BudgetMode.HOLD: 2}


@dataclass(frozen=True)
class BudgetPolicy:
    scope: str
    """A team name, or "all"."""
    mode: BudgetMode
    reason: str = ""
    period: str = ""
    """The budget period the mode applies to (e.g. 2026-11); it lapses when the period rolls over."""
    since: datetime | None = None


def replaceable_modes(mode: BudgetMode) -> tuple[BudgetMode, ...]:
    """The stored modes a new policy of `mode` may replace within the same period: those no stricter."""
    return tuple(m for m in BudgetMode if _SEVERITY[m] <= _SEVERITY[mode])


def may_replace(stored: BudgetPolicy, new: BudgetPolicy) -> bool:
    """Whether `new` may overwrite `stored`: it is at least as strict, or `stored` is of an earlier period.

    Periods compare as text (`2026-11` < `2026-12`), exactly as the store's conditional write
    compares them; a stored policy without a period is only ever replaced by one at least as strict.
    """
    return stored.mode in replaceable_modes(new.mode) or (bool(stored.period) and new.period > stored.period)


def lifts_early(policy: BudgetPolicy) -> bool:
    """Whether the policy may be lifted before its period rolls over, once the budget has room again."""
    return policy.mode is BudgetMode.HOLD


def lifted(policy: BudgetPolicy) -> BudgetPolicy:
    """The scope's policy once `policy` is lifted: NORMAL, which any later alert may replace."""
    return BudgetPolicy(scope=policy.scope, mode=BudgetMode.NORMAL)


def hold_over(team: str, policies: Iterable[BudgetPolicy]) -> BudgetPolicy | None:
    """The hold among `policies` that covers a team's jobs (its own scope's, or the stack-wide one)."""
    return next((p for p in policies if p.mode is BudgetMode.HOLD and p.scope in (team, ALL_SCOPE)), None)


def launch_hold(job: Job, policy: BudgetPolicy, *, now: datetime) -> str | None:
    """Why `policy` (the strictest over the job's team) holds the job's next launch; None when it does not.

    A hold holds every launch. Spot-only holds a launch whose spec allows a market now but not
    spot: the job waits for the policy to lapse instead of failing with no market. A job whose
    spec allows no market at all (a spot job past `max_interruptions`) is not held: it has failed.
    The reason names the policy only, so that it reads the same on every tick while it holds.
    """
    if policy.mode is BudgetMode.HOLD:
        return f"budget hold ({policy.scope}): {policy.reason}".strip()
    if policy.mode is not BudgetMode.SPOT_ONLY:
        return None
    # Launch-only modules, loaded only while a spot-only policy is in force (every handler imports this one).
    from gpujobs.domain.ladder import job_markets

    if not job_markets(job, now=now) or job_markets(job, now=now, spot_only=True):
        return None
    return f"budget spot-only ({policy.scope}): {policy.reason}; this job may launch on on-demand only".strip()


def strictest(policies: Iterable[BudgetPolicy | None], team: str) -> BudgetPolicy:
    """The most restrictive of the team's own policy and the stack-wide one ("all")."""
    found = [p for p in policies if p is not None]
    if not found:
        return BudgetPolicy(scope=team, mode=BudgetMode.NORMAL)
    return max(found, key=lambda p: _SEVERITY[p.mode])


def scope_of_budget(name: str, *, stack_name: str) -> str | None:
    """The scope a budget governs in this stack: "all", a team, or None for budgets not ours.

    The stack names its budgets `gpujobs-<stack>-all` and `gpujobs-<stack>-team-<team>`. Anything
    else (another stack's, the account's own) is ignored. A team called "all" is refused, so that
    a team's budget can never set the stack-wide policy.
    """
    if not stack_name:
        return None
    if name == budget_name(stack_name, ALL_SCOPE):
        return ALL_SCOPE
    prefix = budget_name(stack_name, "")  # gpujobs-<stack>-team-
    team = name.removeprefix(prefix)
    if team in (name, ALL_SCOPE) or re.fullmatch(TEAM_PATTERN, team) is None:
        return None
    return team


# ---- budget periods -----------------------------------------------------------------------

_PERIOD = re.compile(r"(?P<year>\d{4})-(?P<month>0[1-9]|1[0-2])")


def period_of(d: date) -> str:
    """The monthly budget period a (UTC) day falls in: `2026-11`."""
    return f"{d.year:04d}-{d.month:02d}"


def period_rolled_over(policy_period: str, today: date) -> bool:
    """Whether `today` is in a later period than the policy's, so the policy has lapsed.

    A policy without a period never lapses by the calendar, and a clock that reads an earlier
    period than the policy's does not lapse it either. A malformed period is a ValueError, not a
    guess either way: lifting a hold and keeping one forever are both wrong.
    """
    if not policy_period:
        return False
    if _PERIOD.fullmatch(policy_period) is None:
        raise ValueError(f"budget period {policy_period!r} is not YYYY-MM")
    return period_of(today) > policy_period
