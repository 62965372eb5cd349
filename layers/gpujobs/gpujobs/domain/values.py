"""The small values the job record is built from: frozen models, capped text, markets, admissions."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict

MAX_DETAIL_CHARS = 400
"""Longest free text kept (EC2's capacity messages run to about 300 characters)."""


def cap_detail(text: str) -> str:
    return text if len(text) <= MAX_DETAIL_CHARS else text[: MAX_DETAIL_CHARS - 1] + "…"


Detail = Annotated[str, AfterValidator(cap_detail)]


class Market(StrEnum):
    SPOT = "spot"
    ON_DEMAND = "on-demand"


class Frozen(BaseModel):
    """A record value: immutable, and strict about its fields (a stored record is read leniently,
    `domain.records`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Admission(Frozen):
    """A job's share of its team's GPU quota: granted when its turn comes (`domain.admission`), held
    until it ends or is preempted. Its GPUs are the spec's (nodes x GPUs per node)."""

    at: datetime
    borrowed: int = 0
    """GPUs of it beyond its team's own quota, lent by other teams: what preemption may take back."""
    team_ceiling: int | None = None
    """The admitting write required the team's GPUs in use to be at most this (None: no quota)."""
    fleet_ceiling: int | None = None
    """... and the stack's GPUs in use at most this (None: no fleet cap)."""
    detail: str = ""
    """Why it was admitted (its team's use and quota then)."""


class Ledgered(Frozen):
    """What the GPU ledger counts for a record (`domain.ledger`), written with every write of it:
    the next write adds the difference between this and what the record then stands for. A record
    an older release wrote (carrying this verbatim while changing what it holds) is set right by
    the next write of this one."""

    counters: dict[str, int] = {}
    holds: bool = False
    """It held an admission (a CPU job holds one worth no GPUs)."""
