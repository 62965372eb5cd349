"""Use cases of the control plane core: submit, launch, cancel.

Each follows the same shape: load the job, decide (pure domain), write the decision to the store
conditionally on the version read, then act on AWS, then publish what changed. A lost race is not
an error to the caller: the loser reloads and sees what the winner did. A redelivered message maps
to the same deterministic job id, so it can never create a second job or a second set of instances.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gpujobs.domain.gangs import is_partial_gang, placement_group_of, started_over
from gpujobs.domain.job import Attempt, Job, LaunchTry, Market, job_id_for
from gpujobs.domain.ladder import PLACEMENT_GROUP_LIMIT_EXCEEDED, Rung, SubnetZone, next_try_at, plan_ladder
from gpujobs.domain.rundoc import RunDocument, RunDocumentPointer
from gpujobs.domain.spec import TEAM_PATTERN, JobSpec, SpecError, parse_document, validate_spec
from gpujobs.domain.states import JobState, Reason
from gpujobs.service.ports import (
    BlobStore,
    BudgetBook,
    BudgetMode,
    BudgetPolicy,
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
    StateChanged,
)

log = logging.getLogger(__name__)

LAUNCH_LEASE = timedelta(minutes=11)
"""How long a launcher owns a LAUNCHING attempt before a retry may take it over.

Longer than any launching function's timeout (Submit: 600 s), so a launcher still walking the
ladder is never taken over by a second one; shorter than the queue's visibility timeout (3600 s),
so a message redelivered after a crashed launch finds the lease expired and finishes the launch
(adopting any instances the crashed one started). A launch that fails cleanly releases it at once.
"""
MAX_RACE_RETRIES = 5


@dataclass(frozen=True)
class LaunchConfig:
    checkpoint_bucket: str
    event_bus_name: str
    region: str
    allowed_instance_types: tuple[str, ...] = ()


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
    jitter: Callable[[], float] = field(default=random.random)

    # ---- submit ---------------------------------------------------------------------------
    def handle_message(self, body: str, *, message_id: str) -> SubmitOutcome:
        """One SQS message: a job spec to run, or `{"cancel_job_id": ...}`."""
        try:
            document = parse_document(body)
            if set(document) == {"cancel_job_id"}:
                return SubmitOutcome(self.cancel(str(document["cancel_job_id"])), created=False)
            spec = validate_spec(document, allowed_instance_types=self.config.allowed_instance_types or None)
        except SpecError as exc:
            return self._reject(body, exc.problems, message_id=message_id)
        return self.submit(spec, message_id=message_id)

    def submit(self, spec: JobSpec, *, message_id: str | None) -> SubmitOutcome:
        job_id = job_id_for(client_token=spec.client_token, team=spec.team, message_id=message_id)
        created = True
        try:
            job = self.store.create(
                Job.submitted(job_id=job_id, spec=spec, now=self.clock.now(), message_id=message_id)
            )
            self.publish_changes(None, job)
        except JobExistsError:
            job, created = self.store.get(job_id), False
        if job.state is JobState.QUEUED or job.state is JobState.LAUNCHING:
            job = self.launch(job.job_id)
        return SubmitOutcome(job, created)

    def _reject(self, body: str, problems: list[str], *, message_id: str) -> SubmitOutcome:
        token, team = _identity_of(body)
        job_id = job_id_for(client_token=token, team=team, message_id=message_id)
        rejected = Job.rejected(
            job_id=job_id, problems=problems, excerpt=body, now=self.clock.now(), message_id=message_id
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
        for _ in range(MAX_RACE_RETRIES):
            job = self.store.get(job_id)
            policy = self.budgets.policy_for(job.team) if job.spec else None
            claimed = self._claim_launch(job, self.clock.now(), policy)
            if claimed is None:
                return job
            try:
                owned = self.store.save(claimed)
            except ConcurrentUpdateError:
                continue
            self.publish_changes(job, owned)
            if owned.state is not JobState.LAUNCHING:  # held by the budget
                return owned
            try:
                return self._walk_ladder(owned, spot_only=policy is not None and policy.mode is BudgetMode.SPOT_ONLY)
            except Exception:
                self._release_lease(owned)
                raise
        return self.store.get(job_id)

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

    def _claim_launch(self, job: Job, now: datetime, policy: BudgetPolicy | None) -> Job | None:
        attempt = job.current_attempt
        if job.state is JobState.QUEUED:
            if job.next_try_at and job.next_try_at > now:
                return None
            reason = Reason.LAUNCH_STARTED
        elif job.state is JobState.INTERRUPTED:
            reason = Reason.REPLACEMENT_LAUNCHING
        elif (
            job.state is JobState.LAUNCHING and attempt and attempt.lease_expires_at and attempt.lease_expires_at <= now
        ):
            reason = Reason.LAUNCH_STARTED
        else:
            return None
        if policy is not None and policy.mode is BudgetMode.HOLD:
            hold = f"budget hold ({policy.scope}): {policy.reason}".strip()
            if job.state is JobState.QUEUED and job.hold_reason == hold:
                return None
            if job.state is JobState.LAUNCHING and attempt is not None:
                job = job.with_attempt(
                    attempt.model_copy(update={"ended_at": now, "end_reason": Reason.BUDGET_HOLD.value}), now=now
                )
            return job.transition(JobState.QUEUED, Reason.BUDGET_HOLD, now=now, detail=hold, hold_reason=hold)
        if job.state is JobState.LAUNCHING and attempt is not None:
            renewed = attempt.model_copy(update={"lease_expires_at": now + LAUNCH_LEASE})
            return job.with_attempt(renewed, now=now)
        fresh = Attempt(
            number=job.attempt_count + 1,
            started_at=now,
            resume_from_step=job.checkpoint_step,
            lease_expires_at=now + LAUNCH_LEASE,
        )
        return job.with_attempt(fresh, now=now).transition(
            JobState.LAUNCHING, reason, now=now, next_try_at=None, hold_reason=None
        )

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
            spec, subnets, interruptions=job.interruptions, avoid_pool=_reclaimed_pool(job), spot_only=spot_only
        )
        user_data = self._user_data(job, attempt)
        tries = list(attempt.tries)
        for rung in ladder:
            request = self._request(job, attempt, rung, user_data)
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
        )

    def _user_data(self, job: Job, attempt: Attempt) -> str | bytes:
        spec = job.require_spec()
        doc = RunDocument(
            job_id=job.job_id,
            attempt=attempt.number,
            name=spec.name,
            image=spec.image,
            command=list(spec.command),
            env=dict(spec.env),
            nodes=spec.nodes,
            gpus_per_node=spec.gpus_per_node,
            checkpoint_uri=f"s3://{self.config.checkpoint_bucket}/jobs/{job.job_id}/ckpt",
            resume_from_step=job.checkpoint_step,
            checkpoint_every_minutes=spec.checkpoint_every_minutes,
            event_bus=self.config.event_bus_name,
            region=self.config.region,
            wait_for_attempt=_attempt_being_reclaimed(job, attempt),
        )
        try:
            return self.render_user_data(doc)
        except ValueError:  # UserDataTooLargeError: the document goes to S3, user data points at it
            key = f"jobs/{job.job_id}/attempt-{attempt.number}/run.json"
            uri = self.blobs.put_text(key, doc.model_dump_json())
            return self.render_user_data(RunDocumentPointer(run_document_uri=uri))

    def _record_launched(
        self,
        job: Job,
        launched: Sequence[LaunchedInstance],
        *,
        subnet_id: str | None,
        tries: tuple[LaunchTry, ...],
    ) -> Job:
        now = self.clock.now()
        first = launched[0]
        attempt = job.current_attempt
        assert attempt is not None
        updated = attempt.model_copy(
            update={
                "instance_ids": tuple(i.instance_id for i in sorted(launched, key=lambda i: i.launch_index)),
                "instance_type": first.instance_type,
                "zone": first.zone,
                "subnet_id": subnet_id,
                "market": first.market,
                "tries": tries,
                "lease_expires_at": None,
            }
        )
        detail = f"{len(launched)} x {first.instance_type} {first.market} in {first.zone}"
        candidate = job.with_attempt(updated, now=now).transition(
            JobState.RUNNING, Reason.INSTANCES_LAUNCHED, now=now, detail=detail
        )
        try:
            saved = self.store.save(candidate)
        except ConcurrentUpdateError:
            # Someone moved the job while we launched (a cancel, most likely). The instances must
            # not outlive a job that no longer wants them.
            current = self.store.get(job.job_id)
            if current.state is not JobState.LAUNCHING:
                self.compute.terminate([i.instance_id for i in launched])
            return current
        self.publish_changes(job, saved)
        if spec_wants_idle_alarms(saved):
            spec = saved.require_spec()
            self.alarms.create(
                job_id=saved.job_id,
                instance_ids=[i.instance_id for i in launched],
                below_percent=spec.idle.gpu_util_below_percent,
                minutes=spec.idle.for_minutes,
            )
        return saved

    def _end_launch(self, job: Job, tries: list[LaunchTry], target: JobState, reason: Reason, detail: str) -> Job:
        now = self.clock.now()
        attempt = job.current_attempt
        assert attempt is not None
        self._delete_placement_group(job, attempt)
        ended = attempt.model_copy(
            update={
                "tries": tuple(tries),
                "ended_at": now,
                "end_reason": reason.value,
                "lease_expires_at": None,
            }
        )
        changes: dict[str, object] = {}
        if target is JobState.QUEUED:
            changes["next_try_at"] = next_try_at(now, _capacity_failures_in_a_row(job), jitter=self.jitter())
        candidate = job.with_attempt(ended, now=now).transition(target, reason, now=now, detail=detail, **changes)
        try:
            saved = self.store.save(candidate)
        except ConcurrentUpdateError:
            return self.store.get(job.job_id)
        self.publish_changes(job, saved)
        return saved

    def _delete_placement_group(self, job: Job, attempt: Attempt) -> None:
        """An attempt that launched nothing gives its group back at once (a Region holds 500).
        Best effort: the reconciler sweeps whatever this misses."""
        group = placement_group_of(job, attempt)
        try:
            if group is not None:
                self.compute.delete_placement_group(group)
        except Exception:
            log.warning("could not delete placement group %s", group, exc_info=True)

    # ---- cancel ---------------------------------------------------------------------------
    def cancel(self, job_id: str) -> Job:
        """Cancel a job and terminate every instance it still has. Cancelling twice is harmless."""
        for _ in range(MAX_RACE_RETRIES):
            job = self.store.get(job_id)
            if job.state.is_terminal:
                self._terminate_all(job)
                return job
            now = self.clock.now()
            attempt = job.current_attempt
            if attempt and not attempt.is_over:
                job = job.with_attempt(
                    attempt.model_copy(update={"ended_at": now, "end_reason": Reason.USER_CANCELLED.value}),
                    now=now,
                )
            candidate = job.transition(JobState.CANCELLED, Reason.USER_CANCELLED, now=now)
            try:
                saved = self.store.save(candidate)
            except ConcurrentUpdateError:
                continue
            self._terminate_all(saved)
            self.publish_changes(job, saved)
            return saved
        raise ConcurrentUpdateError(job_id, -1)

    def _terminate_all(self, job: Job) -> None:
        live = [i.instance_id for i in self.compute.find_instances(job_id=job.job_id)]
        if live:
            self.compute.terminate(live)

    # ---- events ---------------------------------------------------------------------------
    def publish_changes(self, before: Job | None, after: Job) -> None:
        """Publish every transition `after` has that `before` had not. Never fails the caller:
        the store is the source of truth and the event is a notification of it."""
        events = [
            StateChanged(
                job_id=after.job_id,
                name=after.name,
                team=after.team,
                source=entry.source,
                target=entry.target,
                reason=entry.reason.value,
                attempt=entry.attempt,
                detail=entry.detail,
                at=entry.at,
                extra=_event_extra(after, entry.target),
            )
            for entry in after.history_since(before)
        ]
        if not events:
            return
        try:
            self.publisher.publish(events)
        except Exception:
            log.exception("could not publish %d state events for %s", len(events), after.job_id)


def _identity_of(body: str) -> tuple[str | None, str | None]:
    """The client_token and team of a rejected spec, when they are themselves valid, so that the
    rejection is recorded under the job id the submitter computed (`gpujobs submit` prints it)."""
    try:
        document = parse_document(body)
    except SpecError:
        return None, None
    token, team = document.get("client_token"), document.get("team", "default")
    if not isinstance(token, str) or not 0 < len(token) <= 64:
        return None, None
    if not isinstance(team, str) or not re.fullmatch(TEAM_PATTERN, team):
        return None, None
    return token, team


def _event_extra(job: Job, target: JobState) -> dict[str, object]:
    attempt = job.current_attempt
    if target is JobState.REJECTED:
        return {"problems": list(job.problems)}
    if target is JobState.RUNNING and attempt:
        return {
            "instance_ids": list(attempt.instance_ids),
            "instance_type": attempt.instance_type,
            "zone": attempt.zone,
            "market": attempt.market.value if attempt.market else None,
        }
    return {}


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


def spec_wants_idle_alarms(job: Job) -> bool:
    """GPU jobs get an idle alarm per instance (CPU smoke jobs have no GPU metric to watch)."""
    return job.spec is not None and job.spec.gpus_per_node > 0


def _capacity_failures_in_a_row(job: Job) -> int:
    count = 0
    for attempt in reversed(job.attempts):
        if attempt.end_reason != Reason.NO_CAPACITY.value and attempt.ended_at is not None:
            return count
        count += 1
    return count + job.retired.no_capacity_in_a_row
