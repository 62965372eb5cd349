"""Which waiting jobs start, in which order, and what is preempted for them: pure decisions.

**Room.** A team's own jobs may hold up to its quota (`gpus`); a team that may `borrow` may hold
more on the idle quota of teams that `lend` (the pool: every lender's quota it does not use, less
what is already lent); the fleet may hold at most its cap (`max_gpus`). A job holds its GPUs
(nodes x GPUs per node) from its admission until it ends or is preempted, whether its gang is up,
waiting for EC2 capacity or being replaced.

**Order** (`plan`). Each team's waiting jobs are in priority order, a class higher for every
`AGING_STEP` waited (up to `high`), then by submission; between teams, the next job is the head of
the team holding the fewest GPUs per unit of `weight` (weighted fair share on the one resource
that is scarce). A head that fits is admitted and the shares are recomputed; heads within their team's own quota go
first, those that must borrow in a second round, so a lender is never beaten to its own GPUs. A
head its own quota cannot take (and that may not borrow), or whose team is paused, waits without
holding others up.
A head the fleet's cap cannot take stops every admission after it, and one that cannot borrow
stops every borrowing after it: nobody overtakes a job for the room it waits for.

**No starvation.** A waiting job whose GPUs fit its team's quota (or what may be borrowed) and the
fleet's cap is admitted once the jobs ahead of it have started or ended. Ahead of it are, in its
team, jobs of a higher effective class or submitted earlier (after `2 x AGING_STEP` it is `high`,
so only the finitely many jobs submitted before it), and other teams only while their weighted
share is lower than its team's, which every admission of theirs raises. So as long as admitted
jobs end (every spec has `max_runtime_minutes`), every such job starts.

**Preemption** (`victims`). Borrowed GPUs are lent, not given: when the lenders' own use leaves the
pool overdrawn, or a waiting job that fits its team's quota finds the fleet full of other teams'
borrowed jobs, borrowed jobs are preempted (any class); a waiting job that needs to borrow may
preempt borrowed jobs of a strictly lower class. Victims: lowest class first, then the newest
checkpoint first (the least work lost), then the most recent admission. A victim is asked to
checkpoint and stops only after that commit or `fate.PREEMPTION_GRACE`, the spot warning's two
minutes, so a preemption never loses more than a spot interruption; it then waits again in its
place (its submission time).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING

from gpujobs.domain.job import Admission, Job
from gpujobs.domain.ledger import Ledger, gpus_of, holds, waits
from gpujobs.domain.spec_parts import Priority
from gpujobs.domain.states import JobState, Reason

if TYPE_CHECKING:
    from gpujobs.domain.team_quotas import TeamQuota
    from gpujobs.domain.teams import TeamDirectory

AGING_STEP = timedelta(hours=6)
"""A waiting job is ordered one priority class higher for each of these it has waited."""
TOP_RANK = max(p.rank for p in Priority)


class Blocked(StrEnum):
    """Why a job waits (the first words of what `status` says)."""

    DRAINED = "the fleet is drained"
    PAUSED = "its team is paused"
    TEAM_QUOTA = "its team's quota is in use"
    FLEET_CAP = "the fleet's GPU cap is reached"
    POOL = "no idle quota to borrow"
    BEHIND = "waits its turn: jobs ahead of it wait for the same room"


@dataclass(frozen=True)
class Waiting:
    job_id: str
    blocked: Blocked
    detail: str


@dataclass(frozen=True)
class Plan:
    admit: tuple[tuple[str, Admission], ...] = ()
    """In order: (job id, its admission)."""
    preempt: tuple[str, ...] = ()
    """Jobs to preempt, in the victims' order."""
    waiting: Mapping[str, Waiting] = field(default_factory=dict)
    """Every waiting job not admitted, and why."""
    order: tuple[str, ...] = ()
    """Every waiting job in the order they would start (the `gpujobs queue` positions)."""


def effective_rank(job: Job, now: datetime) -> int:
    waited = max(timedelta(0), now - job.created_at)
    return min(TOP_RANK, job.require_spec().priority.rank + int(waited / AGING_STEP))


def queue_key(job: Job, now: datetime) -> tuple[int, datetime, str]:
    """A team's queue order: effective class (highest first), then submission, then id."""
    return (-effective_rank(job, now), job.created_at, job.job_id)


@dataclass
class _Room:
    """The counts a plan works on: what the ledger says, changed by the plan's own admissions."""

    directory: TeamDirectory
    used: dict[str, int]
    borrowed: dict[str, int]
    fleet: int

    @classmethod
    def of(cls, ledger: Ledger, directory: TeamDirectory, teams: Iterable[str]) -> _Room:
        names = set(teams) | set(directory.teams) | ledger.teams()
        return cls(
            directory,
            {t: ledger.team(t) for t in names},
            {t: ledger.borrowed(t) for t in names},
            ledger.gpus,
        )

    def quota(self, team: str) -> TeamQuota:
        return self.directory.quota(team)

    def own(self, team: str) -> int:
        return self.used.get(team, 0) - self.borrowed.get(team, 0)

    def pool(self, *, excluding: str | None = None) -> int:
        """Idle quota of the lenders, less what is lent out; `excluding` a borrower, whose own idle
        quota is its own, not something it borrows."""
        idle = sum(
            max(0, q.gpus - self.own(t))
            for t, q in ((t, self.quota(t)) for t in set(self.used) | set(self.directory.teams))
            if q.lend and q.gpus is not None and t != excluding
        )
        return idle - sum(self.borrowed.values())

    def share(self, team: str) -> float:
        return self.used.get(team, 0) / self.quota(team).weight

    def fit(self, job: Job) -> tuple[int, Blocked | None]:
        """(GPUs it would borrow, None) when it fits now, else (0, why not)."""
        team, gpus = job.team, gpus_of(job)
        quota, cap = self.quota(team), self.directory.fleet.max_gpus
        if self.directory.fleet.drain:
            return 0, Blocked.DRAINED
        if quota.paused:
            return 0, Blocked.PAUSED
        if cap is not None and self.fleet + gpus > cap:
            return 0, Blocked.FLEET_CAP
        if quota.gpus is None or self.own(team) + gpus <= quota.gpus:
            return 0, None
        if not quota.borrow:
            return 0, Blocked.TEAM_QUOTA
        needed = self.own(team) + gpus - quota.gpus
        if needed > max(0, self.pool(excluding=team)):
            return 0, Blocked.POOL
        return needed, None

    def admission(self, job: Job, borrowed: int, now: datetime) -> Admission:
        team, gpus = job.team, gpus_of(job)
        quota, cap = self.quota(team), self.directory.fleet.max_gpus
        team_ceiling = None
        if quota.gpus is not None and not borrowed:  # within its own: no other own job may have raced in
            team_ceiling = quota.gpus + self.borrowed.get(team, 0) - gpus
        detail = f"team {team} holds {self.used.get(team, 0)} GPU(s)" + (
            f" of its {quota.gpus}" if quota.gpus is not None else ""
        )
        if borrowed:
            detail += f"; borrows {borrowed} of other teams' idle quota"
        return Admission(
            at=now,
            borrowed=borrowed,
            team_ceiling=team_ceiling,
            fleet_ceiling=None if cap is None else cap - gpus,
            detail=detail,
        )

    def take(self, job: Job, borrowed: int) -> None:
        gpus = gpus_of(job)
        self.used[job.team] = self.used.get(job.team, 0) + gpus
        self.borrowed[job.team] = self.borrowed.get(job.team, 0) + borrowed
        self.fleet += gpus

    def describe(self, job: Job, blocked: Blocked) -> str:
        team, quota, cap = job.team, self.quota(job.team), self.directory.fleet.max_gpus
        if blocked is Blocked.TEAM_QUOTA:
            return f"{blocked.value}: {team} holds {self.own(team)} of its {quota.gpus} GPU(s), it asks {gpus_of(job)}"
        if blocked is Blocked.FLEET_CAP:
            return f"{blocked.value}: {self.fleet} of {cap} GPU(s) held, it asks {gpus_of(job)}"
        if blocked is Blocked.POOL:
            pool = max(0, self.pool(excluding=team))
            return f"{blocked.value}: {team} holds {self.used.get(team, 0)} (quota {quota.gpus}), the pool has {pool}"
        return blocked.value


def admit_at_once(job: Job, ledger: Ledger, directory: TeamDirectory, now: datetime) -> Admission | Waiting:
    """A submission's own admission, without the queue: only when it fits without borrowing and no
    other job of its team waits (its own count is in the ledger), nor any job at all under a fleet
    cap (a head waiting for the cap's room is overtaken by nobody); else it waits for the plan."""
    room = _Room.of(ledger, directory, (job.team,))
    borrowed, blocked = room.fit(job)
    others_wait = ledger.team_waiting(job.team) > 1 or (directory.fleet.max_gpus is not None and ledger.waiting > 1)
    if blocked is None and borrowed == 0 and not others_wait:
        return room.admission(job, 0, now)
    if blocked is None:  # it fits, but others wait (the plan orders them) or it must borrow (the plan lends)
        blocked = Blocked.BEHIND if others_wait else Blocked.TEAM_QUOTA
    return Waiting(job.job_id, blocked, room.describe(job, blocked))


def plan(
    waiting: Sequence[Job], holders: Sequence[Job], ledger: Ledger, directory: TeamDirectory, now: datetime
) -> Plan:
    """Admissions and preemptions for one reconciler tick (see the module docstring)."""
    queues: dict[str, list[Job]] = defaultdict(list)
    for job in waiting:
        if waits(job):
            queues[job.team].append(job)
    for queue in queues.values():
        queue.sort(key=lambda j: queue_key(j, now))
    planning = _Planning(queues, _Room.of(ledger, directory, queues), now)
    borrowing = planning.round(list(queues), may_borrow=False)
    planning.round(borrowing, may_borrow=True)
    room, blocked_on = planning.room, planning.blocked_on
    fleet_blocked, pool_blocked = blocked_on.get(Blocked.FLEET_CAP), blocked_on.get(Blocked.POOL)
    preempt = victims(holders, room, fleet_blocked=fleet_blocked, pool_blocked=pool_blocked)
    return Plan(tuple(planning.admit), preempt, planning.held, tuple(planning.order))


@dataclass
class _Planning:
    queues: dict[str, list[Job]]
    room: _Room
    now: datetime
    admit: list[tuple[str, Admission]] = field(default_factory=list)
    order: list[str] = field(default_factory=list)
    held: dict[str, Waiting] = field(default_factory=dict)
    blocked_on: dict[Blocked, Job] = field(default_factory=dict)
    """The first head the fleet's cap (or the borrowing pool) could not take: nobody overtakes it."""

    def round(self, teams: Sequence[str], *, may_borrow: bool) -> list[str]:
        """Admit the heads of `teams` by weighted share while they fit. Without `may_borrow` (the
        first round) a head that fits only on borrowed quota is set aside for the second: a job within
        its own quota goes before any that borrows, so a lender's job is never beaten to its own
        GPUs. Returns the teams set aside."""
        room, queues = self.room, self.queues
        heads = [(room.share(t), t) for t in teams]
        heapq.heapify(heads)
        set_aside: list[str] = []
        while heads:
            _, team = heapq.heappop(heads)
            queue = queues[team]
            head = queue[0]
            borrowed, blocked = room.fit(head)
            if blocked is None and borrowed and not may_borrow:
                set_aside.append(team)
                continue
            fleet_blocked, pool_blocked = Blocked.FLEET_CAP in self.blocked_on, Blocked.POOL in self.blocked_on
            if blocked is None and (fleet_blocked or (borrowed and pool_blocked)):
                blocked = Blocked.BEHIND
            if blocked is None:
                self.admit.append((head.job_id, room.admission(head, borrowed, self.now)))
                self.order.append(head.job_id)
                room.take(head, borrowed)
                queue.pop(0)
                if queue:
                    heapq.heappush(heads, (room.share(team), team))
                continue
            if blocked in (Blocked.FLEET_CAP, Blocked.POOL):
                self.blocked_on.setdefault(blocked, head)
            for job in queue:  # the rest of its team waits behind its head
                self.order.append(job.job_id)
                why = blocked if job is head else Blocked.BEHIND
                self.held[job.job_id] = Waiting(job.job_id, why, room.describe(job, why))
        return set_aside


def victims(
    holders: Sequence[Job], room: _Room, *, fleet_blocked: Job | None, pool_blocked: Job | None
) -> tuple[str, ...]:
    """Borrowed jobs to preempt so that lenders get their quota back and blocked heads their room."""
    being_preempted = [j for j in holders if _preempting(j)]
    candidates = sorted((j for j in holders if _preemptible(j)), key=_victim_key)
    freeing_pool = sum(_borrowed(j) for j in being_preempted)
    freeing_fleet = sum(gpus_of(j) for j in being_preempted)
    chosen: list[Job] = []

    def take(need: int, count: Callable[[Job], int], eligible: Callable[[Job], bool]) -> None:
        for job in candidates:
            if need <= 0:
                return
            if job in chosen or not eligible(job):
                continue
            chosen.append(job)
            need -= count(job)

    overdraft = -room.pool() - freeing_pool  # lenders took back what is lent
    take(overdraft, _borrowed, lambda _j: True)
    if fleet_blocked is not None and room.quota(fleet_blocked.team).gpus is not None:
        own_fits = room.own(fleet_blocked.team) + gpus_of(fleet_blocked) <= (room.quota(fleet_blocked.team).gpus or 0)
        if own_fits:  # a team reclaiming its own quota from other teams' borrowed jobs
            cap = room.directory.fleet.max_gpus or 0
            need = room.fleet + gpus_of(fleet_blocked) - cap - freeing_fleet - sum(gpus_of(j) for j in chosen)
            take(need, gpus_of, lambda j: j.team != fleet_blocked.team)
    if pool_blocked is not None:
        rank = pool_blocked.require_spec().priority.rank
        quota = room.quota(pool_blocked.team).gpus or 0
        pool = max(0, room.pool(excluding=pool_blocked.team))
        need = room.own(pool_blocked.team) + gpus_of(pool_blocked) - quota - pool - freeing_pool
        need -= sum(_borrowed(j) for j in chosen)
        take(need, _borrowed, lambda j: j.require_spec().priority.rank < rank)
    return tuple(j.job_id for j in chosen)


def _borrowed(job: Job) -> int:
    return job.admission.borrowed if job.admission is not None else 0


def _preemptible(job: Job) -> bool:
    return (
        holds(job)
        and job.admission is not None
        and job.admission.borrowed > 0
        and job.stop_request is None
        and job.state in (JobState.RUNNING, JobState.QUEUED)
    )


def _preempting(job: Job) -> bool:
    return job.stop_request is not None and job.stop_request.reason is Reason.PREEMPTED and holds(job)


def _victim_key(job: Job) -> tuple[int, float, float]:
    """Lowest class first, then the newest checkpoint (least lost), then the latest admission."""
    attempt = job.current_attempt
    checkpoint = attempt.checkpoint_at if attempt is not None else None
    admitted = job.admission.at if job.admission is not None else job.created_at
    return (
        job.require_spec().priority.rank,
        -(checkpoint.timestamp() if checkpoint is not None else 0.0),
        -admitted.timestamp(),
    )
