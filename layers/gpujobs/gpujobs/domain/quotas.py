"""EC2's vCPU quotas: a launch they refuse is not "no capacity", and the job says which one and how to raise it.

EC2 counts running vCPUs per Region against one Service Quotas quota per instance family and market
(on-demand and spot are separate; new accounts often start at 0). Going over the on-demand quota
answers `VcpuLimitExceeded`, over the spot one `MaxSpotInstanceCountExceeded`. No zone has room
where the Region's quota has none, so the walk moves to the next rung as it does for capacity (a spot
refusal may still launch on-demand when the spec allows it), skips the other zones of the refused
type and market, and a job that launches nowhere waits `quota-exceeded` (retried with the capacity
backoff) with a status naming each quota, its value when Service Quotas answers, and the command
that raises it. The codes come from the Service Quotas console (service code `ec2`); a family this
table does not know is named by its letters, never guessed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpujobs.domain.job import LaunchTry, Market

QUOTA_ERROR_CODES = frozenset({"VcpuLimitExceeded", "MaxSpotInstanceCountExceeded"})
"""RunInstances' refusals by a vCPU quota (on-demand and spot)."""
SERVICE_CODE = "ec2"


@dataclass(frozen=True)
class Quota:
    code: str
    """The Service Quotas quota code (service `ec2`)."""
    name: str


QUOTAS: Mapping[tuple[str, Market], Quota] = {
    ("G", Market.ON_DEMAND): Quota("L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("P", Market.ON_DEMAND): Quota("L-417A185B", "Running On-Demand P instances"),
    ("Standard", Market.ON_DEMAND): Quota(
        "L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"
    ),
    ("G", Market.SPOT): Quota("L-3819A6DF", "All G and VT Spot Instance Requests"),
    ("P", Market.SPOT): Quota("L-7212CCBC", "All P Spot Instance Requests"),
    ("Standard", Market.SPOT): Quota("L-34B43A08", "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests"),
}
_STANDARD_LETTERS = frozenset("acdhimrtz")


def family(instance_type: str) -> str:
    """The quota family of a type, from the letters before its generation: G (g*, vt*), P (p*),
    Standard (one of A C D H I M R T Z), else those letters (DL, INF, TRN, X...), whose quota this table does not name."""
    lead = re.match(r"[a-z-]*", instance_type.lower())
    letters = lead.group(0) if lead else ""
    if letters.startswith("g") or letters == "vt":
        return "G"
    if letters == "p":
        return "P"
    if len(letters) == 1 and letters in _STANDARD_LETTERS:
        return "Standard"
    return letters.upper() or instance_type


def quota_for(instance_type: str, market: Market) -> Quota | None:
    """The quota that refuses this pool's launches; None for a family this table does not know."""
    return QUOTAS.get((family(instance_type), market))


def is_quota_refusal(error_code: str) -> bool:
    return error_code in QUOTA_ERROR_CODES


def quota_refused_pools(tries: Sequence[LaunchTry]) -> set[tuple[str, Market]]:
    """(type, market) pairs a quota refused: the walk skips their other zones (the quota is the Region's)."""
    return {(t.instance_type, t.market) for t in tries if is_quota_refusal(t.error_code)}


@dataclass(frozen=True)
class QuotaRefusal:
    """One quota that refused a launch, with its value as Service Quotas gave it (None: unknown)."""

    quota: Quota | None
    instance_type: str
    market: Market
    value: float | None = None

    @property
    def label(self) -> str:
        return self.quota.code if self.quota else f"{family(self.instance_type)} {self.market.value}"


def refused_by_quota(tries: Sequence[LaunchTry]) -> list[QuotaRefusal]:
    """Each distinct quota the tries ran into, in the order first met (values not yet known)."""
    found: dict[str, QuotaRefusal] = {}
    for t in tries:
        if is_quota_refusal(t.error_code):
            refusal = QuotaRefusal(quota_for(t.instance_type, t.market), t.instance_type, t.market)
            found.setdefault(refusal.label, refusal)
    return list(found.values())


def raise_command(code: str) -> str:
    return (
        f"aws service-quotas request-service-quota-increase --service-code {SERVICE_CODE}"
        f" --quota-code {code} --desired-value <vCPUs>"
    )


def quota_detail(refusals: Sequence[QuotaRefusal], *, others: str = "") -> str:
    """The waiting job's status: each quota, its value (or that it is unknown), how to raise it.

    Short enough for the record's detail (400 characters) with two quotas: the command is spelled
    out for the first and holds for each code named."""
    parts = []
    for r in refusals:
        value = f"{r.value:g} vCPUs" if r.value is not None else "value unknown (Service Quotas did not answer)"
        if r.quota is None:
            parts.append(f"the EC2 {r.label} vCPU quota of {r.instance_type} (Service Quotas, service ec2)")
        else:
            parts.append(f"{r.quota.name} ({r.quota.code}) = {value}")
    text = "vCPU quota refused the launch: " + "; ".join(parts)
    codes = [r.quota.code for r in refusals if r.quota is not None]
    if codes:
        each = " (the same for each code)" if len(codes) > 1 else ""
        text += f"; raise it: {raise_command(codes[0])}{each}"
    return f"{text}; also {others}" if others else text
