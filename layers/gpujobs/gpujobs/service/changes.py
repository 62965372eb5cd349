"""Load, decide, write conditionally, then act: the one way every use case changes a job.

`change()` runs a pure decision on the stored record and writes its result conditionally on the
version read. A lost race (another writer, or DynamoDB's TransactionConflict) is retried on a
fresh record after a backoff with full jitter, enough times to outlast a 64-node gang reporting
its exits in the same instant. The write is all a handler does to announce a state change: the
Publisher function publishes it from the table's stream (`service.outbox`), so neither a handler
that dies after its write nor an effect that fails can hide one. `Actuator` then carries out the
effects one by one: a failure is logged, counted in `EffectsFailed` by the AWS call that failed
(alarmed: an instance may be left running or unwatched) and left to the next decision, which
derives the same effect from the record again (level-triggered), never swallowed by a record that
says "done".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpujobs.domain.effects import (
    EFFECTS_FAILED,
    CreateAlarms,
    Decision,
    DeleteAlarms,
    DumpStacks,
    Effect,
    Launch,
    SignalCheckpoint,
    Stop,
    TagGeneration,
    Terminate,
    TerminateJobInstances,
    aws_call_of,
)
from gpujobs.domain.job import Job
from gpujobs.domain.job_metrics import JobMetric, metrics_of_change
from gpujobs.service.ports import (
    Backoff,
    ConcurrentUpdateError,
    JobStore,
    MetricsRecorder,
    Ports,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Applied:
    before: Job
    """The record the decision was taken on."""
    after: Job
    """The record as written (`before` when the decision wrote nothing)."""
    decision: Decision


def change(
    store: JobStore,
    job_id: str,
    decide: Callable[[Job], Decision],
    *,
    backoff: Backoff,
    written: Callable[[Job, Job], None] | None = None,
    first: Job | None = None,
) -> Applied:
    """Decide on the stored job and write the decision, retrying lost races, then tell `written`
    (before, after): it counts what the write stands for, and never fails it.

    `first`: the job as a consistent read returned it moments ago (the reconciler's batch read), to
    decide on instead of reading it again; a write on it is conditional like any other, and a lost
    race reads the job afresh."""
    for lost in range(backoff.tries):
        before = first if lost == 0 and first is not None else store.get(job_id)
        decision = decide(before)
        if decision.job is None:
            return Applied(before, before, decision)
        try:
            after = store.save(decision.job)
        except ConcurrentUpdateError:
            if lost + 1 < backoff.tries:
                backoff.pause(lost)
            continue
        if written is not None:
            try:
                written(before, after)
            except Exception:
                log.exception("could not count the write of %s", job_id)
        return Applied(before, after, decision)
    raise ConcurrentUpdateError(job_id, -1)


@dataclass(frozen=True)
class WriteCounter:
    """`change()`'s `written`: counts the launches, refusals and costs a write stands for
    (`domain.job_metrics`), priced at `hourly_usd` (instance type -> USD per hour)."""

    recorder: MetricsRecorder
    hourly_usd: Mapping[str, float]

    def __call__(self, before: Job, after: Job) -> None:
        found = metrics_of_change(before, after, hourly_usd=self.hourly_usd)
        if found:
            self.recorder.record(found)


@dataclass(frozen=True)
class Actuator:
    """Carries out a decision's effects on the ports, each on its own, after the write."""

    ports: Ports

    def carry_out(self, effects: Sequence[Effect]) -> None:
        for effect in effects:
            try:
                self._one(effect)
            except Exception:
                log.warning("effect %s failed; the next decision issues it again", effect, exc_info=True)
                self._count_failure(effect)

    def _count_failure(self, effect: Effect) -> None:
        """One `EffectsFailed` datapoint per failed effect; a recorder that fails too is only logged."""
        call, recorder = aws_call_of(effect), self.ports.metrics
        if call is None or recorder is None:
            return
        try:
            recorder.record([JobMetric(EFFECTS_FAILED, 1.0, (("Effect", call),))])
        except Exception:
            log.exception("could not count the failed effect %s", call)

    def _one(self, effect: Effect) -> None:
        compute, alarms = self.ports.compute, self.ports.alarms
        match effect:
            case Terminate(instance_ids) if instance_ids:
                compute.terminate(list(instance_ids))
            case Stop(instance_ids) if instance_ids:
                compute.stop(list(instance_ids))
            case TerminateJobInstances(job_id):
                live = [i.instance_id for i in compute.find_instances(job_id=job_id)]
                if live:
                    compute.terminate(live)
            case CreateAlarms(job_id, instance_ids, below, minutes):
                alarms.create(job_id=job_id, instance_ids=instance_ids, below_percent=below, minutes=minutes)
            case DeleteAlarms(instance_ids) if instance_ids:
                alarms.delete(instance_ids=instance_ids)
            case SignalCheckpoint(instance_ids, container) if instance_ids:
                self.ports.signaller.checkpoint_now(instance_ids=instance_ids, container=container)
            case DumpStacks(instance_ids, container) if instance_ids:
                self.ports.signaller.dump_stacks(instance_ids=instance_ids, container=container)
            case TagGeneration(instance_ids, generation) if instance_ids:
                compute.tag_generation(instance_ids, generation)
            case _:  # nothing to do, or Launch: the launcher carries that out after every other effect
                pass


def wants_launch(decision: Decision) -> bool:
    return any(isinstance(e, Launch) for e in decision.effects)
