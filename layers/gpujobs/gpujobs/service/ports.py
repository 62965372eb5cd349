"""The ports the services depend on. Adapters implement them with boto3; fakes in memory.

Each port raises the typed errors below (the job store's live in `store_errors`, imported from here
like the others), so a service can handle a lost race or a capacity shortage on purpose without
knowing which implementation it talks to. `Ports` holds one of each:
`runtime.bootstrap` builds the real set once per Lambda container, `gpujobs_fakes.fake_ports()` the
in-memory set for tests, benches and simulations, and every service takes it whole.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Protocol

from gpujobs.domain.budget import BudgetPolicy
from gpujobs.domain.job import Job, Market
from gpujobs.domain.ledger import Ledger
from gpujobs.domain.states import JobState
from gpujobs.service.offerings import InstanceTypeOfferings, UndescribedOfferings
from gpujobs.service.pool_evidence import NoEvidence, NoPlacementScores, PlacementScores, PoolEvidence
from gpujobs.service.store_errors import (
    AdmissionRefusedError,
    ConcurrentUpdateError,
    JobExistsError,
    JobNotFoundError,
    JobRecordTooLargeError,
    UnreadableJobError,
)

__all__ = [  # besides what is defined here, the job store's errors (`store_errors`)
    "AdmissionRefusedError",
    "ConcurrentUpdateError",
    "JobExistsError",
    "JobNotFoundError",
    "JobRecordTooLargeError",
    "UnreadableJobError",
]

if TYPE_CHECKING:
    from gpujobs.domain.job_metrics import JobMetric
    from gpujobs.domain.rundoc import RunDocument, RunDocumentPointer
    from gpujobs.domain.teams import TeamDirectory


UnreadableObserver = Callable[[UnreadableJobError], None]


class JobStore(Protocol):
    def create(self, job: Job) -> Job:
        """Insert a new job at version 1; JobExistsError if the id is taken."""

    def get(self, job_id: str) -> Job:
        """JobNotFoundError if absent, UnreadableJobError if this release cannot read its record."""

    def save(self, job: Job) -> Job:
        """Write `job` if the stored version still equals `job.version`; returns it at version+1.

        Raises ConcurrentUpdateError otherwise, and JobRecordTooLargeError (writing nothing) when
        the record would pass the item size limit. Instance ids of the job's attempts are indexed so
        that find_by_instance answers without a scan. The GPU ledger gets the write's change
        (`domain.ledger.change_of`: what the record stands for less what it says the ledger counts) in the same transaction; an admission
        whose ceilings no longer hold raises AdmissionRefusedError and writes nothing."""

    def ledger(self) -> Ledger:
        """The GPU ledger's counters, read consistently (`domain.ledger`)."""

    def get_many(self, job_ids: Sequence[str], *, on_unreadable: UnreadableObserver | None = None) -> dict[str, Job]:
        """Consistent batch reads, by id; absent jobs left out, unreadable ones as in list_by_state."""

    def find_by_instance(self, instance_id: str) -> Job | None: ...

    def list_by_state(
        self,
        state: JobState,
        *,
        limit: int = 100,
        team: str | None = None,
        on_unreadable: UnreadableObserver | None = None,
    ) -> list[Job]:
        """Newest first, from the ByState index; only `team`'s jobs when given. A record this release
        cannot read is handed to `on_unreadable` and skipped, or raises UnreadableJobError without it."""

    def list_ended(self, *, before: datetime, limit: int) -> list[Job]:
        """Ended jobs whose objects are kept (`domain.retention`), ended at or before `before`, oldest end first."""

    def list_ended_after(self, after: datetime, *, limit: int) -> list[Job]:
        """Ended jobs whose objects are kept, ended at or after `after`, oldest end first."""


# ---- compute ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Subnet:
    subnet_id: str
    zone: str


@dataclass(frozen=True)
class LaunchRequest:
    job_id: str
    attempt: int
    team: str
    name: str
    count: int
    instance_type: str
    subnet: Subnet
    market: Market
    client_token: str
    user_data: str | bytes
    placement_group: str | None = None
    """Created (or reused) by run_instances when missing; at most 500 per Region."""
    security_group_id: str | None = None
    """The job's own security group (self-ingress only), attached beside the stack's egress group."""
    efa_interfaces: int = 0
    """EFA interfaces per instance, one per network card (`domain.hardware`); 0 launches one plain interface."""
    generation: int = 0
    """The gang generation the instances join (`contract.GENERATION_TAG`): above 0 for a regroup's replacement."""


@dataclass(frozen=True)
class LaunchedInstance:
    instance_id: str
    instance_type: str
    zone: str
    market: Market
    launch_index: int = 0
    private_ip: str | None = None
    state: str = "pending"
    generation: int = 0


class CapacityError(Exception):
    """This rung of the ladder has no capacity (or quota) now; try the next one."""

    def __init__(self, code: str, message: str = "") -> None:
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
        self.message = message


class QuotaExceededError(CapacityError):
    """A vCPU quota of the Region refused this rung (`VcpuLimitExceeded`, `MaxSpotInstanceCountExceeded`):
    no zone of its (type, market) has room, other rungs may; the job says which quota (`domain.quotas`)."""


class LaunchRejectedError(Exception):
    """EC2 refused the request for a reason that no other rung or retry will fix."""

    def __init__(self, code: str, message: str = "") -> None:
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
        self.message = message


class LaunchTokenMismatchError(Exception):
    """EC2 remembers this request's ClientToken from one with other parameters (`IdempotentParameterMismatch`):
    it may have launched this attempt's gang. Adopt what it launched, or try the next rung; never fail the job."""

    def __init__(self, client_token: str, message: str = "") -> None:
        super().__init__(f"IdempotentParameterMismatch for {client_token}: {message}".rstrip(": "))
        self.client_token = client_token
        self.code = "IdempotentParameterMismatch"
        self.message = message


class Compute(Protocol):
    def subnets(self) -> Sequence[Subnet]:
        """The stack's subnets, in configured order, each with its availability zone."""

    def run_instances(self, request: LaunchRequest) -> list[LaunchedInstance]:
        """Launch `count` instances or none. CapacityError (QuotaExceededError for a vCPU quota) /
        LaunchRejectedError on refusal; LaunchTokenMismatchError: the token was used with other parameters."""

    def find_instances(self, *, job_id: str, attempt: int | None = None) -> list[LaunchedInstance]:
        """Non-terminated instances tagged with this job (and attempt)."""

    def terminate(self, instance_ids: Sequence[str]) -> None: ...

    def tag_generation(self, instance_ids: Sequence[str], generation: int) -> None:
        """Set the instances' gang generation tag (`contract.GENERATION_TAG`); idempotent."""

    def state_reason(self, instance_id: str) -> str | None:
        """EC2's `StateReason` of a gone instance (kept about an hour), e.g. `Client.InternalError`; None: none."""

    def stop(self, instance_ids: Sequence[str]) -> None:
        """Stop (not terminate) on-demand instances; spot instances cannot be stopped."""

    def list_instances(self) -> list[TaggedInstance]:
        """Every non-terminated instance carrying this stack's tag (one paginated query)."""

    def list_placement_groups(self) -> list[PlacementGroup]:
        """This stack's `gpujobs-*` cluster placement groups (run_instances creates them)."""

    def delete_placement_group(self, name: str) -> bool:
        """True once the group is gone (also when it already was); False while instances use it."""

    # ---- a security group per job (gangs of different jobs cannot reach each other) ----------
    def job_security_group(self, job_id: str) -> str:
        """The job's security group, created (tagged, self-ingress only) if it does not exist yet."""

    def job_security_groups(self) -> list[JobSecurityGroup]:
        """Every job security group tagged with this stack."""

    def delete_security_group(self, group_id: str) -> bool:
        """Delete it; False while an instance (or its network interface) still uses it."""


@dataclass(frozen=True)
class JobSecurityGroup:
    group_id: str
    job_id: str


@dataclass(frozen=True)
class TaggedInstance:
    instance_id: str
    job_id: str
    attempt: int
    state: str
    launched_at: datetime


@dataclass(frozen=True)
class PlacementGroup:
    """A cluster placement group made for one attempt of a multi-node job (tagged like its gang)."""

    name: str
    job_id: str
    attempt: int


class ServiceQuotas(Protocol):
    def current_value(self, quota_code: str) -> float | None:
        """An EC2 quota's applied value (Service Quotas `GetServiceQuota`); None when unreadable: never raises."""


class _UnknownQuotas:
    def current_value(self, quota_code: str) -> float | None:  # noqa: ARG002 - nothing is known
        return None


def _no_deadline() -> timedelta | None:
    return None


class Signaller(Protocol):
    def checkpoint_now(self, *, instance_ids: Sequence[str], container: str) -> None:
        """Ask the training container to save a checkpoint now and keep training (SIGUSR1)."""

    def dump_stacks(self, *, instance_ids: Sequence[str], container: str) -> None:
        """Ask a hung training container for every rank's stacks, uploaded beside its outputs (SIGUSR2)."""


@dataclass(frozen=True)
class IdleAlarmState:
    """One idle alarm as CloudWatch last evaluated it (DescribeAlarms)."""

    instance_id: str
    state: str
    """`OK`, `ALARM` or `INSUFFICIENT_DATA` (StateValue)."""
    had_datapoints: bool | None
    """Whether its last evaluation saw any GPU datapoint (StateReasonData's `recentDatapoints`);
    None when it has not been evaluated yet (no reason data: "Unchecked: Initial alarm creation")."""


class IdleAlarms(Protocol):
    def create(self, *, job_id: str, instance_ids: Sequence[str], below_percent: float, minutes: int) -> None:
        """One GPU-idle alarm per instance (CWAgent nvidia_smi_utilization_gpu by InstanceId)."""

    def delete(self, *, instance_ids: Sequence[str]) -> None: ...

    def instance_ids(self) -> list[str]:
        """The instances that have an idle alarm of this stack."""

    def states(self) -> list[IdleAlarmState]:
        """Every idle alarm of this stack with its last evaluation (one paginated DescribeAlarms)."""


class BudgetBook(Protocol):
    def policy_for(self, team: str) -> BudgetPolicy:
        """The strictest policy over the team's scope and "all"."""

    def tighten(self, policy: BudgetPolicy) -> BudgetPolicy:
        """Record `policy` for its scope unless the stored one may not be replaced by it
        (`domain.budget.may_replace`), as one conditional write; return the policy now in force."""

    def release(self, policy: BudgetPolicy) -> bool:
        """Set the scope back to NORMAL if its stored policy is still exactly `policy` (compare and
        set, so a newer alert's policy is never lifted by a release decided on an older read)."""

    def held_scopes(self) -> list[BudgetPolicy]:
        """Every scope whose mode is not NORMAL."""


class Prices(Protocol):
    def hourly_usd(self, *, instance_type: str, market: Market, zone: str | None) -> float | None:
        """The price known for this pool, or None when nothing is known about the type."""

    @property
    def on_demand_table(self) -> Mapping[str, float]:
        """Instance type -> on-demand USD per hour, for every type with a known price."""


class MetricsRecorder(Protocol):
    def record(self, metrics: Sequence[JobMetric]) -> None:
        """Emit metrics with their dimensions (`domain.job_metrics`)."""


class ReportKeys(Protocol):
    def key_for(self, *, job_id: str, attempt: int) -> bytes:
        """The attempt's report key under the secret's current version (`domain.report_auth.report_key`)."""

    def verifying_keys(self, *, job_id: str, attempt: int, now: datetime) -> Sequence[bytes]:
        """The keys a report is accepted under: the current version's, the previous one's in a rotation's grace."""

    def refresh(self) -> bool:
        """Read the secret again, unless it was read moments ago; True when it changed."""

    def checkpoint_key_for(self, *, job_id: str) -> bytes:
        """The job's checkpoint key (`domain.report_auth.checkpoint_key` under the stack's secret)."""


# ---- events, blobs, clock -------------------------------------------------------------------


@dataclass(frozen=True)
class StateChanged:
    """Published as detail-type `GPU Job State Change` on the stack's bus."""

    job_id: str
    name: str
    team: str
    source: JobState | None
    target: JobState
    reason: str
    attempt: int | None
    detail: str
    at: datetime
    extra: dict[str, object] = field(default_factory=dict)
    sequence: int = 0
    """The transition's number in the job's history, from 1: `event_id` is `<job_id>:<sequence>`."""


class EventPublisher(Protocol):
    def publish(self, events: Sequence[StateChanged]) -> None: ...

    def publish_notice(self, detail_type: str, detail: dict[str, object]) -> None:
        """Anything else users may subscribe to (e.g. `GPU Budget Warning`)."""


class BlobStore(Protocol):
    def put_text(self, key: str, text: str) -> str:
        """Store text under key in the stack's bucket; return its s3:// URI."""

    def delete_prefix(self, prefix: str, *, max_keys: int) -> bool:
        """Delete up to `max_keys` objects under `prefix`; True once none is left under it."""


class Clock(Protocol):
    def now(self) -> datetime: ...


class TeamConfigSource(Protocol):
    """Where the platform team's team configuration lives; TeamConfigError if it is malformed."""

    def load(self) -> TeamDirectory: ...


class UserDataTooLargeError(Exception):
    """The rendered user data would pass EC2's 16 KB limit: store the run document in S3 and render
    a pointer to it instead (`domain.rundoc.RunDocumentPointer`)."""

    def __init__(self, size: int) -> None:
        super().__init__(f"user data of {size} bytes does not fit EC2's limit")
        self.size = size


class UserDataRenderer(Protocol):
    def __call__(self, doc: RunDocument | RunDocumentPointer, /) -> str | bytes:
        """The user data that boots an attempt; UserDataTooLargeError when it would not fit."""


BudgetCheck = Callable[[BudgetPolicy], bool]
"""True when the budget of a held scope has room again (its limit was raised above the spend)."""


def _no_room(_policy: BudgetPolicy) -> bool:
    return False


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter between tries of a lost race."""

    tries: int = 12
    base_seconds: float = 0.02
    cap_seconds: float = 1.0
    sleep: Callable[[float], None] = time.sleep
    jitter: Callable[[], float] = random.random

    def pause(self, lost: int) -> None:
        self.sleep(self.jitter() * min(self.cap_seconds, self.base_seconds * 2**lost))


@dataclass(frozen=True)
class Ports:
    """Everything the services reach outside themselves, built once and shared by all of them.

    No service reaches through another to get at one of these: each takes `Ports` and asks it.
    """

    store: JobStore
    compute: Compute
    publisher: EventPublisher
    blobs: BlobStore
    clock: Clock
    alarms: IdleAlarms
    signaller: Signaller
    budgets: BudgetBook
    report_keys: ReportKeys
    """Each launch hands its attempt a report key in user data; each report is verified under it."""
    prices: Prices
    render_user_data: UserDataRenderer
    teams: TeamConfigSource | None = None
    """Who may act for which team; None: no team configuration (single-tenant, see domain.teams)."""
    budget_has_room: BudgetCheck = _no_room
    metrics: MetricsRecorder | None = None
    """Counts what each job write stands for (`changes.WriteCounter`); None: nothing is counted."""
    jitter: Callable[[], float] = random.random
    """The capacity-wait backoff's jitter (`domain.ladder.next_try_at`)."""
    backoff: Backoff = field(default_factory=Backoff)
    """Between tries of a lost race (`changes.change`)."""
    quotas: ServiceQuotas = field(default_factory=_UnknownQuotas)
    """The EC2 vCPU quotas' values, named in a job a quota refused; the default knows none."""
    reports_throttled_at: Callable[[datetime], datetime | None] = lambda _now: None
    """When the Reports function was last throttled, in the hour before now (`domain.hangs`)."""
    pool_evidence: PoolEvidence = field(default_factory=NoEvidence)
    """The stack's recent spot reclaims per pool (`domain.pools`); the default records none."""
    placement_scores: PlacementScores = field(default_factory=NoPlacementScores)
    """EC2's spot placement score per zone (`domain.pools`); the default scores none."""
    offerings: InstanceTypeOfferings = field(default_factory=UndescribedOfferings)
    """The zones offering each type (`domain.offerings.offered`); the default describes none, so all are tried."""
    time_left: Callable[[], timedelta | None] = _no_deadline
    """Time left before the invocation's deadline (the Lambda context's remaining time; None: no
    deadline). A ladder walk stops trying rungs short of it and hands the rest to the reconciler."""
