"""The GPU ledger: what each team's jobs hold and how many wait, kept exactly by every write.

One item of the jobs table holds counters: GPUs held by the fleet (`gpus`), by each team
(`gpus/<team>`), borrowed beyond each team's quota (`borrowed/<team>`), by each team in each
instance family it has gangs up in (`gpus/<team>/<family>`), and jobs waiting for admission
(`waiting`, `waiting/<team>`). They are never set, only added to: every write of a job carries the
difference between what the job held before and after it (`change_of`), in the same transaction as
the job's own conditional write. Each record says what the ledger counts for it (`Job.ledgered`,
written with it), so a write's change is what the record stands for now less that: a write that
loses its race adds nothing, one retried on a fresh record adds that record's change, one after a
write of an older release (which carried `ledgered` as it was) sets it right, and the counters
equal the sum over the records (`truth`) after every write, whatever raced. An admission adds with ceilings: the transaction fails
unless the team's and the fleet's GPUs in use were at most the ceilings the admission was decided
on (its quota less its own GPUs), so two admissions racing for the last GPUs cannot both pass.

What a job holds is derived from its record, never stored twice: a counted job (`Job.counted`) with
an admission holds its spec's GPUs until it ends; a counted job that is QUEUED without one waits.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpujobs.domain.job import Job, Ledgered
from gpujobs.domain.states import JobState

FLEET_GPUS = "gpus"
FLEET_WAITING = "waiting"


def team_gpus(team: str) -> str:
    return f"gpus/{team}"


def team_borrowed(team: str) -> str:
    return f"borrowed/{team}"


def team_waiting(team: str) -> str:
    return f"waiting/{team}"


def family_gpus(team: str, family: str) -> str:
    return f"gpus/{team}/{family}"


def family_of(instance_type: str) -> str:
    """An EC2 instance family: what comes before the size (`p5`, `g6e`, `p4de`)."""
    return instance_type.split(".", 1)[0]


def gpus_of(job: Job) -> int:
    """The GPUs a job's gang holds: nodes x GPUs per node."""
    spec = job.require_spec()
    return spec.nodes * spec.gpus_per_node


def holds(job: Job) -> bool:
    return job.counted and job.admission is not None and job.spec is not None and not job.state.is_terminal


def waits(job: Job) -> bool:
    """In the admission queue: counted, QUEUED, never admitted (or preempted since)."""
    return job.counted and job.admission is None and job.spec is not None and job.state is JobState.QUEUED


def counters_of(job: Job | None) -> Counter[str]:
    """What one job record stands for in the ledger."""
    found: Counter[str] = Counter()
    if job is None:
        return found
    if holds(job):
        assert job.admission is not None
        gpus = gpus_of(job)
        found[FLEET_GPUS] += gpus
        found[team_gpus(job.team)] += gpus
        if job.admission.borrowed:
            found[team_borrowed(job.team)] += job.admission.borrowed
        attempt = job.current_attempt
        if attempt is not None and not attempt.is_over and attempt.instance_ids and attempt.instance_type:
            found[family_gpus(job.team, family_of(attempt.instance_type))] += gpus
    elif waits(job):
        found[FLEET_WAITING] += 1
        found[team_waiting(job.team)] += 1
    return found


@dataclass(frozen=True)
class LedgerChange:
    """What one job write adds to the ledger, and the ceilings its admission was decided under."""

    adds: Mapping[str, int] = field(default_factory=dict)
    ceilings: Mapping[str, int] = field(default_factory=dict)
    """counter -> the most it may be before this write adds to it (an admission's quota check)."""

    def __bool__(self) -> bool:
        return bool(self.adds) or bool(self.ceilings)


def change_of(job: Job) -> LedgerChange:
    """The ledger's part of writing `job`: what it stands for now, less what the ledger counts for
    it (`Job.ledgered`, as its last write left it; nothing for a new job)."""
    was, now = job.ledgered.counters, counters_of(job)
    names = sorted(set(was) | set(now))
    adds = {name: now.get(name, 0) - was.get(name, 0) for name in names if now.get(name, 0) != was.get(name, 0)}
    ceilings: dict[str, int] = {}
    admission = job.admission
    if admission is not None and holds(job) and not job.ledgered.holds:
        if admission.team_ceiling is not None:
            ceilings[team_gpus(job.team)] = admission.team_ceiling
        if admission.fleet_ceiling is not None:
            ceilings[FLEET_GPUS] = admission.fleet_ceiling
    return LedgerChange(adds, ceilings)


def off_the_ledger(job: Job) -> bool:
    """What the ledger counts for the record is not what it stands for: a write of an older release
    (which carried `ledgered` as it was) changed it; the next write of this one sets it right."""
    return job.counted and (dict(job.ledgered.counters) != dict(counters_of(job)) or job.ledgered.holds != holds(job))


def ledgered(job: Job) -> Job:
    """`job` as it is written: saying what the ledger counts for it from this write on."""
    standing = Ledgered(counters=dict(counters_of(job)), holds=holds(job))
    return job if job.ledgered == standing else job.model_copy(update={"ledgered": standing})


@dataclass(frozen=True)
class Ledger:
    """The counters as read."""

    counters: Mapping[str, int] = field(default_factory=dict)

    def get(self, name: str) -> int:
        return int(self.counters.get(name, 0))

    @property
    def gpus(self) -> int:
        return self.get(FLEET_GPUS)

    @property
    def waiting(self) -> int:
        return self.get(FLEET_WAITING)

    def team(self, team: str) -> int:
        return self.get(team_gpus(team))

    def borrowed(self, team: str) -> int:
        return self.get(team_borrowed(team))

    def team_waiting(self, team: str) -> int:
        return self.get(team_waiting(team))

    def teams(self) -> set[str]:
        return {name.split("/")[1] for name in self.counters if name.count("/") >= 1}

    def added(self, change: LedgerChange) -> Ledger:
        counters = Counter(self.counters)
        counters.update(change.adds)
        return Ledger({k: v for k, v in counters.items() if v})


def truth(jobs: Iterable[Job]) -> Ledger:
    """The ledger the records stand for: what the counters must equal."""
    total: Counter[str] = Counter()
    for job in jobs:
        total.update(counters_of(job))
    return Ledger({k: v for k, v in total.items() if v})
