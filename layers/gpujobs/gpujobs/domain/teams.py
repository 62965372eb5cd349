"""Who may act for which team: the platform team's configuration, and the checks made with it.

A submission names its team; the queue tells who sent it (the SQS `SenderId` attribute: an IAM
unique id, `AROA...:session` for an assumed role, `AIDA...` for a user). The configuration maps each
team to the principals that may act for it and to the team's limits (instance types, nodes, data
buckets). Principals are unique ids, not ARNs: the sender id carries only the unique id, and a role
deleted and re-created under the same name gets a new id, so it does not inherit the old one's
access.

Without a configuration the stack is single-tenant, as it was before teams existed (`TeamDirectory
.open()`): anyone who may send to the queue may use any team name, and only the stack's allow-list
limits a spec. See docs/deploy.md, "Teams".
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpujobs.domain.spec import INSTANCE_TYPE_PATTERN, TEAM_PATTERN, JobSpec
from gpujobs.domain.team_quotas import (
    QUOTA_FIELDS,
    FleetPolicy,
    QuotaConfigError,
    TeamQuota,
    parse_fleet,
    parse_team_quota,
)

UNIQUE_ID_PATTERN = r"^(?:(?:AROA|AIDA)[A-Z0-9]{12,124}|[0-9]{12})$"
"""A role's or user's IAM unique id, or an account id (the account's root user sends as that)."""
BUCKET_PATTERN = r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$"
MAX_NODES = 64


class TeamConfigError(Exception):
    """The team configuration is malformed; the message names the field (`teams.<team>.<field>`)."""


@dataclass(frozen=True)
class TeamPolicy:
    """What one team may do, and who may do it."""

    team: str
    principals: frozenset[str]
    """IAM unique ids (AROA..., AIDA...) or account ids whose messages may act for the team."""
    instance_types: frozenset[str] | None = None
    """The team's own allow-list (within the stack's); None: the stack's allow-list."""
    max_nodes: int = MAX_NODES
    data_buckets: tuple[str, ...] = ()
    """S3 buckets the team's jobs may read training data from."""
    quota: TeamQuota = field(default_factory=TeamQuota)
    """Its GPU quota, fair-share weight, borrowing and highest priority (`domain.team_quotas`)."""

    def admits(self, sender: str | None) -> bool:
        return sender is not None and principal_of(sender) in self.principals

    def problems_with(self, spec: JobSpec) -> list[str]:
        """One line per limit `spec` goes beyond, naming the field."""
        problems = []
        if self.instance_types is not None:
            refused = [t for t in spec.instance_types if t not in self.instance_types]
            if refused:
                problems.append(
                    f"instance_types: {', '.join(refused)} not allowed for team {self.team!r}"
                    f" ({', '.join(sorted(self.instance_types))})"
                )
        if spec.nodes > self.max_nodes:
            problems.append(f"nodes: {spec.nodes} is more than team {self.team!r} may use ({self.max_nodes})")
        if spec.priority.rank > self.quota.max_priority.rank:
            problems.append(
                f"priority: {spec.priority.value} is above team {self.team!r}'s highest ({self.quota.max_priority.value})"
            )
        gpus, quota = spec.nodes * spec.gpus_per_node, self.quota.gpus
        if quota is not None and gpus > quota and not self.quota.borrow:
            problems.append(
                f"gpus_per_node: {spec.nodes} node(s) x {spec.gpus_per_node} GPUs is more than team {self.team!r}'s"
                f" quota ({quota} GPUs) and the team may not borrow: it could never start"
            )
        return problems


def principal_of(sender: str) -> str:
    """The unique id in a SenderId: `AROA...:session` -> `AROA...`."""
    return sender.split(":", 1)[0]


@dataclass(frozen=True)
class TeamDirectory:
    """Every team's policy; `configured` is False for a stack without a team configuration."""

    teams: Mapping[str, TeamPolicy]
    configured: bool = True
    fleet: FleetPolicy = field(default_factory=FleetPolicy)

    @classmethod
    def open(cls) -> TeamDirectory:
        return cls(teams={}, configured=False)

    def refusal(self, spec: JobSpec, sender: str | None) -> list[str]:
        """Why `sender` may not submit `spec` (empty when it may): one line per problem."""
        if not self.configured:
            return []
        policy = self.teams.get(spec.team)
        if policy is None:
            return [f"team: {spec.team!r} is not a team of this stack ({', '.join(sorted(self.teams))})"]
        if not policy.admits(sender):
            return [f"team: sender {sender or '(unknown)'!r} may not act for team {spec.team!r}"]
        return policy.problems_with(spec)

    def data_buckets(self, team: str) -> tuple[str, ...]:
        """The buckets the team's jobs may read training data from (none without a configuration)."""
        policy = self.teams.get(team)
        return policy.data_buckets if policy is not None else ()

    def quota(self, team: str) -> TeamQuota:
        """The team's quota (none for a team the configuration does not list, or without one)."""
        policy = self.teams.get(team)
        return policy.quota if policy is not None else TeamQuota()

    def may_act_for(self, team: str, sender: str | None) -> bool:
        if not self.configured:
            return True
        policy = self.teams.get(team)
        return policy is not None and policy.admits(sender)


def parse_team_config(text: str) -> TeamDirectory:
    """The directory a JSON team configuration describes; TeamConfigError names what is wrong.

    ```json
    {"teams": {"vision": {"principals": ["AROAEXAMPLEID1234567"], "instance_types": ["g5.xlarge"],
                          "max_nodes": 4, "data_buckets": ["vision-datasets"]}}}
    ```
    """
    try:
        document = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise TeamConfigError(f"team configuration: not JSON ({exc})") from exc
    if (
        not isinstance(document, dict)
        or "teams" not in document
        or not set(document) <= {"teams", "fleet"}
        or not isinstance(document["teams"], dict)
    ):
        raise TeamConfigError('team configuration: expected {"teams": {"<team>": {...}, ...}, "fleet": {...}}')
    if not document["teams"]:
        raise TeamConfigError("teams: at least one team is needed")
    try:
        fleet = parse_fleet(document.get("fleet"))
        teams = {team: _policy(team, entry) for team, entry in document["teams"].items()}
    except QuotaConfigError as exc:
        raise TeamConfigError(str(exc)) from exc
    return TeamDirectory(teams=teams, fleet=fleet)


_FIELDS = {"principals", "instance_types", "max_nodes", "data_buckets"} | QUOTA_FIELDS


def _policy(team: str, entry: Any) -> TeamPolicy:
    where = f"teams.{team}"
    if not re.fullmatch(TEAM_PATTERN, team):
        raise TeamConfigError(f"{where}: a team name is lowercase letters, digits and '-', 1 to 63 characters")
    if not isinstance(entry, dict):
        raise TeamConfigError(f"{where}: expected a mapping with {', '.join(sorted(_FIELDS))}")
    unknown = sorted(set(entry) - _FIELDS)
    if unknown:
        raise TeamConfigError(f"{where}.{unknown[0]}: unknown field (expected {', '.join(sorted(_FIELDS))})")
    principals = _strings(
        entry.get("principals"),
        f"{where}.principals",
        UNIQUE_ID_PATTERN,
        "is not an IAM unique id (AROA... for a role, AIDA... for a user) or an account id; "
        "find a role's with `aws iam get-role --role-name NAME --query Role.RoleId`",
        required=True,
    )
    types = entry.get("instance_types")
    max_nodes = entry.get("max_nodes", MAX_NODES)
    if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or not 1 <= max_nodes <= MAX_NODES:
        raise TeamConfigError(f"{where}.max_nodes: expected a whole number from 1 to {MAX_NODES}")
    return TeamPolicy(
        team=team,
        principals=frozenset(principals),
        instance_types=None
        if types is None
        else frozenset(
            _strings(types, f"{where}.instance_types", INSTANCE_TYPE_PATTERN, "is not an instance type", required=True)
        ),
        max_nodes=max_nodes,
        data_buckets=tuple(
            _strings(entry.get("data_buckets", []), f"{where}.data_buckets", BUCKET_PATTERN, "is not a bucket name")
        ),
        quota=parse_team_quota(where, entry),
    )


def _strings(value: Any, where: str, pattern: str, malformed: str, *, required: bool = False) -> Sequence[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TeamConfigError(f"{where}: expected a list of strings")
    if required and not value:
        raise TeamConfigError(f"{where}: must not be empty")
    bad = [v for v in value if not re.fullmatch(pattern, v)]
    if bad:
        raise TeamConfigError(f"{where}: {bad[0]!r} {malformed}")
    return value
