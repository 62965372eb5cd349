"""Use cases of the control plane core: submit, launch, cancel.

Each follows the same shape (`service.changes`): load the job, decide (pure, `domain.launching`),
write the decision conditionally on the version read, publish what changed, then act on AWS. A lost
race is not an error to the caller: the loser decides again on the fresh record. A redelivered
message maps to the same deterministic job id, so it can never create a second job or a second set
of instances.

Submissions come from whoever may send to the queue, so a job id is only ever taken by a spec that
its sender may submit for its team (`domain.teams`): a refused or invalid submission is recorded
REJECTED under the id of its own message, never under the (team, client_token) id a valid spec would
take, and a token reused with a different spec is a conflict recorded the same way, never mapped
onto the job that token names. A cancel is honoured only from a principal of the job's team.
"""

from __future__ import annotations

import functools
import logging
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from gpujobs.domain.budget import BudgetMode
from gpujobs.domain.credentials import redact
from gpujobs.domain.deadline import launch_markets
from gpujobs.domain.effects import Decision, Effect, Outcome
from gpujobs.domain.gangs import is_partial_gang, placement_group_of, started_over
from gpujobs.domain.hardware import InstanceHardware, efa_interfaces
from gpujobs.domain.job import Attempt, Job, LaunchTry, Market, job_id_for
from gpujobs.domain.job_access import session_policy_json, session_tags
from gpujobs.domain.ladder import PLACEMENT_GROUP_LIMIT_EXCEEDED, Rung, SubnetZone, next_try_at, plan_ladder
from gpujobs.domain.launching import LAUNCH_LEASE, Gang, cancel, claim_launch, end_launch, record_launch
from gpujobs.domain.rundoc import RunDocument, RunDocumentPointer, run_document
from gpujobs.domain.spec import JobSpec, parse_document, validate_spec
from gpujobs.domain.spec_errors import SpecError
from gpujobs.domain.states import JobState, Reason
from gpujobs.domain.teams import TeamDirectory
from gpujobs.service.changes import Actuator, Applied, Backoff, change, publish_changes, wants_launch
from gpujobs.service.ports import (
    BlobStore,
    BudgetBook,
    CapacityError,
    Clock,
    Compute,
    ConcurrentUpdateError,
    EventPublisher,
    IdleAlarms,
    JobExistsError,
    JobStore,
    LaunchedInstance,
    LaunchRejectedError,
    LaunchRequest,
    LaunchTokenMismatchError,
    ReportKeys,
    Signaller,
    TeamConfigSource,
)

log = logging.getLogger(__name__)

JOB_ID_PATTERN = r"^j-[0-9a-f]{16}$"


class CancelRefusedError(Exception):
    """A cancel from a sender that may not act for the job's team: logged, counted and consumed."""

    def __init__(self, job_id: str, sender: str | None) -> None:
        super().__init__(f"{sender or '(unknown sender)'} may not cancel {job_id}")
        self.job_id = job_id
        self.sender = sender


@dataclass(frozen=True)
class LaunchConfig:
    checkpoint_bucket: str
    event_bus_name: str
    region: str
    allowed_instance_types: tuple[str, ...] = ()
    priced_instance_types: frozenset[str] | None = None
    """Types with a known price; a spec with `max_cost_usd` over any other type is refused."""
    job_role_arn: str = ""
    """Named in every run document: the role the bootstrap assumes for the container (none: the instance's)."""
    job_log_group: str = ""
    hardware: Mapping[str, InstanceHardware] = field(default_factory=dict)
    """Each type's EFA interfaces and instance store (`adapters.catalog.packaged_hardware`); an unknown type has neither."""


@dataclass(frozen=True)
class SubmitOutcome:
    job: Job
    created: bool
    """False when the message or client token had already produced this job."""


UserDataRenderer = Callable[[RunDocument | RunDocumentPointer], str | bytes]


@dataclass
class JobService:
    store: JobStore
    compute: Compute
    publisher: EventPublisher
    blobs: BlobStore
    clock: Clock
    config: LaunchConfig
    render_user_data: UserDataRenderer
    budgets: BudgetBook
    alarms: IdleAlarms
    report_keys: ReportKeys
    """Each launch hands its attempt a report key in user data (domain.report_auth)."""
    teams: TeamConfigSource | None = None
    """Who may act for which team; None: no team configuration (single-tenant, see domain.teams)."""
    jitter: Callable[[], float] = field(default=random.random)
    backoff: Backoff = field(default_factory=Backoff)
    written: Callable[[Job, Job], None] | None = None  # counts what each write stands for (changes.WriteCounter)

    @functools.cached_property
    def team_directory(self) -> TeamDirectory:
        """Loaded on first use, once per service (a Lambda container keeps one service)."""
        return TeamDirectory.open() if self.teams is None else self.teams.load()

    # ---- the one way to change a job ----------------------------------------------------------
    def change(self, job_id: str, decide: Callable[[Job], Decision]) -> Applied:
        """Load, decide, write conditionally (retrying lost races) and publish; act with `act()`."""
        return change(self.store, job_id, decide, backoff=self.backoff, publisher=self.publisher, written=self.written)

    def act(self, applied: Applied, *, signaller: Signaller | None = None) -> Job:
        """Carry out the decision's effects; a due launch comes last and its result is returned."""
        self.carry_out(applied.decision.effects, signaller=signaller)
        return self.launch(applied.after.job_id) if wants_launch(applied.decision) else applied.after

    def carry_out(self, effects: Sequence[Effect], *, signaller: Signaller | None = None) -> None:
        Actuator(self.compute, self.alarms, signaller).carry_out(effects)

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
            job = self.store.create(
                Job.submitted(job_id=job_id, spec=spec, now=self.clock.now(), message_id=message_id)
            )
            self.publish_changes(None, job)
        except JobExistsError:
            job, created = self.store.get(job_id), False
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
            job_id=job_id, problems=problems, excerpt=redact(body[:2048]), now=self.clock.now(), message_id=message_id
        )
        try:
            job = self.store.create(rejected)
        except JobExistsError:
            return SubmitOutcome(self.store.get(job_id), created=False)
        self.publish_changes(None, job)
        return SubmitOutcome(job, created=True)

    # ---- launch ---------------------------------------------------------------------------
    def launch(self, job_id: str) -> Job:
        """Start (or take over) a launch for a job that is due one; a no-op for any other job."""
        applied = self.change(job_id, lambda job: claim_launch(job, now=self.clock.now(), hold=self._hold(job)))
        owned = applied.after
        if applied.decision.outcome is not Outcome.LAUNCH_CLAIMED:  # not due, or held by the budget
            return owned
        try:
            return self._walk_ladder(owned, spot_only=self.budgets.policy_for(owned.team).mode is BudgetMode.SPOT_ONLY)
        except Exception:
            self._release_lease(owned)
            raise

    def _hold(self, job: Job) -> str | None:
        """Why the budget holds this job's launches, or None when it does not."""
        policy = self.budgets.policy_for(job.team) if job.spec else None
        if policy is None or policy.mode is not BudgetMode.HOLD:
            return None
        return f"budget hold ({policy.scope}): {policy.reason}".strip()

    def _release_lease(self, job: Job) -> None:
        """After an unexpected error (a throttled RunInstances, say), let the retry take over at once
        instead of waiting out the lease. Best effort: if this write fails too, the lease expires."""
        attempt = job.current_attempt
        if attempt is None:
            return
        released = attempt.model_copy(update={"lease_expires_at": self.clock.now()})
        try:
            self.store.save(job.with_attempt(released, now=self.clock.now()))
        except Exception:
            log.warning("could not release the launch lease of %s", job.job_id, exc_info=True)

    def _walk_ladder(self, job: Job, *, spot_only: bool = False) -> Job:
        spec, attempt = job.require_spec(), job.current_attempt
        assert attempt is not None
        existing = self.compute.find_instances(job_id=job.job_id, attempt=attempt.number)
        if len(existing) >= spec.nodes:  # a crashed launcher got this far: adopt, never launch twice
            return self._record_launched(job, existing, subnet_id=attempt.subnet_id, tries=attempt.tries)
        if is_partial_gang(existing, nodes=spec.nodes):  # one gang per attempt: this one goes, a new one starts
            survivors = [i.instance_id for i in sorted(existing, key=lambda i: i.launch_index)]
            self.compute.terminate(survivors)
            try:
                restarted = self.store.save(started_over(job, survivors, now=self.clock.now(), lease=LAUNCH_LEASE))
            except ConcurrentUpdateError:
                return self.store.get(job.job_id)
            return self._walk_ladder(restarted, spot_only=spot_only)
        subnets = [SubnetZone(s.subnet_id, s.zone) for s in self.compute.subnets()]
        ladder = plan_ladder(
            spec,
            subnets,
            interruptions=job.interruptions,
            avoid_pool=_reclaimed_pool(job),
            spot_only=spot_only,
            deadline=launch_markets(job, now=self.clock.now()),
        )
        user_data = self._user_data(job, attempt)
        security_group = self.compute.job_security_group(job.job_id) if ladder else None
        tries = list(attempt.tries)
        for rung in ladder:
            request = replace(self._request(job, attempt, rung, user_data), security_group_id=security_group)
            try:
                launched = self.compute.run_instances(request)
            except CapacityError as exc:
                tries.append(_try(rung, exc.code, exc.message, self.clock.now()))
                if exc.code == PLACEMENT_GROUP_LIMIT_EXCEEDED:
                    break  # no rung fixes it; the reconciler's sweep of ended jobs' groups does
                continue
            except LaunchTokenMismatchError as exc:
                # An earlier launcher of this attempt sent this pool other parameters (its run
                # document named an older checkpoint). Adopt its gang if it is there; else move on.
                existing = self.compute.find_instances(job_id=job.job_id, attempt=attempt.number)
                if len(existing) >= spec.nodes:
                    return self._record_launched(job, existing, subnet_id=rung.subnet_id, tries=tuple(tries))
                tries.append(_try(rung, exc.code, exc.message, self.clock.now()))
                continue
            except LaunchRejectedError as exc:
                tries.append(_try(rung, exc.code, exc.message, self.clock.now()))
                return self._end_launch(job, tries, JobState.FAILED, Reason.LAUNCH_FAILED, f"{exc.code}: {exc.message}")
            return self._record_launched(job, launched, subnet_id=rung.subnet_id, tries=tuple(tries))
        if not ladder:
            return self._end_launch(
                job, tries, JobState.FAILED, Reason.LAUNCH_FAILED, "no market is allowed by the spec"
            )
        summary = ", ".join(f"{t.instance_type}/{t.zone}/{t.market}: {t.error_code}" for t in tries)
        return self._end_launch(job, tries, JobState.QUEUED, Reason.NO_CAPACITY, f"no capacity ({summary})")

    def _request(self, job: Job, attempt: Attempt, rung: Rung, user_data: str | bytes) -> LaunchRequest:
        spec = job.require_spec()
        subnet = next(s for s in self.compute.subnets() if s.subnet_id == rung.subnet_id)
        return LaunchRequest(
            job_id=job.job_id,
            attempt=attempt.number,
            team=spec.team,
            name=spec.name,
            count=spec.nodes,
            instance_type=rung.instance_type,
            subnet=subnet,
            market=rung.market,
            client_token=attempt.client_token(
                job.job_id, instance_type=rung.instance_type, subnet_id=rung.subnet_id, market=rung.market
            ),
            user_data=user_data,
            placement_group=placement_group_of(job, attempt),
            efa_interfaces=efa_interfaces(self.config.hardware, instance_type=rung.instance_type, nodes=spec.nodes),
        )

    def _user_data(self, job: Job, attempt: Attempt) -> str | bytes:
        doc = run_document(
            job,
            attempt,
            bucket=self.config.checkpoint_bucket,
            event_bus=self.config.event_bus_name,
            region=self.config.region,
            log_group=self.config.job_log_group,
            wait_for_attempt=_attempt_being_reclaimed(job, attempt),
            report_key=self.report_keys.key_for(job_id=job.job_id, attempt=attempt.number).hex(),
            access=self._job_access(job, attempt),
            hardware=self.config.hardware,
        )
        try:
            return self.render_user_data(doc)
        except ValueError:  # UserDataTooLargeError: the document goes to S3, user data points at it
            key = f"jobs/{job.job_id}/attempt-{attempt.number}/run.json"
            body = doc.model_dump_json(exclude={"report_key"})
            uri = self.blobs.put_text(key, body)
            return self.render_user_data(
                RunDocumentPointer.for_stored(uri, body.encode(), report_key=doc.report_key, doc=doc)
            )

    def _job_access(self, job: Job, attempt: Attempt) -> dict[str, Any]:
        """The run document's job role, session policy and tags; none when the stack has no job role."""
        if not self.config.job_role_arn:
            return {}
        team = job.require_spec().team
        return {
            "job_role_arn": self.config.job_role_arn,
            "session_policy": session_policy_json(
                bucket=self.config.checkpoint_bucket,
                job_id=job.job_id,
                team=team,
                data_buckets=self.team_directory.data_buckets(team),
            ),
            "session_tags": session_tags(job_id=job.job_id, team=team, attempt=attempt.number),
        }

    def _record_launched(
        self,
        job: Job,
        launched: Sequence[LaunchedInstance],
        *,
        subnet_id: str | None,
        tries: tuple[LaunchTry, ...],
    ) -> Job:
        first = launched[0]
        ordered = sorted(launched, key=lambda i: i.launch_index)
        gang = Gang(tuple(i.instance_id for i in ordered), first.instance_type, first.zone, first.market, subnet_id)
        number = self._attempt_number(job)
        applied = self.change(
            job.job_id,
            lambda current: record_launch(current, attempt_number=number, gang=gang, tries=tries, now=self.clock.now()),
        )
        return self.act(applied)

    def _end_launch(self, job: Job, tries: list[LaunchTry], target: JobState, reason: Reason, detail: str) -> Job:
        number = self._attempt_number(job)
        attempt = job.current_attempt
        assert attempt is not None
        self._delete_placement_group(job, attempt)

        def decide(current: Job) -> Decision:
            now = self.clock.now()
            retry_at = None
            if target is JobState.QUEUED:
                retry_at = next_try_at(current, now=now, jitter=self.jitter())
            return end_launch(
                current,
                attempt_number=number,
                tries=tuple(tries),
                target=target,
                reason=reason,
                detail=detail,
                next_try_at=retry_at,
                now=now,
            )

        return self.change(job.job_id, decide).after

    def _delete_placement_group(self, job: Job, attempt: Attempt) -> None:
        """An attempt that launched nothing gives its group back at once (a Region holds 500).
        Best effort: the reconciler sweeps whatever this misses."""
        group = placement_group_of(job, attempt)
        try:
            if group is not None:
                self.compute.delete_placement_group(group)
        except Exception:
            log.warning("could not delete placement group %s", group, exc_info=True)

    @staticmethod
    def _attempt_number(job: Job) -> int:
        attempt = job.current_attempt
        assert attempt is not None
        return attempt.number

    # ---- cancel ---------------------------------------------------------------------------
    def _cancel_from(self, sender: str | None, job_id: object) -> Job:
        if not isinstance(job_id, str) or not re.fullmatch(JOB_ID_PATTERN, job_id):
            raise SpecError([f"cancel_job_id: must be a job id such as j-0123456789abcdef (got {str(job_id)[:40]!r})"])
        if not self.team_directory.may_act_for(self.store.get(job_id).team, sender):
            raise CancelRefusedError(job_id, sender)
        return self.cancel(job_id)

    def cancel(self, job_id: str) -> Job:
        """Cancel a job and terminate every instance it still has. Cancelling twice is harmless."""
        return self.act(self.change(job_id, lambda job: cancel(job, now=self.clock.now())))

    # ---- events ---------------------------------------------------------------------------
    def publish_changes(self, before: Job | None, after: Job) -> None:
        """Publish every transition `after` has that `before` had not (never fails the caller)."""
        publish_changes(self.publisher, before, after)


def _try(rung: Rung, code: str, message: str, now: datetime) -> LaunchTry:
    return LaunchTry(
        at=now,
        instance_type=rung.instance_type,
        zone=rung.zone,
        subnet_id=rung.subnet_id,
        market=rung.market,
        error_code=code,
        message=message,
    )


def _reclaimed_pool(job: Job) -> tuple[str, str, Market] | None:
    """The pool of the newest attempt that ran, if it was reclaimed: the replacement avoids it."""
    for attempt in reversed(job.attempts[:-1]):
        if attempt.pool is not None:
            return attempt.pool if attempt.interrupted_at is not None else None
    return None


def _attempt_being_reclaimed(job: Job, attempt: Attempt) -> int | None:
    """The interrupted attempt that may still be saving its checkpoint: the new one waits for it."""
    for earlier in reversed(job.attempts):
        if earlier.number < attempt.number and earlier.instance_ids:
            return earlier.number if earlier.interrupted_at is not None and not earlier.is_over else None
    return None
