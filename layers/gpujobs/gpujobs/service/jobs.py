"""Use cases of the control plane core: submit, launch, cancel.

Each follows the same shape (`service.changes`): load the job, decide (pure, `domain.launching`),
write the decision conditionally on the version read, then act on AWS (the write's state changes
are published from the table's stream, `service.outbox`). A lost race is not an error to the
caller: the loser decides again on the fresh record. A redelivered message maps to the same
deterministic job id, so it can never create a second job or a second set of instances.

Submissions come from whoever may send to the queue, so a job id is only ever taken by a spec that
its sender may submit for its team (`domain.teams`): a refused or invalid submission is recorded
REJECTED under the id of its own message, never under the (team, client_token) id a valid spec would
take, and a token reused with a different spec is a conflict recorded the same way, never mapped
onto the job that token names. A cancel is honoured only from a principal of the job's team.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpujobs.domain.budget import BudgetMode, BudgetPolicy, launch_hold
from gpujobs.domain.credentials import redact
from gpujobs.domain.effects import Decision, Effect, Outcome
from gpujobs.domain.job import Job
from gpujobs.domain.job_ids import JOB_ID, job_id_for
from gpujobs.domain.launching import cancel, claim_launch, invocation_lease, wait_for_admission
from gpujobs.domain.ledger import waits
from gpujobs.domain.spec import JobSpec, parse_document, validate_spec
from gpujobs.domain.spec_errors import SpecError
from gpujobs.domain.states import JobState
from gpujobs.service.changes import Actuator, Applied, WriteCounter, change, wants_launch
from gpujobs.service.config import LaunchConfig
from gpujobs.service.ports import (
    AdmissionRefusedError,
    JobExistsError,
    Ports,
)

if TYPE_CHECKING:
    from gpujobs.domain.teams import TeamDirectory
    from gpujobs.service.launcher import Launcher
    from gpujobs.service.regroups import Regrouper

log = logging.getLogger(__name__)

DIRECTORY_TTL_SECONDS = 60.0
"""How long a container trusts the team configuration it read before reading it again."""


class CancelRefusedError(Exception):
    """A cancel from a sender that may not act for the job's team: logged, counted and consumed."""

    def __init__(self, job_id: str, sender: str | None) -> None:
        super().__init__(f"{sender or '(unknown sender)'} may not cancel {job_id}")
        self.job_id = job_id
        self.sender = sender


@dataclass(frozen=True)
class SubmitOutcome:
    job: Job
    created: bool
    """False when the message or client token had already produced this job."""


@dataclass
class JobService:
    """Submit, launch and cancel, and the one write path every reaction and repair goes through."""

    ports: Ports
    config: LaunchConfig
    actuator: Actuator = field(init=False)
    _written: WriteCounter | None = field(init=False, default=None)
    _directory: tuple[float, TeamDirectory] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.actuator = Actuator(self.ports)
        if self.ports.metrics is not None:
            self._written = WriteCounter(self.ports.metrics, self.ports.prices.on_demand_table)

    @property
    def team_directory(self) -> TeamDirectory:
        """Loaded on first use and again once `DIRECTORY_TTL` old (a Lambda container keeps one
        service), so a quota, a pause or a drain reaches every container within a minute; the team
        rules are imported then too: only a submission and a launch read them."""
        loaded = self._directory
        if loaded is None or time.monotonic() - loaded[0] >= DIRECTORY_TTL_SECONDS:
            loaded = self._directory = (time.monotonic(), self.load_team_directory())
        return loaded[1]

    def load_team_directory(self) -> TeamDirectory:
        """The team configuration as it is now (the reconciler reads it at every run)."""
        from gpujobs.domain.teams import TeamDirectory

        teams = self.ports.teams
        return TeamDirectory.open() if teams is None else teams.load()

    # ---- the one way to change a job ----------------------------------------------------------
    def change(self, job_id: str, decide: Callable[[Job], Decision], *, first: Job | None = None) -> Applied:
        """Load (or take `first`, read consistently moments ago), decide, write conditionally
        (retrying lost races); act with `act()`. What the write changed is published from the table's
        stream (`service.outbox`)."""
        ports = self.ports
        return change(
            ports.store,
            job_id,
            decide,
            backoff=ports.backoff,
            written=self._written,
            first=first,
        )

    def act(self, applied: Applied) -> Job:
        """Carry out the decision's effects; a due launch comes last and its result is returned."""
        self.carry_out(applied.decision.effects)
        return self.launch(applied.after.job_id) if wants_launch(applied.decision) else applied.after

    def carry_out(self, effects: Sequence[Effect]) -> None:
        self.actuator.carry_out(effects)

    # ---- submit ---------------------------------------------------------------------------
    def handle_message(self, body: str, *, message_id: str, sender: str | None = None) -> SubmitOutcome:
        """One SQS message from `sender` (its SenderId): a job spec to run, or `{"cancel_job_id": ...}`.

        Raises CancelRefusedError for a cancel `sender` may not make, JobNotFoundError for a cancel
        naming no job; anything the message itself gets wrong is recorded REJECTED.
        """
        try:
            document = parse_document(body)
            if set(document) == {"cancel_job_id"}:
                return SubmitOutcome(self._cancel_from(sender, document["cancel_job_id"]), created=False)
            spec = validate_spec(
                document,
                allowed_instance_types=self.config.allowed_instance_types or None,
                priced_instance_types=self.config.priced_instance_types,
            )
            refusal = self.team_directory.refusal(spec, sender)
            if refusal:
                raise SpecError(refusal)
        except SpecError as exc:
            return self._reject(body, exc.problems, message_id=message_id)
        return self.submit(spec, message_id=message_id)

    def submit(self, spec: JobSpec, *, message_id: str) -> SubmitOutcome:
        """Record and launch an admitted spec. Its client_token names one job: the same spec again
        is that job; a different spec under the same token is rejected as a conflict."""
        job_id = job_id_for(client_token=spec.client_token, team=spec.team, message_id=message_id)
        created = True
        try:
            job = self.ports.store.create(
                Job.submitted(job_id=job_id, spec=spec, now=self.ports.clock.now(), message_id=message_id)
            )
        except JobExistsError:
            job, created = self.ports.store.get(job_id), False
            if job.spec != spec:
                conflict = (
                    f"client_token: {spec.client_token!r} of team {spec.team!r} already names job {job_id}"
                    " with a different spec; use a new client_token for a new job"
                )
                return self._reject(spec.model_dump_json(), [conflict], message_id=message_id)
        if job.state is JobState.QUEUED or job.state is JobState.LAUNCHING:
            job = self.launch(job.job_id)
        return SubmitOutcome(job, created)

    def _reject(self, body: str, problems: list[str], *, message_id: str) -> SubmitOutcome:
        """Record a refused message under its own message's id: never under an id a valid spec could take."""
        job_id = job_id_for(client_token=None, team=None, message_id=message_id)
        rejected = Job.rejected(
            job_id=job_id,
            problems=problems,
            excerpt=redact(body[:2048]),
            now=self.ports.clock.now(),
            message_id=message_id,
        )
        try:
            job = self.ports.store.create(rejected)
        except JobExistsError:
            return SubmitOutcome(self.ports.store.get(job_id), created=False)
        return SubmitOutcome(job, created=True)

    # ---- launch ---------------------------------------------------------------------------
    def launch(self, job_id: str) -> Job:
        """Start (or take over) a launch for a job that is due one; a no-op for any other job."""
        policies: dict[str, BudgetPolicy] = {}  # one read of the team's policy: the claim and the walk judge alike

        def policy(job: Job) -> BudgetPolicy:
            if job.team not in policies:
                policies[job.team] = self.ports.budgets.policy_for(job.team)
            return policies[job.team]

        def hold(job: Job) -> str | None:
            """Why the budget holds this job's launches (`domain.budget.launch_hold`), or None."""
            return None if job.spec is None else launch_hold(job, policy(job), now=self.ports.clock.now())

        from gpujobs.domain.admission import Blocked, Waiting, admit_at_once  # the launch path's, not every handler's

        def claim(job: Job) -> Decision:
            lease, now, held = invocation_lease(self.ports.time_left()), self.ports.clock.now(), hold(job)
            if held is not None or not waits(job):
                return claim_launch(job, now=now, hold=held, lease=lease)
            verdict = admit_at_once(job, self.ports.store.ledger(), self.team_directory, now)
            if isinstance(verdict, Waiting):
                return wait_for_admission(job, blocked=verdict.blocked.value, detail=verdict.detail, now=now)
            return claim_launch(job, now=now, hold=None, lease=lease, admission=verdict)

        try:
            applied = self.change(job_id, claim)
        except AdmissionRefusedError:  # the room went to another admission meanwhile: it waits its turn
            busy = f"{Blocked.BEHIND.value}: another admission took the room first"
            now = self.ports.clock.now()
            applied = self.change(
                job_id, lambda job: wait_for_admission(job, blocked=Blocked.BEHIND, detail=busy, now=now)
            )
        owned = applied.after
        attempt = owned.current_attempt
        if owned.state is JobState.RUNNING and attempt is not None and attempt.regroup is not None:
            return self._regrouper.launch(owned, held=hold(owned))  # if it waits for a node's replacement
        if applied.decision.outcome is not Outcome.LAUNCH_CLAIMED:  # not due, or held by the budget
            return owned
        return self._launcher.walk(owned, spot_only=policy(owned).mode is BudgetMode.SPOT_ONLY)

    @functools.cached_property
    def _regrouper(self) -> Regrouper:
        from gpujobs.service.regroups import Regrouper

        return Regrouper(self._launcher)

    @functools.cached_property
    def _launcher(self) -> Launcher:
        """The ladder walk, imported on the first launch: a function that only sometimes launches
        (a heartbeat, an idle alarm) never loads run documents, hardware or the ladder."""
        from gpujobs.service.launcher import Launcher

        return Launcher(ports=self.ports, config=self.config, jobs=self)

    # ---- cancel ---------------------------------------------------------------------------
    def _cancel_from(self, sender: str | None, job_id: object) -> Job:
        if not isinstance(job_id, str) or not JOB_ID.fullmatch(job_id):
            raise SpecError([f"cancel_job_id: must be a job id such as j-0123456789abcdef (got {str(job_id)[:40]!r})"])
        if not self.team_directory.may_act_for(self.ports.store.get(job_id).team, sender):
            raise CancelRefusedError(job_id, sender)
        return self.cancel(job_id)

    def cancel(self, job_id: str) -> Job:
        """Cancel a job and terminate every instance it still has. Cancelling twice is harmless."""
        return self.act(self.change(job_id, lambda job: cancel(job, now=self.ports.clock.now())))
