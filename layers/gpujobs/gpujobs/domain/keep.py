"""A failed gang kept up for inspection: the spec's `keep_on_failure`, as pure decisions.

The bootstrap cannot tell whether a crash fails the job or is retried, so with `keep_on_failure`
in its run document every node whose workload crashed (an exit other than 0 and 75) keeps its host
up and its container's filesystem, idle under the same name (docs/instance.md), and reports the
exit as before. The control plane decides:

* a crash that fails the job (`fate.fails_and_keeps`) ends the attempt at once, without terminating
  the rest of the gang, and the FAILED job records `Kept` until `now + keep_on_failure`: billed
  (`Job.held_until`), shown by `gpujobs status`, open to `gpujobs shell`/`exec`;
* any other end of a crashed attempt (a retry, a stop) terminates what its nodes kept up, and so
  does a gang ended by a slow interconnect (`fate.Verdict.SLOW_INTERCONNECT`: the launcher's 123 is a
  crash to the bootstrap), which is never kept, even when it fails the job;
* `gpujobs cancel` of the FAILED job releases the keep (`release`): its instances go at once;
* when the keep is over, the reconciler's orphan sweep takes its instances like any ended job's
  (`spares` is false from then on): a pure test on the record and the injected clock, so a rerun
  or a late tick is harmless.

FAILED stays terminal throughout: the keep is a record of instances, never a state.
"""

from __future__ import annotations

from datetime import datetime

from gpujobs.domain.effects import Decision, Effect, Outcome, Terminate, TerminateJobInstances, live_instances
from gpujobs.domain.fate import Verdict
from gpujobs.domain.job import Attempt, Job, Kept
from gpujobs.domain.states import JobState

CRASH_VERDICTS = frozenset({Verdict.CRASHED, Verdict.MISCONFIGURED, Verdict.SYNC_FAILED})
"""The verdicts of an attempt whose nodes' bootstraps keep their hosts up (a failing exit)."""


def keep_or_terminate(job: Job, ended: Attempt, verdict: Verdict, *, now: datetime) -> tuple[Job, tuple[Effect, ...]]:
    """After `ended` was judged `verdict` and the job moved: a gang whose crash failed the job is
    kept (recorded on the job); a crashed gang of a job that goes on is terminated."""
    keep = job.spec.keeps_on_failure if job.spec is not None else None
    live = live_instances(ended)
    if keep is not None and verdict is Verdict.SLOW_INTERCONNECT and live:
        return job, (Terminate(live),)  # its 123 was a crash to the bootstraps, which kept their hosts up
    if keep is None or verdict not in CRASH_VERDICTS or not live:
        return job, ()
    if job.state is JobState.FAILED and job.is_current(ended) and job.kept is None:
        kept = Kept(attempt=ended.number, since=now, until=now + keep)
        return job.model_copy(update={"kept": kept, "updated_at": now}), ()
    return job, (Terminate(live),)


def spares(job: Job, attempt: int, *, now: datetime) -> bool:
    """Whether an instance of `attempt` is kept for inspection now (the orphan sweep leaves it)."""
    return job.kept is not None and job.kept.attempt == attempt and job.kept.lasts(now)


def release(job: Job, *, now: datetime) -> Decision | None:
    """A cancel of a FAILED job whose gang is kept: the keep ends now and every instance of the job
    goes (None: nothing is kept, the cancel is what it was)."""
    if job.kept is None or not job.kept.lasts(now):
        return None
    released = job.kept.model_copy(update={"released_at": now})
    effects: tuple[Effect, ...] = (TerminateJobInstances(job.job_id),)
    return Decision(
        Outcome.KEEP_RELEASED,
        job.model_copy(update={"kept": released, "updated_at": now}),
        effects,
        detail=f"the gang of attempt {released.attempt} kept for inspection is released",
    )
