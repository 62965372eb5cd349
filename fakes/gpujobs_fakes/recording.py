"""In-memory ports that record what the service did (events, metrics, signals, alarms, budgets)
or answer from a table (prices, quotas, teams, the clock, report keys); `gpujobs_fakes.memory`
re-exports them beside the store and the compute fake."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from gpujobs.domain.budget import BudgetMode, BudgetPolicy, lifted, may_replace, strictest
from gpujobs.domain.job import Market
from gpujobs.domain.job_metrics import JobMetric
from gpujobs.domain.report_auth import checkpoint_key, report_key
from gpujobs.domain.teams import TeamDirectory
from gpujobs.service.ports import (
    IdleAlarmState,
    StateChanged,
)
from gpujobs_fakes.faults import Faults


@dataclass
class RecordingPublisher:
    events: list[StateChanged] = field(default_factory=list)
    notices: list[tuple[str, dict[str, object]]] = field(default_factory=list)

    def publish(self, events: Sequence[StateChanged]) -> None:
        self.events.extend(events)

    def publish_notice(self, detail_type: str, detail: dict[str, object]) -> None:
        self.notices.append((detail_type, detail))


@dataclass
class InMemoryBlobStore:
    bucket: str = "checkpoints"
    objects: dict[str, str] = field(default_factory=dict)
    deleted_prefixes: list[str] = field(default_factory=list)

    def put_text(self, key: str, text: str) -> str:
        self.objects[key] = text
        return f"s3://{self.bucket}/{key}"

    def delete_prefix(self, prefix: str, *, max_keys: int) -> bool:
        if not prefix.endswith("/") or prefix == "/":
            raise ValueError(f"refusing to delete under {prefix!r}: a job's prefix ends with '/'")
        under = sorted(key for key in self.objects if key.startswith(prefix))
        for key in under[:max_keys]:
            del self.objects[key]
        self.deleted_prefixes.append(prefix)
        return len(under) <= max_keys


@dataclass
class FixedClock:
    current: datetime = field(default_factory=lambda: datetime(2026, 11, 29, 12, 0, tzinfo=UTC))

    def now(self) -> datetime:
        return self.current

    def advance(self, **kwargs: float) -> None:
        self.current += timedelta(**kwargs)


@dataclass
class FixedReportKeys:
    """Report keys under a fixed stack secret (what the instances of a test hold, too). `rotate`
    makes a new current version, the old one the previous version, accepted for `grace` after."""

    secret: bytes = b"a stack secret for tests"
    previous: bytes | None = None
    rotated_at: datetime | None = None
    grace: timedelta = timedelta(days=7)

    def rotate(self, new_secret: bytes, *, at: datetime) -> None:
        self.previous, self.secret, self.rotated_at = self.secret, new_secret, at

    def key_for(self, *, job_id: str, attempt: int) -> bytes:
        return report_key(self.secret, job_id=job_id, attempt=attempt)

    def verifying_keys(self, *, job_id: str, attempt: int, now: datetime) -> list[bytes]:
        secrets = [self.secret]
        if self.previous is not None and self.rotated_at is not None and now < self.rotated_at + self.grace:
            secrets.append(self.previous)
        return [report_key(secret, job_id=job_id, attempt=attempt) for secret in secrets]

    def refresh(self) -> bool:
        """Nothing is cached here: always the versions as they are."""
        return False

    def checkpoint_key_for(self, *, job_id: str) -> bytes:
        """The job's checkpoint key (`domain.report_auth.checkpoint_key`), for every attempt's run document."""
        return checkpoint_key(self.secret, job_id=job_id)


@dataclass
class RecordingSignaller:
    signals: list[tuple[tuple[str, ...], str]] = field(default_factory=list)
    dumps: list[tuple[tuple[str, ...], str]] = field(default_factory=list)
    """Hung gangs asked for their stacks (SIGUSR2), in order."""
    faults: Faults = field(default_factory=Faults)

    def checkpoint_now(self, *, instance_ids: Sequence[str], container: str) -> None:
        self.faults.check("checkpoint_now")
        self.signals.append((tuple(instance_ids), container))

    def dump_stacks(self, *, instance_ids: Sequence[str], container: str) -> None:
        self.faults.check("dump_stacks")
        self.dumps.append((tuple(instance_ids), container))


@dataclass
class RecordingMetrics:
    """`MetricsRecorder`: what was emitted, in order, with its dimensions."""

    recorded: list[JobMetric] = field(default_factory=list)

    def record(self, metrics: Sequence[JobMetric]) -> None:
        self.recorded += metrics

    def counts(self, name: str, dimension: str) -> Counter[str]:
        """How much of `name` was recorded under each value of `dimension`."""
        found: Counter[str] = Counter()
        for metric in self.recorded:
            if metric.name == name:
                found[dict(metric.dimensions).get(dimension, "")] += int(metric.value)
        return found


@dataclass
class InMemoryIdleAlarms:
    alarms: dict[str, tuple[str, float, int]] = field(default_factory=dict)
    """instance id -> (job id, below percent, minutes)"""
    faults: Faults = field(default_factory=Faults)
    datapoints: dict[str, bool] = field(default_factory=dict)
    """instance id -> whether its alarm's last evaluation saw a datapoint (absent: not evaluated)."""

    def create(self, *, job_id: str, instance_ids: Sequence[str], below_percent: float, minutes: int) -> None:
        self.faults.check("create")
        for iid in instance_ids:
            self.alarms[iid] = (job_id, below_percent, minutes)

    def delete(self, *, instance_ids: Sequence[str]) -> None:
        self.faults.check("delete")
        for iid in instance_ids:
            self.alarms.pop(iid, None)

    def instance_ids(self) -> list[str]:
        self.faults.check("instance_ids")
        return list(self.alarms)

    def states(self) -> list[IdleAlarmState]:
        """Each alarm unevaluated, like moto's, unless a test set what CloudWatch saw (`silent`, `fed`)."""
        self.faults.check("states")
        return [IdleAlarmState(iid, "OK", self.datapoints.get(iid)) for iid in list(self.alarms)]

    def silent(self, *instance_ids: str) -> None:
        """Their alarms' last evaluation saw no GPU datapoint (the CloudWatch agent is not running)."""
        self.datapoints.update(dict.fromkeys(instance_ids, False))

    def fed(self, *instance_ids: str) -> None:
        self.datapoints.update(dict.fromkeys(instance_ids, True))


@dataclass
class InMemoryBudgetBook:
    policies: dict[str, BudgetPolicy] = field(default_factory=dict)

    def policy_for(self, team: str) -> BudgetPolicy:
        return strictest([self.policies.get(team), self.policies.get("all")], team)

    def set_policy(self, policy: BudgetPolicy) -> None:
        """Seed a scope's policy as given, unconditionally (tests start from a known policy)."""
        self.policies[policy.scope] = policy

    def tighten(self, policy: BudgetPolicy) -> BudgetPolicy:
        stored = self.policies.get(policy.scope)
        if stored is None or may_replace(stored, policy):
            self.policies[policy.scope] = policy
            return policy
        return stored

    def release(self, policy: BudgetPolicy) -> bool:
        if self.policies.get(policy.scope) != policy:
            return False
        self.policies[policy.scope] = lifted(policy)
        return True

    def held_scopes(self) -> list[BudgetPolicy]:
        return [p for p in self.policies.values() if p.mode is not BudgetMode.NORMAL]


@dataclass
class TablePrices:
    """Prices from a dict, for tests: (instance_type, market) -> USD per hour."""

    table: dict[tuple[str, str], float] = field(default_factory=dict)

    def hourly_usd(self, *, instance_type: str, market: Market, zone: str | None) -> float | None:  # noqa: ARG002
        return self.table.get((instance_type, market.value))

    @property
    def on_demand_table(self) -> dict[str, float]:
        return {t: price for (t, market), price in self.table.items() if market == Market.ON_DEMAND.value}


@dataclass
class FakeServiceQuotas:
    """Service Quotas as a dict (quota code -> value); a code it lacks, or every code while
    `unreadable`, answers None as the adapter does when GetServiceQuota is refused. `asked` counts calls."""

    values: dict[str, float] = field(default_factory=dict)
    unreadable: bool = False
    asked: list[str] = field(default_factory=list)

    def current_value(self, quota_code: str) -> float | None:
        self.asked.append(quota_code)
        return None if self.unreadable else self.values.get(quota_code)


@dataclass
class Deadline:
    """A Lambda deadline on the fake clock: `time_left` is what the context's remaining time would say."""

    clock: FixedClock
    at: datetime | None = None

    def time_left(self) -> timedelta | None:
        return None if self.at is None else self.at - self.clock.now()


@dataclass
class StaticTeamConfig:
    """A team configuration held in memory; `loads` counts how often the service read it."""

    directory: TeamDirectory
    loads: int = 0

    def load(self) -> TeamDirectory:
        self.loads += 1
        return self.directory
