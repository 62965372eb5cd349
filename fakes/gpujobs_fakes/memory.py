"""In-memory implementations of the ports, enforcing the same conditions as the real ones.

Unit tests, the benchmarks and anything that must run without AWS use these (`gpujobs_fakes`
lives outside the Lambda layer, so `sam build` never ships them). They are fakes, not
mocks: the store refuses a stale version exactly as the DynamoDB conditional write does, and an
item over DynamoDB's 400 KB as DynamoDB counts it; the compute fake can be told to refuse chosen
pools with the EC2 error codes the launcher handles, refuses a reused client token sent with
other parameters, keeps at most 500 placement groups and will not delete one in use, as EC2 does.
Each fake also has `faults`, to make a chosen port call fail the next time(s) it is made, so tests
can show that an effect which fails once is carried out later from the record.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from gpujobs.adapters.dynamodb import sized_job_item
from gpujobs.contract import LIVE_STATES
from gpujobs.domain import retention
from gpujobs.domain.job import Job
from gpujobs.domain.ladder import PLACEMENT_GROUP_LIMIT_EXCEEDED
from gpujobs.domain.ledger import Ledger, LedgerChange, change_of, ledgered
from gpujobs.domain.quotas import QUOTA_ERROR_CODES
from gpujobs.domain.states import JobState
from gpujobs.service.ports import (
    AdmissionRefusedError,
    CapacityError,
    ConcurrentUpdateError,
    JobExistsError,
    JobNotFoundError,
    JobSecurityGroup,
    LaunchedInstance,
    LaunchRequest,
    LaunchTokenMismatchError,
    PlacementGroup,
    QuotaExceededError,
    Subnet,
    TaggedInstance,
    UnreadableJobError,
    UnreadableObserver,
)
from gpujobs_fakes.faults import Faults, InjectedFaultError
from gpujobs_fakes.recording import (
    Deadline,
    FakeServiceQuotas,
    FixedClock,
    FixedReportKeys,
    InMemoryBlobStore,
    InMemoryBudgetBook,
    InMemoryIdleAlarms,
    RecordingMetrics,
    RecordingPublisher,
    RecordingSignaller,
    StaticTeamConfig,
    TablePrices,
)
from gpujobs_fakes.stream import InMemoryStream


class InMemoryJobStore:
    """Atomic like a conditional write: concurrent saves (threads) serialize on a lock.

    Every write is also a record of its `stream` (DynamoDB Streams, `gpujobs_fakes.stream`), whose
    reader publishes the write's state changes, and adds its change to the GPU ledger
    (`domain.ledger`), refusing an admission whose ceilings no longer hold as DynamoDB's transaction does. `get` reads consistently, as DynamoDB's ConsistentRead does; `list_by_state` reads the
    `ByState` index, which is eventually consistent: `lag_index` freezes it at a moment so that a
    test can show what a stale index read does. `on_get`, when set, runs after every read; a test
    sleeps there to model the network time in which other writers get ahead. `make_unreadable`
    turns a stored job into an item this release cannot read, as DynamoDB may hold one a newer
    release wrote: `get` raises UnreadableJobError for it, and a listing skips or raises."""

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}
        self._instances: dict[str, str] = {}
        self._lock = threading.Lock()
        self.faults = Faults()
        self.on_get: Callable[[], None] | None = None
        self._index: dict[str, Job] | None = None
        self._unreadable: dict[str, str] = {}
        self.stream = InMemoryStream()
        self._ledger: Counter[str] = Counter()

    def make_unreadable(self, job_id: str, problem: str) -> None:
        """From now on the stored item of `job_id` is one this release cannot read (`problem` says why)."""
        self._unreadable[job_id] = problem

    def lag_index(self) -> None:
        """From now on, `list_by_state` answers as of this moment, until `catch_up_index`."""
        self._index = dict(self._jobs)

    def catch_up_index(self) -> None:
        self._index = None

    def create(self, job: Job) -> Job:
        if job.job_id in self._jobs:
            raise JobExistsError(job.job_id)
        stored = ledgered(job).model_copy(update={"version": 1})
        sized_job_item(stored)
        with self._lock:
            self._add_to_ledger(stored.job_id, change_of(job))
            self._jobs[job.job_id] = stored
            self.stream.append(None, stored)
        self.stream.written()
        return stored

    def get(self, job_id: str) -> Job:
        try:
            job = self._jobs[job_id]
        except KeyError:
            raise JobNotFoundError(job_id) from None
        if job_id in self._unreadable:
            raise UnreadableJobError(job_id, self._unreadable[job_id])
        if self.on_get:
            self.on_get()
        return job

    def save(self, job: Job) -> Job:
        self.faults.check("save")
        with self._lock:
            current = self._jobs.get(job.job_id)
            if current is None or current.version != job.version:
                raise ConcurrentUpdateError(job.job_id, job.version)
            stored = ledgered(job).model_copy(update={"version": job.version + 1})
            sized_job_item(stored)
            self._add_to_ledger(job.job_id, change_of(job))
            self._jobs[job.job_id] = stored
            self.stream.append(current, stored)
            attempt = job.current_attempt
            for iid in attempt.instance_ids if attempt else ():
                self._instances[iid] = job.job_id
        self.stream.written()
        return stored

    def _add_to_ledger(self, job_id: str, change: LedgerChange) -> None:
        """As the DynamoDB store's transaction: the ceilings hold, or nothing is written."""
        if any(self._ledger[name] > ceiling for name, ceiling in change.ceilings.items()):
            raise AdmissionRefusedError(job_id, change.ceilings)
        self._ledger.update(change.adds)

    def ledger(self) -> Ledger:
        self.faults.check("ledger")
        with self._lock:
            return Ledger({name: value for name, value in self._ledger.items() if value})

    def get_many(self, job_ids: Sequence[str], *, on_unreadable: UnreadableObserver | None = None) -> dict[str, Job]:
        self.faults.check("get_many")
        found: dict[str, Job] = {}
        for job_id in dict.fromkeys(job_ids):
            if job_id not in self._jobs:
                continue
            if job_id in self._unreadable:
                error = UnreadableJobError(job_id, self._unreadable[job_id])
                if on_unreadable is None:
                    raise error
                on_unreadable(error)
                continue
            found[job_id] = self._jobs[job_id]
        return found

    def find_by_instance(self, instance_id: str) -> Job | None:
        job_id = self._instances.get(instance_id)
        if job_id is None:
            return None
        if job_id in self._unreadable:
            raise UnreadableJobError(job_id, self._unreadable[job_id])
        return self._jobs[job_id]

    def _indexed(self) -> list[Job]:
        """The index's items, copied under the lock (a listing racing a create must not fail)."""
        with self._lock:
            return list((self._jobs if self._index is None else self._index).values())

    def list_by_state(
        self,
        state: JobState,
        *,
        limit: int = 100,
        team: str | None = None,
        on_unreadable: UnreadableObserver | None = None,
    ) -> list[Job]:
        found = sorted(
            (j for j in self._indexed() if j.state is state and team in (None, j.team)),
            key=lambda j: j.updated_at,
            reverse=True,
        )
        jobs: list[Job] = []
        for job in found[:limit]:
            if job.job_id not in self._unreadable:
                jobs.append(job)
                continue
            error = UnreadableJobError(job.job_id, self._unreadable[job.job_id])
            if on_unreadable is None:
                raise error
            on_unreadable(error)
        return jobs

    def list_ended(self, *, before: datetime, limit: int) -> list[Job]:
        """The sparse `ByEnd` index: unreadable items are skipped, as the adapter logs and skips them."""
        self.faults.check("list_ended")
        return self._ended(lambda end: end <= before, limit)

    def list_ended_after(self, after: datetime, *, limit: int) -> list[Job]:
        """The sparse `ByEnd` index read from `after` on, oldest end first."""
        return self._ended(lambda end: end >= after, limit)

    def _ended(self, when: Callable[[datetime], bool], limit: int) -> list[Job]:
        ended = [
            (end, job)
            for job in self._indexed()
            if job.job_id not in self._unreadable
            and retention.objects_kept(job)
            and (end := retention.ended_at(job)) is not None
            and when(end)
        ]
        return [job for _end, job in sorted(ended, key=lambda pair: pair[0])[:limit]]


@dataclass
class FakeInstance:
    instance: LaunchedInstance
    request: LaunchRequest
    state: str = "running"
    launched_at: datetime = field(default_factory=lambda: datetime(2026, 11, 29, tzinfo=UTC))


@dataclass
class FakeCompute:
    """EC2 as the launcher sees it. `refuse` maps (instance_type, zone, market) to an error code.
    Listings read a snapshot of the instances taken under a lock, so threads racing launches and
    listings (the ledger's race test) see one consistent set each. (A bare ``list(d.items())`` is not
    one: a garbage collection inside it runs Python callbacks, hypothesis's among them, and another
    thread may then add an instance.)"""

    subnet_list: list[Subnet] = field(
        default_factory=lambda: [Subnet("subnet-a", "us-east-1a"), Subnet("subnet-b", "us-east-1b")]
    )
    refuse: dict[tuple[str, str, str], str] = field(default_factory=dict)
    instances: dict[str, FakeInstance] = field(default_factory=dict)
    calls: list[LaunchRequest] = field(default_factory=list)
    terminated: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    clock: FixedClock | None = None
    on_run: Callable[[LaunchRequest], None] | None = None
    on_terminate: Callable[[Sequence[str]], None] | None = None
    """Told of every TerminateInstances before it takes effect (what the control plane chose to end)."""
    faults: Faults = field(default_factory=Faults)
    placement_groups: dict[str, PlacementGroup] = field(default_factory=dict)
    placement_group_limit: int = 500
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _by_token: dict[str, tuple[LaunchRequest, list[str]]] = field(default_factory=dict)
    security_groups: dict[str, str] = field(default_factory=dict)
    """Job security group id -> job id."""
    state_reasons: dict[str, str] = field(default_factory=dict)
    """Instance id -> EC2's state reason (say, `Client.InternalError: Client error on launch`)."""
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)

    def _instances(self) -> list[FakeInstance]:
        with self._lock:
            return list(self.instances.values())

    def _security_groups(self) -> list[tuple[str, str]]:
        with self._lock:
            return list(self.security_groups.items())

    def state_reason(self, instance_id: str) -> str | None:
        return self.state_reasons.get(instance_id)

    def subnets(self) -> Sequence[Subnet]:
        return self.subnet_list

    def run_instances(self, request: LaunchRequest) -> list[LaunchedInstance]:
        self.calls.append(request)
        if self.on_run:
            self.on_run(request)
        if request.placement_group and request.placement_group not in self.placement_groups:
            if len(self.placement_groups) >= self.placement_group_limit:
                raise CapacityError(PLACEMENT_GROUP_LIMIT_EXCEEDED, "You've reached the limit of placement groups")
            group = PlacementGroup(request.placement_group, request.job_id, request.attempt)
            with self._lock:
                self.placement_groups[request.placement_group] = group
        if request.client_token in self._by_token:  # EC2 idempotency, parameters included
            first, ids = self._by_token[request.client_token]
            if first != request:
                raise LaunchTokenMismatchError(request.client_token, "parameters differ from the first request")
            return [self.instances[i].instance for i in ids]
        code = self.refuse.get((request.instance_type, request.subnet.zone, request.market.value))
        if code in QUOTA_ERROR_CODES:  # as the EC2 adapter classifies it
            raise QuotaExceededError(code, f"{request.market} vCPU quota reached for {request.instance_type}")
        if code:
            raise CapacityError(code, f"no {request.market} capacity for {request.instance_type}")
        launched = []
        for index in range(request.count):
            iid = f"i-{next(self._ids):017x}"
            inst = LaunchedInstance(
                iid,
                request.instance_type,
                request.subnet.zone,
                request.market,
                index,
                f"10.0.0.{index + 10}",
                generation=request.generation,
            )
            launched_at = self.clock.now() if self.clock else datetime(2026, 11, 29, tzinfo=UTC)
            with self._lock:
                self.instances[iid] = FakeInstance(inst, request, launched_at=launched_at)
            launched.append(inst)
        self._by_token[request.client_token] = (request, [i.instance_id for i in launched])
        return launched

    def find_instances(self, *, job_id: str, attempt: int | None = None) -> list[LaunchedInstance]:
        return [
            f.instance
            for f in self._instances()
            if f.request.job_id == job_id
            and (attempt is None or f.request.attempt == attempt)
            and f.state in LIVE_STATES
        ]

    def tag_generation(self, instance_ids: Sequence[str], generation: int) -> None:
        self.faults.check("tag_generation")
        for iid in instance_ids:
            if iid in self.instances:
                fake = self.instances[iid]
                fake.instance = replace(fake.instance, generation=generation)

    def terminate(self, instance_ids: Sequence[str]) -> None:
        self.faults.check("terminate")
        if self.on_terminate:
            self.on_terminate(instance_ids)
        for iid in instance_ids:
            if iid in self.instances:
                self.instances[iid].state = "terminated"
                self.terminated.append(iid)

    def stop(self, instance_ids: Sequence[str]) -> None:
        self.faults.check("stop")
        for iid in instance_ids:
            if iid in self.instances:
                self.instances[iid].state = "stopped"
                self.stopped.append(iid)

    def list_instances(self) -> list[TaggedInstance]:
        return [
            TaggedInstance(f.instance.instance_id, f.request.job_id, f.request.attempt, f.state, f.launched_at)
            for f in self._instances()
            if f.state != "terminated"
        ]

    def list_placement_groups(self) -> list[PlacementGroup]:
        with self._lock:
            return list(self.placement_groups.values())

    def delete_placement_group(self, name: str) -> bool:
        if any(f.request.placement_group == name and f.state != "terminated" for f in self._instances()):
            return False
        with self._lock:
            self.placement_groups.pop(name, None)
        return True

    def job_security_group(self, job_id: str) -> str:
        group_id = next((g for g, j in self._security_groups() if j == job_id), f"sg-{job_id.removeprefix('j-')}")
        with self._lock:
            self.security_groups[group_id] = job_id
        return group_id

    def job_security_groups(self) -> list[JobSecurityGroup]:
        return [JobSecurityGroup(group_id=g, job_id=j) for g, j in self._security_groups()]

    def delete_security_group(self, group_id: str) -> bool:
        if any(f.request.security_group_id == group_id and f.state != "terminated" for f in self._instances()):
            return False  # EC2: DependencyViolation
        with self._lock:
            self.security_groups.pop(group_id, None)
        return True

    def live(self) -> list[FakeInstance]:
        return [f for f in self._instances() if f.state == "running"]


__all__ = [
    "Deadline",
    "FakeCompute",
    "FakeInstance",
    "FakeServiceQuotas",
    "Faults",
    "FixedClock",
    "FixedReportKeys",
    "InMemoryBlobStore",
    "InMemoryBudgetBook",
    "InMemoryIdleAlarms",
    "InMemoryJobStore",
    "InMemoryStream",
    "InjectedFaultError",
    "RecordingMetrics",
    "RecordingPublisher",
    "RecordingSignaller",
    "StaticTeamConfig",
    "TablePrices",
]
