"""Replace only the lost nodes of a gang: the survivors stay, the replacement joins them.

When spot warns that it will reclaim one node of a running gang, the whole gang need not go. Every
rank sees the preemption at the same step boundary (the trainer agrees on it collectively), saves
the warning's checkpoint and exits 75. The survivors' bootstraps do not shut down: they wait to be
told (their `gpujobs:generation` tag raised) that the gang goes on, then rendezvous again with the
replacement and start the workload once more, at the same world size, from that checkpoint. Only
the replacement boots and pulls the image; the survivors keep their instance, their place in the
cluster placement group and their warm caches.

The regroup stays inside the attempt: its report key, its job session, its placement group and its
log group are the survivors' still, and the replacement is launched with the attempt's own run
document into the attempt's pool (type, subnet, market) and group. Its decisions:

- `on_node_warning`: a warning for one node of a gang that may regroup (`may_regroup`) takes that
  node out of the gang (`Attempt.left`), counts the reclaim (RUNNING -> RUNNING, node-reclaimed:
  the volatility rule and the pool evidence see it like any other), tags the survivors with the
  next generation, asks for the checkpoint and for the replacement's launch.
- `record_replacement`: the replacement launched; it joins the gang (RUNNING -> RUNNING,
  node-replaced), and its first-heartbeat clock starts (`domain.hangs`).
- `no_room`: the pool had no room for it (it usually has none: a reclaim is the pool shrinking), a
  budget holds launches, or nothing launched it within `LAUNCH_LIMIT`: the attempt is interrupted
  as of the warning (RUNNING -> INTERRUPTED, no-room-for-node, not counted again), the lost node
  back in its gang (its time is paid, its end recorded), and the whole gang is replaced by the
  usual ladder walk. The survivors, waiting for a replacement that will not come,
  go like any reclaimed gang's (`gangs.overdue_survivors`).
- `repair`: the reconciler re-derives what a lost effect left undone (the tags, the launch), and
  gives up on a launch that did not happen in time.
- `left_the_gang`: a node that left stays up no longer than `LAUNCH_LIMIT` after its warning (it
  saved and exited long since): should spot not take it, the reconciler's orphan sweep does.

A regroup is never tried for a gang an older release launched (`Attempt.can_regroup`: its instances
run that release's bootstrap and trainer), nor where the old path is the policy's choice: a job that does not take
checkpoint requests (its survivors would not save and exit 75 together), a stop or a move under way,
a spot job at its interruption limit, a job whose next launch must not be spot (volatile spot, a
deadline that wants on-demand), a gang already waiting for a replacement, or one with a node gone.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from gpujobs.domain.deadline import DeadlineMarkets, launch_markets
from gpujobs.domain.effects import (
    CreateAlarms,
    Decision,
    DeleteAlarms,
    Effect,
    Launch,
    Outcome,
    SignalCheckpoint,
    TagGeneration,
    Terminate,
    ignore,
    live_instances,
)
from gpujobs.domain.gangs import RECLAIM_GRACE, SPOT_WARNING_WINDOW
from gpujobs.domain.job import Attempt, Job, LaunchTry, Market, Regroup
from gpujobs.domain.spec import Capacity
from gpujobs.domain.states import JobState, Reason
from gpujobs.domain.volatility import volatile

LAUNCH_LIMIT = SPOT_WARNING_WINDOW + RECLAIM_GRACE
"""How long a regroup may wait for its replacement's launch before the whole gang is replaced: as
long as a reclaimed gang's survivors may take to save and exit (`gangs.overdue_survivors`)."""
TAG_AGAIN_FOR = timedelta(minutes=15)
"""How long after a regroup the reconciler tags its gang again (a tag lost with a failed effect):
longer than the replacement's boot and rendezvous."""
MAX_LEFT_KEPT = 8
"""Nodes kept in `Attempt.left`: the record stays bounded however often one attempt regroups."""


def left_the_gang(attempt: Attempt, instance_id: str, *, now: datetime) -> bool:
    """The node left the attempt's gang in a regroup, and its warning's window and grace are over."""
    if instance_id not in attempt.left:
        return False
    regroup = attempt.regroup
    return regroup is None or instance_id not in regroup.lost or now - regroup.at >= LAUNCH_LIMIT


def pending_regroup(job: Job) -> Regroup | None:
    """The current attempt's regroup waiting for its replacement's launch, on a RUNNING job that no
    stop ends (a stop that came meanwhile takes the survivors: no replacement is launched for them)."""
    attempt = job.current_attempt
    if job.state is not JobState.RUNNING or attempt is None or attempt.is_over or attempt.regroup is None:
        return None
    if job.stop_request is not None:
        return None
    return attempt.regroup if attempt.regroup.pending else None


def may_regroup(job: Job, attempt: Attempt, instance_id: str, *, now: datetime) -> str | None:
    """Why a warning for `instance_id` must replace the whole gang instead (None: it may regroup)."""
    spec = job.require_spec()
    if spec.nodes < 2 or len(attempt.instance_ids) != spec.nodes or instance_id not in attempt.instance_ids:
        return "a single node, or not a node of the whole gang"
    if not attempt.can_regroup:
        return "launched by a release whose instances do not regroup"
    if not spec.checkpoint.takes_checkpoint_requests:
        return f"checkpoint mode {spec.checkpoint.value}: the survivors would not save and wait together"
    if attempt.market is not Market.SPOT or attempt.subnet_id is None or attempt.instance_type is None:
        return "not a recorded spot gang"
    if job.stop_request is not None or attempt.interrupted_at is not None:
        return "a stop or a move is under way"
    if attempt.waits_for_replacement:
        return "the gang is already waiting for a replacement"
    if any(i in attempt.gone for i in attempt.instance_ids):
        return "a node of the gang is already gone"
    if spec.capacity is Capacity.SPOT and job.interruptions + 1 > spec.max_interruptions:
        return "past max_interruptions"
    reclaimed = job.transition(JobState.RUNNING, Reason.NODE_RECLAIMED, now=now)
    if volatile(reclaimed, now=now):
        return "spot is volatile for the job: its next launch goes to on-demand"
    if spec.deadline is not None and launch_markets(reclaimed, now=now) is DeadlineMarkets.ON_DEMAND:
        return "the deadline wants on-demand"
    return None


def on_node_warning(job: Job, attempt: Attempt, instance_id: str, *, now: datetime) -> Decision:
    """Take the warned node out of the gang and launch its replacement (`may_regroup` said yes)."""
    generation = attempt.generation + 1
    survivors = tuple(i for i in attempt.instance_ids if i != instance_id)
    regrouping = attempt.model_copy(
        update={
            "instance_ids": survivors,
            "left": (*attempt.left, instance_id)[-MAX_LEFT_KEPT:],
            "regroup": Regroup(lost=(instance_id,), at=now, generation=generation),
        }
    )
    detail = f"spot warning for {instance_id}: the gang saves, {len(survivors)} node(s) stay for its replacement"
    changed = job.with_attempt(regrouping, now=now).transition(
        JobState.RUNNING, Reason.NODE_RECLAIMED, now=now, detail=detail, interruptions=job.interruptions + 1
    )
    effects: tuple[Effect, ...] = (
        TagGeneration(survivors, generation),  # first: a survivor whose trainer exits 75 must find it
        SignalCheckpoint(live_instances(attempt), attempt.container_name(job.job_id)),  # the leaving node too
        DeleteAlarms((instance_id,)),
        Launch(job.job_id),
    )
    return Decision(Outcome.INTERRUPTED, changed, effects, detail, {"SpotInterruptions": 1, "NodesReclaimed": 1})


def record_replacement(
    job: Job, *, attempt_number: int, generation: int, instance_ids: tuple[str, ...], now: datetime
) -> Decision:
    """The replacement launched: it joins the gang, or goes if the gang no longer waits for it."""
    attempt = job.attempt(attempt_number)
    regroup = attempt.regroup if attempt is not None else None
    recorded = attempt is not None and set(instance_ids) <= set(attempt.instance_ids)
    if recorded and regroup is not None and regroup.generation == generation:
        return ignore(Outcome.ALREADY_HANDLED, "the replacement is already recorded")
    if attempt is None or regroup is None or regroup.generation != generation or pending_regroup(job) is not regroup:
        return Decision(Outcome.LAUNCH_ABANDONED, effects=(Terminate(instance_ids),), detail="no regroup waits for it")
    joined = attempt.model_copy(
        update={
            "instance_ids": (*attempt.instance_ids, *instance_ids),
            "generation": generation,
            "regroup": regroup.model_copy(update={"replacements": instance_ids, "launched_at": now}),
        }
    )
    detail = (
        f"{', '.join(instance_ids)} replaces {', '.join(regroup.lost)}: the gang regroups as generation {generation}"
    )
    changed = job.with_attempt(joined, now=now).transition(
        JobState.RUNNING, Reason.NODE_REPLACED, now=now, detail=detail
    )
    effects: list[Effect] = [TagGeneration(joined.instance_ids, generation)]
    spec = job.require_spec()
    if spec.gpus_per_node > 0:
        effects.append(CreateAlarms(job.job_id, instance_ids, spec.idle.gpu_util_below_percent, spec.idle.for_minutes))
    return Decision(Outcome.LAUNCHED, changed, tuple(effects), detail, {"NodesReplaced": len(instance_ids)})


def no_room(
    job: Job, *, attempt_number: int, generation: int, tries: tuple[LaunchTry, ...], detail: str, now: datetime
) -> Decision:
    """The replacement could not be launched: the whole gang is replaced instead (see the module)."""
    attempt = job.attempt(attempt_number)
    regroup = pending_regroup(job)
    if attempt is None or regroup is None or not job.is_current(attempt) or regroup.generation != generation:
        return ignore(Outcome.ALREADY_HANDLED, "no regroup waits for a launch")
    given_up = attempt.whole_again().model_copy(
        update={
            "interrupted_at": regroup.at,
            "regroup": regroup.model_copy(update={"refused_at": now}),
            "tries": (*attempt.tries, *tries),
        }
    )
    said = f"no room for the replacement of {', '.join(regroup.lost)} ({detail}): the whole gang is replaced"
    changed = job.with_attempt(given_up, now=now).transition(
        JobState.INTERRUPTED, Reason.NO_ROOM_FOR_NODE, now=now, detail=said
    )
    return Decision(Outcome.INTERRUPTED, changed, (Launch(job.job_id),), said)


def repair(job: Job, *, now: datetime) -> Decision:
    """What the reconciler re-derives for a regrouping gang: its tags, and its replacement's launch
    until `LAUNCH_LIMIT` (then the whole gang is replaced)."""
    attempt = job.current_attempt
    if job.state is not JobState.RUNNING or attempt is None or attempt.is_over or attempt.regroup is None:
        return ignore(Outcome.NOTHING_TO_DECIDE)
    regroup = attempt.regroup
    if job.stop_request is not None:
        return ignore(Outcome.NOTHING_TO_DECIDE, "a stop is under way: it takes the gang")
    if regroup.pending and now - regroup.at >= LAUNCH_LIMIT:
        return no_room(
            job,
            attempt_number=attempt.number,
            generation=regroup.generation,
            tries=(),
            detail=f"not launched within {int(LAUNCH_LIMIT.total_seconds() // 60)} min",
            now=now,
        )
    effects: tuple[Effect, ...]
    if regroup.pending:
        effects = (TagGeneration(attempt.instance_ids, regroup.generation), Launch(job.job_id))
        return Decision(Outcome.NOTHING_TO_DECIDE, effects=effects)
    if regroup.launched_at is not None and now - regroup.at < TAG_AGAIN_FOR:
        effects = (TagGeneration(live_instances(attempt), attempt.generation),)
        return Decision(Outcome.NOTHING_TO_DECIDE, effects=effects)
    return ignore(Outcome.NOTHING_TO_DECIDE)
