"""The ladder walk: launch the claimed attempt's gang on the first rung that has room.

`JobService.launch` claims the launch (a conditional write with a lease) and hands the claimed job
here. The walk adopts a gang a crashed launcher already started (never launching twice), replaces an
incomplete one, then tries each rung of `domain.ladder` in order, recording every refusal, and ends
the attempt RUNNING, QUEUED (no capacity, or a vCPU quota's refusal named with its value: retried
after a jittered backoff) or FAILED (a refusal no rung can fix). A walk stops trying rungs
`WALK_RESERVE` before its invocation's deadline (`Ports.time_left`): the attempt stays LAUNCHING with
its refusals recorded and its lease given up, and the next launch (the reconciler's next tick) walks
only the rungs not yet tried. Only launches need this module and what it imports (run documents, hardware, the
ladder): it is imported on the first launch, never by a function's cold start.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from gpujobs.domain.effects import Decision
from gpujobs.domain.gangs import is_partial_gang, placement_group_of, started_over
from gpujobs.domain.hardware import efa_interfaces
from gpujobs.domain.job import Attempt, Job, LaunchTry, Market
from gpujobs.domain.job_access import session_policy_json, session_tags
from gpujobs.domain.ladder import (
    PLACEMENT_GROUP_LIMIT_EXCEEDED,
    Rung,
    SubnetZone,
    job_markets,
    next_try_at,
    plan_ladder,
)
from gpujobs.domain.launching import Gang, end_launch, invocation_lease, pause_launch, record_launch
from gpujobs.domain.ledger import family_gpus, family_of, gpus_of
from gpujobs.domain.offerings import offered
from gpujobs.domain.pools import HORIZON, Reclaim, reclaims_of
from gpujobs.domain.quotas import QuotaRefusal, is_quota_refusal, quota_detail, quota_refused_pools, refused_by_quota
from gpujobs.domain.rundoc import RunDocumentPointer, run_document
from gpujobs.domain.states import JobState, Reason
from gpujobs.service.config import LaunchConfig
from gpujobs.service.ports import (
    CapacityError,
    ConcurrentUpdateError,
    LaunchedInstance,
    LaunchRejectedError,
    LaunchRequest,
    LaunchTokenMismatchError,
    Ports,
    UserDataTooLargeError,
)

if TYPE_CHECKING:
    from gpujobs.domain.teams import TeamDirectory
    from gpujobs.service.changes import Applied


class JobWrites(Protocol):
    """What the walk needs of `JobService`: its one write path and the team directory."""

    def change(self, job_id: str, decide: Callable[[Job], Decision]) -> Applied: ...

    def act(self, applied: Applied) -> Job: ...

    @property
    def team_directory(self) -> TeamDirectory: ...


log = logging.getLogger(__name__)

WALK_RESERVE = timedelta(seconds=15)
"""A rung is tried only while this much of the invocation is left: one RunInstances of a gang can
take several seconds, and the walk's own write (the gang, or the pause) must land before the timeout."""


@dataclass(frozen=True)
class Launcher:
    ports: Ports
    config: LaunchConfig
    jobs: JobWrites
    """For its use cases: the one write path, the team directory (data buckets for the session policy)."""

    def _release_lease(self, job: Job) -> None:
        """After an unexpected error (a throttled RunInstances, say), let the retry take over at once
        instead of waiting out the lease. Best effort: if this write fails too, the lease expires."""
        attempt = job.current_attempt
        if attempt is None:
            return
        released = attempt.model_copy(update={"lease_expires_at": self.ports.clock.now()})
        try:
            self.ports.store.save(job.with_attempt(released, now=self.ports.clock.now()))
        except Exception:
            log.warning("could not release the launch lease of %s", job.job_id, exc_info=True)

    def walk(self, job: Job, *, spot_only: bool = False) -> Job:
        """Walk the ladder for a job whose launch this caller has just claimed."""
        try:
            return self._walk(job, spot_only=spot_only)
        except Exception:
            self._release_lease(job)
            raise

    def _walk(self, job: Job, *, spot_only: bool) -> Job:
        spec, attempt = job.require_spec(), job.current_attempt
        assert attempt is not None
        existing = self.ports.compute.find_instances(job_id=job.job_id, attempt=attempt.number)
        if len(existing) >= spec.nodes:  # a crashed launcher got this far: adopt, never launch twice
            return self._record_launched(job, existing, subnet_id=attempt.subnet_id, tries=attempt.tries)
        if is_partial_gang(existing, nodes=spec.nodes):  # one gang per attempt: this one goes, a new one starts
            survivors = [i.instance_id for i in sorted(existing, key=lambda i: i.launch_index)]
            self.ports.compute.terminate(survivors)
            try:
                restarted = self.ports.store.save(
                    started_over(
                        job, survivors, now=self.ports.clock.now(), lease=invocation_lease(self.ports.time_left())
                    )
                )
            except ConcurrentUpdateError:
                return self.ports.store.get(job.job_id)
            return self.walk(restarted, spot_only=spot_only)
        now = self.ports.clock.now()
        planned = self._plan(job, attempt, spot_only=spot_only, now=now)
        if isinstance(planned, tuple):
            target, reason, detail = planned
            return self._end_launch(job, list(attempt.tries), target, reason, detail)
        ladder = planned
        user_data = self.user_data(job, attempt)
        security_group = self.ports.compute.job_security_group(job.job_id) if ladder else None
        tries = list(attempt.tries)
        for rung in _untried(ladder, attempt.tries):
            if (rung.instance_type, rung.market) in quota_refused_pools(tries):
                continue  # the Region's quota refused this type and market: no other zone has room
            if self._out_of_time():
                return self._pause(job, tries, ladder)
            request = replace(self._request(job, attempt, rung, user_data), security_group_id=security_group)
            try:
                launched = self.ports.compute.run_instances(request)
            except CapacityError as exc:  # QuotaExceededError too: the next rung may be another quota's
                tries.append(_try(rung, exc.code, exc.message, self.ports.clock.now()))
                if exc.code == PLACEMENT_GROUP_LIMIT_EXCEEDED:
                    break  # no rung fixes it; the reconciler's sweep of ended jobs' groups does
                continue
            except LaunchTokenMismatchError as exc:
                # An earlier launcher of this attempt sent this pool other parameters (its run
                # document named an older checkpoint). Adopt its gang if it is there; else move on.
                existing = self.ports.compute.find_instances(job_id=job.job_id, attempt=attempt.number)
                if len(existing) >= spec.nodes:
                    return self._record_launched(job, existing, subnet_id=rung.subnet_id, tries=tuple(tries))
                tries.append(_try(rung, exc.code, exc.message, self.ports.clock.now()))
                continue
            except LaunchRejectedError as exc:
                tries.append(_try(rung, exc.code, exc.message, self.ports.clock.now()))
                return self._end_launch(job, tries, JobState.FAILED, Reason.LAUNCH_FAILED, f"{exc.code}: {exc.message}")
            return self._record_launched(job, launched, subnet_id=rung.subnet_id, tries=tuple(tries))
        if not ladder and spot_only and job_markets(job, now=now):
            # The budget's spot-only policy came between the claim and this walk: wait for it, never fail.
            return self._end_launch(
                job,
                tries,
                JobState.QUEUED,
                Reason.BUDGET_HOLD,
                "budget spot-only: this job may launch on on-demand only",
            )
        if not ladder:
            return self._end_launch(
                job, tries, JobState.FAILED, Reason.LAUNCH_FAILED, "no market is allowed by the spec"
            )
        others = [t for t in tries if not is_quota_refusal(t.error_code)]
        summary = ", ".join(f"{t.instance_type}/{t.zone}/{t.market}: {t.error_code}" for t in others)
        quotas = refused_by_quota(tries)
        if quotas:
            detail = quota_detail(self._with_values(quotas), others=f"no capacity ({summary})" if summary else "")
            return self._end_launch(job, tries, JobState.QUEUED, Reason.QUOTA_EXCEEDED, detail)
        return self._end_launch(job, tries, JobState.QUEUED, Reason.NO_CAPACITY, f"no capacity ({summary})")

    def _families_full(self, job: Job) -> set[str]:
        """The instance families the team has filled its `gpus_by_family` limit in (the ledger as read now)."""
        limits = self.jobs.team_directory.quota(job.team).gpus_by_family
        if not limits:
            return set()
        ledger, gpus = self.ports.store.ledger(), gpus_of(job)
        return {family for family, limit in limits.items() if ledger.get(family_gpus(job.team, family)) + gpus > limit}

    def _evidence(self, job: Job, attempt: Attempt, now: datetime) -> list[Reclaim]:
        """The stack's recent spot reclaims and the job's own. A replacement's first walk records the
        reclaim it replaces first, for every job's next launch (`domain.pools`); evidence that cannot
        be written or read costs the ranking, never the launch."""
        own = [r for r in reclaims_of(job) if now - r.at <= HORIZON]
        try:
            if own and not attempt.tries:
                self.ports.pool_evidence.record([max(own, key=lambda r: r.at)])
            return [*self.ports.pool_evidence.recent(now=now), *own]
        except Exception:
            log.warning("spot pool evidence unavailable for %s; ranking by its own record", job.job_id, exc_info=True)
            return own

    def _plan(
        self, job: Job, attempt: Attempt, *, spot_only: bool, now: datetime
    ) -> list[Rung] | tuple[JobState, Reason, str]:
        """The rungs to walk (`domain.ladder`, ranked by the reclaims and placement scores), less the zones that do not
        offer a type and the families the team's quota has filled; or why the walk ends before it
        starts (no zone offers any type: FAILED; every family is full: the job waits)."""
        spec = job.require_spec()
        subnets = [SubnetZone(s.subnet_id, s.zone) for s in self.ports.compute.subnets()]
        markets = job_markets(job, now=now, spot_only=spot_only)
        reclaims = self._evidence(job, attempt, now)
        scores = (
            self.ports.placement_scores.zone_scores(spec.instance_types, nodes=spec.nodes)
            if Market.SPOT in markets
            else {}
        )
        planned = plan_ladder(spec, subnets, markets=markets, reclaims=reclaims, now=now, zone_scores=scores)
        ladder = self._offered(job, planned)
        if planned and not ladder:
            zones = ", ".join(sorted({s.zone for s in subnets}))
            return (
                JobState.FAILED,
                Reason.LAUNCH_FAILED,
                (f"{', '.join(spec.instance_types)}: not offered in any zone of the stack's subnets ({zones})"),
            )
        full = self._families_full(job)
        if full and ladder:
            kept = [rung for rung in ladder if family_of(rung.instance_type) not in full]
            if not kept:
                detail = f"team {job.team} holds all the GPUs its quota allows in {', '.join(sorted(full))}"
                return JobState.QUEUED, Reason.NO_CAPACITY, detail
            ladder = kept
        return ladder

    def _offered(self, job: Job, ladder: list[Rung]) -> list[Rung]:
        """The rungs whose zone offers their type (EC2's DescribeInstanceTypeOfferings, cached; a
        type it does not describe, or offerings that cannot be read, leave every rung in)."""
        try:
            zones = self.ports.offerings.zones_offering(job.require_spec().instance_types)
        except Exception:
            log.warning("instance type offerings unavailable for %s; trying every zone", job.job_id, exc_info=True)
            return ladder
        return [rung for rung in ladder if offered(zones, rung.instance_type, rung.zone)]

    def _out_of_time(self) -> bool:
        left = self.ports.time_left()
        return left is not None and left < WALK_RESERVE

    def _pause(self, job: Job, tries: list[LaunchTry], ladder: Sequence[Rung]) -> Job:
        """The invocation's deadline is near: keep what was tried, give the lease up, let the next tick go on."""
        left = len(list(_untried(ladder, tuple(tries))))
        detail = f"launching: {len(tries)} rung(s) refused, {left} left for the next run (this one's time ran out)"
        number = self._attempt_number(job)
        now = self.ports.clock.now
        applied = self.jobs.change(
            job.job_id,
            lambda current: pause_launch(current, attempt_number=number, tries=tuple(tries), now=now(), detail=detail),
        )
        return applied.after

    def _with_values(self, refusals: list[QuotaRefusal]) -> list[QuotaRefusal]:
        """Each refused quota with its value from Service Quotas; a value that cannot be read stays unknown."""
        valued = []
        for refusal in refusals:
            value = None
            if refusal.quota is not None:
                try:
                    value = self.ports.quotas.current_value(refusal.quota.code)
                except Exception:  # the port never raises; a status must not fail on it regardless
                    log.warning("could not read quota %s", refusal.quota.code, exc_info=True)
            valued.append(replace(refusal, value=value))
        return valued

    def _request(self, job: Job, attempt: Attempt, rung: Rung, user_data: str | bytes) -> LaunchRequest:
        spec = job.require_spec()
        subnet = next(s for s in self.ports.compute.subnets() if s.subnet_id == rung.subnet_id)
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

    def user_data(self, job: Job, attempt: Attempt) -> str | bytes:
        """The attempt's run document as user data (a pointer to it in S3 when it is too large)."""
        doc = run_document(
            job,
            attempt,
            bucket=self.config.checkpoint_bucket,
            event_bus=self.config.event_bus_name,
            region=self.config.region,
            log_group=self.config.job_log_group,
            wait_for_attempt=_attempt_being_reclaimed(job, attempt),
            report_key=self.ports.report_keys.key_for(job_id=job.job_id, attempt=attempt.number).hex(),
            checkpoint_key=self.ports.report_keys.checkpoint_key_for(job_id=job.job_id).hex(),
            access=self._job_access(job, attempt),
            hardware=self.config.hardware,
        )
        try:
            return self.ports.render_user_data(doc)
        except UserDataTooLargeError:  # the document goes to S3, user data points at it
            key = f"jobs/{job.job_id}/attempt-{attempt.number}/run.json"
            body = doc.model_dump_json(exclude={"report_key", "checkpoint_key"})
            uri = self.ports.blobs.put_text(key, body)
            return self.ports.render_user_data(
                RunDocumentPointer.for_stored(uri, body.encode(), report_key=doc.report_key, doc=doc)
            )

    def _job_access(self, job: Job, attempt: Attempt) -> dict[str, Any]:
        """The run document's job role, session policy and tags; none when the stack has no job role."""
        if not self.config.job_role_arn:
            return {}
        team = job.require_spec().team
        return {
            "job_role_arn": self.config.job_role_arn,
            "credentials_function": self.config.credentials_function,
            "stack": self.config.stack_name,
            "session_policy": session_policy_json(
                bucket=self.config.checkpoint_bucket,
                job_id=job.job_id,
                team=team,
                data_buckets=self.jobs.team_directory.data_buckets(team),
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
        applied = self.jobs.change(
            job.job_id,
            lambda current: record_launch(
                current, attempt_number=number, gang=gang, tries=tries, now=self.ports.clock.now()
            ),
        )
        return self.jobs.act(applied)

    def _end_launch(self, job: Job, tries: list[LaunchTry], target: JobState, reason: Reason, detail: str) -> Job:
        number = self._attempt_number(job)
        attempt = job.current_attempt
        assert attempt is not None
        self._delete_placement_group(job, attempt)

        def decide(current: Job) -> Decision:
            now = self.ports.clock.now()
            retry_at = None
            if target is JobState.QUEUED:
                retry_at = next_try_at(current, now=now, jitter=self.ports.jitter())
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

        return self.jobs.change(job.job_id, decide).after

    def _delete_placement_group(self, job: Job, attempt: Attempt) -> None:
        """An attempt that launched nothing gives its group back at once (a Region holds 500).
        Best effort: the reconciler sweeps whatever this misses."""
        group = placement_group_of(job, attempt)
        try:
            if group is not None:
                self.ports.compute.delete_placement_group(group)
        except Exception:
            log.warning("could not delete placement group %s", group, exc_info=True)

    @staticmethod
    def _attempt_number(job: Job) -> int:
        attempt = job.current_attempt
        assert attempt is not None
        return attempt.number


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


def _untried(ladder: Sequence[Rung], tries: Sequence[LaunchTry]) -> Iterator[Rung]:
    """The rungs this attempt has not tried yet: a walk that a deadline cut short goes on where it stopped."""
    tried = {(t.instance_type, t.subnet_id, t.market) for t in tries}
    return (r for r in ladder if (r.instance_type, r.subnet_id, r.market) not in tried)


def _attempt_being_reclaimed(job: Job, attempt: Attempt) -> int | None:
    """The interrupted attempt that may still be saving its checkpoint: the new one waits for it."""
    for earlier in reversed(job.attempts):
        if earlier.number < attempt.number and earlier.instance_ids:
            return earlier.number if earlier.interrupted_at is not None and not earlier.is_over else None
    return None
