"""The job store's typed errors: what a write or a read can say besides its answer.

`service.ports` re-exports them; a service handles each on purpose (a lost race is decided again on
the fresh record, a refused admission waits its turn, an unreadable record is skipped and counted).
"""

from __future__ import annotations

from collections.abc import Mapping


class JobNotFoundError(LookupError):
    def __init__(self, job_id: str) -> None:
        super().__init__(f"no job {job_id}")
        self.job_id = job_id


class JobExistsError(Exception):
    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id} already exists")
        self.job_id = job_id


class ConcurrentUpdateError(Exception):
    """The job changed since it was read: the conditional write lost a race."""

    def __init__(self, job_id: str, expected_version: int) -> None:
        super().__init__(f"job {job_id} changed since version {expected_version} was read")
        self.job_id = job_id
        self.expected_version = expected_version


class AdmissionRefusedError(Exception):
    """An admission's ceilings no longer hold: its team's (or the fleet's) GPUs in use grew past what
    the admission was decided on, so the write (job and ledger) was refused. Not a lost race to
    retry at once: the job waits its turn again."""

    def __init__(self, job_id: str, ceilings: Mapping[str, int]) -> None:
        named = ", ".join(f"{k} <= {v}" for k, v in sorted(ceilings.items()))
        super().__init__(f"job {job_id}: admission refused, the ledger passed its ceilings ({named})")
        self.job_id = job_id
        self.ceilings = dict(ceilings)


class JobRecordTooLargeError(Exception):
    """The job's record would pass the store's item size limit (DynamoDB: 400 KB), so the write
    was refused. Not a race to retry: the same write fails again. Handlers count it
    (`JobRecordsTooLarge`, alarmed) and let the event fail into its dead-letter path."""

    def __init__(self, job_id: str, size: int, limit: int) -> None:
        super().__init__(f"job {job_id}: record of {size} bytes is over the {limit}-byte item limit")
        self.job_id = job_id
        self.size = size
        self.limit = limit


class UnreadableJobError(Exception):
    """A stored job record this release cannot read (say, a state or reason a newer release added,
    after a rollback). Names the item's key, so that an operator can look at it; a listing that is
    handed `on_unreadable` skips such an item rather than failing for every other job."""

    def __init__(self, job_id: str, problem: str) -> None:
        super().__init__(f"job {job_id}: record unreadable by this release: {problem}")
        self.job_id = job_id
        self.problem = problem
