"""An attempt (one launch of the whole gang) and what the record keeps of the attempts it lets go:
enough for the runtime and cost caps, the retry backoff, the boot-death rule and the deadline to
count them (`Job._bounded` folds each retired attempt in with `RetiredAttempts.including`)."""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable
from datetime import datetime, timedelta

from pydantic import Field

from gpujobs.contract import container_name
from gpujobs.domain.states import WAITING_FOR_ROOM, Reason
from gpujobs.domain.values import Detail, Frozen, Market

BOOT_ALLOWANCE = timedelta(minutes=8)
"""Launch to training: p3/p4 provisioning (about 4 min) plus a multi-GB image pull (the goodput bench)."""
RESTORE_ALLOWANCE = timedelta(minutes=1)
"""Loading the newest checkpoint onto the GPUs."""
COMPLETED_END_REASON = "succeeded"
"""The `end_reason` of an attempt whose nodes all exited 0 (`fate.Verdict.SUCCEEDED`)."""
UNHEALTHY_END_REASONS = frozenset(
    {Reason.UNHEALTHY_NODE.value, Reason.HARDWARE_FAULT.value, Reason.SLOW_INTERCONNECT.value}
)
"""The `end_reason`s of an attempt its hosts ended (`fate.Verdict.UNHEALTHY_NODE`, `HARDWARE_FAULT`,
`SLOW_INTERCONNECT`): counted together toward `fate.UNHEALTHY_LIMIT`."""


class LaunchTry(Frozen):
    """One rung of the capacity ladder that was tried and refused."""

    at: datetime
    instance_type: str
    zone: str
    subnet_id: str
    market: Market
    error_code: str
    message: Detail = ""


class Regroup(Frozen):
    """Spot is reclaiming some nodes of the attempt's gang, and only those are replaced
    (`domain.regroup`): the survivors stay, and with the replacements form the gang's next
    `generation`, at the same world size, in the same pool and placement group."""

    lost: tuple[str, ...]
    """The nodes spot is reclaiming: they left the gang (`Attempt.left`) at the warning."""
    at: datetime
    """The warning."""
    generation: int
    """The generation the survivors and the replacements form (the instances' `gpujobs:generation` tag)."""
    replacements: tuple[str, ...] = ()
    """The nodes launched in place of `lost`, once recorded."""
    launched_at: datetime | None = None
    """When the replacements were recorded: the regrouped gang's first-heartbeat clock starts here."""
    refused_at: datetime | None = None
    """When the replacement found no room (or was not launched in time): the whole gang was replaced instead."""

    @property
    def pending(self) -> bool:
        """Waiting for its replacements' launch."""
        return not self.replacements and self.refused_at is None


class Attempt(Frozen):
    """One launch of the whole gang. A job's attempts are numbered from 1. After a regroup its
    `instance_ids` are the gang as it is now: the survivors and the replacements."""

    number: int
    started_at: datetime
    instance_ids: tuple[str, ...] = ()
    instance_type: str | None = None
    zone: str | None = None
    subnet_id: str | None = None
    market: Market | None = None
    resume_from_step: int | None = None
    checkpoint_step: int | None = None
    """Newest checkpoint this attempt committed."""
    checkpoint_at: datetime | None = None
    """When `checkpoint_step` was recorded: the attempt's work up to then is kept, the rest is redone."""
    ended_at: datetime | None = None
    end_reason: str | None = None
    tries: tuple[LaunchTry, ...] = ()
    tries_dropped: int = 0
    """Refusals older than the newest `MAX_TRIES_KEPT`, counted but no longer kept."""
    lease_expires_at: datetime | None = None
    """While LAUNCHING: until when the launcher that started this attempt owns it."""
    interrupted_at: datetime | None = None
    """When a spot warning (or a preempted exit) marked this attempt as being reclaimed."""
    moved: bool = False
    """Interrupted by a deadline's move, not by EC2: it trains on until its replacement's gang is up."""
    exit_codes: dict[str, int] = Field(default_factory=dict)
    """Container exit code per instance id, as each node reported it (`Job Exited`)."""
    unhealthy: dict[str, Detail] = Field(default_factory=dict)
    """Nodes that reported their GPUs unhealthy (before training) or a hardware fault (during it),
    instance id -> what their check found (`fate.Verdict.UNHEALTHY_NODE`): shown, and the pool scored down."""
    slow_interconnect: dict[str, Detail] = Field(default_factory=dict)
    """Nodes whose launcher exited `ExitCode.SLOW_INTERCONNECT`, instance id -> what it said it
    measured (the gang's all-reduce against the type's floor): the job's container's claim, recorded
    as reported and believed (`fate.Verdict.SLOW_INTERCONNECT`) only from an attempt that made no
    progress. Shown, never held against the pool (`pools.reclaims_of` reads `unhealthy` only)."""
    error_line: Detail = ""
    """The message of the attempt's first failed exit report (say, the trainer's configuration
    error), capped: what `gpujobs status` shows of why the attempt failed."""
    gone: tuple[str, ...] = ()
    """Instances seen stopping, stopped, shutting down or terminated."""
    gone_at: datetime | None = None
    """When the last of the attempt's instances was seen gone."""
    first_gone_at: datetime | None = None
    """When the first of them was: a node gone without a report breaks the gang after a grace."""
    gone_reasons: dict[str, str] = Field(default_factory=dict)
    """EC2's state reason per instance seen gone (DescribeInstances `StateReason`), when it gave one."""
    last_heartbeat_at: datetime | None = None
    heartbeat_step: int | None = None
    checkpoint_signalled_at: datetime | None = None
    hang_dump_asked_at: datetime | None = None
    """When the reconciler asked the hung gang for its stacks (`domain.hangs`): the kill waits for it."""
    idle_detection_off_at: datetime | None = None
    """When the reconciler found this attempt's idle alarms fed no GPU metric (`domain.idle_detection`)."""
    generation: int = 0
    """The gang's generation: 0 as launched, one more for each regroup whose replacements were launched."""
    can_regroup: bool = False
    """Launched by a release whose instances regroup (`domain.regroup`): a gang an older release launched
    runs its older bootstrap and trainer, which would not, and is replaced whole."""
    regroup: Regroup | None = None
    """The newest regroup of the gang (`domain.regroup`), pending or done."""
    left: tuple[str, ...] = ()
    """Nodes that left the gang in regroups (spot reclaimed them): no longer in `instance_ids`."""

    @property
    def waits_for_replacement(self) -> bool:
        """Its gang waits for a reclaimed node's replacement to be launched (a pending regroup)."""
        return self.regroup is not None and self.regroup.pending

    def whole_again(self) -> Attempt:
        """The attempt with a pending regroup's lost nodes back in its gang (`domain.regroup`): it
        ends like any reclaimed gang, every node's time paid and its end recorded."""
        regroup = self.regroup
        if regroup is None or not self.waits_for_replacement:
            return self
        back = tuple(i for i in regroup.lost if i not in self.instance_ids)
        left = tuple(i for i in self.left if i not in regroup.lost)
        return self.model_copy(update={"instance_ids": (*self.instance_ids, *back), "left": left})

    @property
    def all_gone(self) -> bool:
        return bool(self.instance_ids) and set(self.instance_ids) <= set(self.gone)

    @property
    def all_reported(self) -> bool:
        return bool(self.instance_ids) and set(self.instance_ids) <= set(self.exit_codes)

    @property
    def useful_instance_seconds(self) -> float:
        """Instance-seconds whose work was kept: up to the end of an attempt that completed the job,
        else up to its newest committed checkpoint (work after it is redone by the next attempt)."""
        kept_until = self.ended_at if self.end_reason == COMPLETED_END_REASON else self.checkpoint_at
        if not self.instance_ids or kept_until is None:
            return 0.0
        return max(0.0, (kept_until - self.started_at).total_seconds()) * len(self.instance_ids)

    @property
    def trains_from(self) -> datetime:
        """When its training begins, once it has booted and restored (`BOOT_ALLOWANCE`, `RESTORE_ALLOWANCE`)."""
        return self.started_at + BOOT_ALLOWANCE + RESTORE_ALLOWANCE

    @property
    def trained_to_sync(self) -> timedelta:
        """Training kept by its newest commit or sync: from `trains_from` up to that (`deadline.time_trained`)."""
        kept = self.checkpoint_at - self.trains_from if self.checkpoint_at is not None else timedelta(0)
        return max(timedelta(0), kept)

    @property
    def pool(self) -> tuple[str, str, Market] | None:
        if self.instance_type and self.zone and self.market:
            return (self.instance_type, self.zone, self.market)
        return None

    def container_name(self, job_id: str) -> str:
        """The name the bootstrap gives the training container (the SSM signal addresses it)."""
        return container_name(job_id, self.number)

    @property
    def is_over(self) -> bool:
        return self.ended_at is not None

    def client_token(self, job_id: str, *, instance_type: str, subnet_id: str, market: Market) -> str:
        """EC2 idempotency token for launching this attempt into one pool (type, subnet, market).

        Derived from the pool, not from the rung's position in the ladder: a takeover whose ladder
        is ordered differently (a reclaimed pool moved last, on-demand removed by a forecast, a
        subnet added) still sends a pool the token it was sent before, so a retry can never send a
        token EC2 remembers with another pool's parameters. The subnet, not just its zone, because
        two subnets of one zone are two requests. At most 64 ASCII characters, as EC2 requires.
        """
        pool = hashlib.sha256(f"{instance_type}|{subnet_id}|{market.value}".encode()).hexdigest()[:16]
        return f"{job_id}-a{self.number}-{pool}"


def ended_in_a_row(attempts: Iterable[Attempt], end_reasons: Collection[str]) -> tuple[int, bool]:
    """Attempts that launched instances and ended with one of `end_reasons`, newest first, until one
    that did not; and whether the row reaches the oldest attempt given (then the retired ones may
    extend it). Attempts that launched nothing (a walk that found no capacity) do not break the row."""
    count = 0
    for attempt in sorted(attempts, key=lambda a: -a.number):
        if not attempt.instance_ids:
            continue
        if attempt.end_reason not in end_reasons:
            return count, False
        count += 1
    return count, True


class Kept(Frozen):
    """A failed job's last gang kept up for inspection (the spec's `keep_on_failure`, `domain.keep`):
    its instances stay up, billed, until `until` or a cancel (`released_at`); the orphan sweep spares
    them until then and terminates them after."""

    attempt: int
    since: datetime
    """When the job failed (the attempt's end): the keep is billed from here."""
    until: datetime
    released_at: datetime | None = None
    """When a cancel released the gang before `until`."""

    @property
    def ends_at(self) -> datetime:
        return min(self.until, self.released_at) if self.released_at is not None else self.until

    def lasts(self, now: datetime) -> bool:
        return now < self.ends_at


class PoolUsage(Frozen):
    """Instance-seconds a job's retired attempts spent in one pool."""

    instance_type: str
    zone: str | None
    market: Market
    instance_seconds: float
    useful_instance_seconds: float = 0.0
    """The part of `instance_seconds` whose work was kept (`Attempt.useful_instance_seconds`)."""


class RetiredAttempts(Frozen):
    """What the attempts dropped from the record held, so runtime and cost caps still count them."""

    count: int = 0
    runtime_seconds: float = 0.0
    """Wall time the retired attempts held instances."""
    usage: tuple[PoolUsage, ...] = ()
    no_capacity_in_a_row: int = 0
    """How many of the newest retired attempts found no capacity (or no quota), so the retry backoff keeps growing."""
    boot_deaths_in_a_row: int = 0
    """Newest retired attempts in a row that saw their instances die at boot (`fate.boot_deaths_in_a_row`)."""
    unhealthy_in_a_row: int = 0
    """Newest retired attempts in a row ended by a node's failed GPU check, a hardware fault or a slow
    interconnect (`fate.unhealthy_in_a_row`)."""
    progressed: bool = False
    """Whether any retired attempt heartbeated or committed a checkpoint (`fate.made_progress`)."""
    trained_seconds: float = 0.0
    """What the retired attempts' commits or syncs kept of training (`Attempt.trained_to_sync`)."""

    def including(self, attempt: Attempt) -> RetiredAttempts:
        in_a_row = self.no_capacity_in_a_row + 1 if attempt.end_reason in WAITING_FOR_ROOM else 0
        heard = attempt.last_heartbeat_at is not None or attempt.checkpoint_step is not None
        progressed = self.progressed or heard
        trained = self.trained_seconds + attempt.trained_to_sync.total_seconds()
        if not attempt.instance_ids or attempt.ended_at is None:
            update = {"count": self.count + 1, "no_capacity_in_a_row": in_a_row, "progressed": progressed}
            return self.model_copy(update={**update, "trained_seconds": trained})
        boot_deaths = self.boot_deaths_in_a_row + 1 if attempt.end_reason == Reason.DIED_AT_BOOT.value else 0
        unhealthy = self.unhealthy_in_a_row + 1 if attempt.end_reason in UNHEALTHY_END_REASONS else 0
        held = (attempt.ended_at - attempt.started_at).total_seconds()
        market = attempt.market or Market.ON_DEMAND
        pool = (attempt.instance_type or "", attempt.zone, market)
        usage = list(self.usage)
        spent, useful = held * len(attempt.instance_ids), attempt.useful_instance_seconds
        for index, known in enumerate(usage):
            if (known.instance_type, known.zone, known.market) == pool:
                usage[index] = known.model_copy(
                    update={
                        "instance_seconds": known.instance_seconds + spent,
                        "useful_instance_seconds": known.useful_instance_seconds + useful,
                    }
                )
                break
        else:
            usage.append(
                PoolUsage(
                    instance_type=pool[0],
                    zone=pool[1],
                    market=market,
                    instance_seconds=spent,
                    useful_instance_seconds=useful,
                )
            )
        return RetiredAttempts(
            count=self.count + 1,
            runtime_seconds=self.runtime_seconds + held,
            usage=tuple(usage),
            no_capacity_in_a_row=in_a_row,
            boot_deaths_in_a_row=boot_deaths,
            unhealthy_in_a_row=unhealthy,
            progressed=progressed,
            trained_seconds=trained,
        )

    @property
    def runtime(self) -> timedelta:
        return timedelta(seconds=self.runtime_seconds)

    @property
    def trained(self) -> timedelta:
        return timedelta(seconds=self.trained_seconds)
