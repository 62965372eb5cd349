"""The anchors' strategies, as models written here (the `gpujobs` row runs the real control plane).

Each follows what `shared/reference/goodput-anchors.md` found in the anchor's code or docs, on the
shared workload model (`model.Gang`), so that only the decisions differ:

- `skypilot-like` (SkyPilot managed jobs, EAGER_NEXT_REGION): the two-minute notice is not used. The
  controller polls every 20 s, so a reclaim is noticed at the next poll; it then launches in the
  next zone (the reclaimed one is blocked for that first pass), and when no zone has room it retries
  every zone after a backoff of 60 s growing 1.6 times up to 300 s (jitter left out). The job
  resumes from its last periodic checkpoint.
- `sagemaker-like` (SageMaker managed spot training): no notice either; after a reclaim the job waits
  for capacity in the same pool (its first one) and resumes from the last periodic checkpoint.
  Waiting is not billed.
- `on-demand`: never interrupted; the price baseline.
- `uniform-progress` (Can't Be Late, NSDI '24, the simulator's `rc_cr_threshold` rule, section 3.3 of
  the anchors): decided at every trace tick from the slack to the deadline; spot while it is
  available and progress is on schedule, on-demand when behind, idle otherwise. The rule's
  changeover delay d is the paper's "provisioning + setup + progress loss": boot, restore and the
  work a reclaim loses at worst (one checkpoint interval); the replay itself charges what each
  change really costs, as for every other strategy. The folder's zones count as one spot market
  (spot is available when any zone has room; a move between zones is a changeover). A switch it
  chooses saves first, so only a reclaim loses work.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .model import Gang, Ledger, Params, Result
from .traces import Pool, TraceSet

SKYPILOT_POLL_S = 20.0
SKYPILOT_BACKOFF_S = 60.0
SKYPILOT_BACKOFF_GROWTH = 1.6
SKYPILOT_BACKOFF_CAP_S = 300.0

Placement = Callable[[float, Pool | None], tuple[float, Pool] | None]
"""Where and when a spot strategy relaunches after time t (the pool reclaimed, None at the start)."""


def on_demand(traces: TraceSet, params: Params) -> Result:
    ledger = Ledger(params)
    gang = Gang.launch(params, at=0.0, resume_from=0.0)
    done = gang.finish_at(params.work_s)
    ledger.pay(0.0, done, "on-demand")
    return ledger.result(folder=str(traces.folder), strategy="on-demand", done_at=done, useful_s=params.work_s)


def _spot_only(traces: TraceSet, params: Params, strategy: str, place: Placement) -> Result:
    """The loop both spot-only anchors share: run until reclaimed, lose what was not committed, relaunch."""
    ledger = Ledger(params)
    committed, t, reclaimed = 0.0, 0.0, None
    while True:
        placed = place(t, reclaimed)
        if placed is None:  # no room again before the trace ends
            return ledger.result(folder=str(traces.folder), strategy=strategy, done_at=None, useful_s=committed)
        start, pool = placed
        gang = Gang.launch(params, at=start, resume_from=committed)
        done = gang.finish_at(params.work_s)
        drop = pool.next_drop(start, nodes=params.nodes)
        ending = drop if drop is not None else pool.end
        if done <= ending:
            ledger.pay(start, done, "spot")
            return ledger.result(folder=str(traces.folder), strategy=strategy, done_at=done, useful_s=params.work_s)
        ledger.pay(start, ending, "spot")
        gang.stopped_at = ending
        ledger.interruptions += drop is not None
        committed = max(committed, gang.committed_by(ending))
        ledger.lose(gang.progress_at(ending) - committed)
        t, reclaimed = ending, pool


def skypilot_like(traces: TraceSet, params: Params) -> Result:
    pools = list(traces.pools)

    def place(t: float, reclaimed: Pool | None) -> tuple[float, Pool] | None:
        if reclaimed is not None:
            t = math.ceil(t / SKYPILOT_POLL_S) * SKYPILOT_POLL_S  # noticed at the next poll
            after = pools.index(reclaimed) + 1
            others = pools[after:] + pools[: after - 1]
            found = traces.first_fit(t, nodes=params.nodes, order=others) if others else None
            if found is not None:
                return t, found
        gap = SKYPILOT_BACKOFF_S
        while t < traces.end:
            found = traces.first_fit(t, nodes=params.nodes)
            if found is not None:
                return t, found
            t += gap
            gap = min(gap * SKYPILOT_BACKOFF_GROWTH, SKYPILOT_BACKOFF_CAP_S)
        return None

    return _spot_only(traces, params, "skypilot-like", place)


def sagemaker_like(traces: TraceSet, params: Params) -> Result:
    def place(t: float, reclaimed: Pool | None) -> tuple[float, Pool] | None:
        candidates = [reclaimed] if reclaimed is not None else list(traces.pools)
        fits = [(at, i) for i, p in enumerate(candidates) if (at := p.next_fit(t, nodes=params.nodes)) is not None]
        if not fits:
            return None
        at, index = min(fits)
        return at, candidates[index]

    return _spot_only(traces, params, "sagemaker-like", place)


def uniform_progress(traces: TraceSet, params: Params) -> Result:
    """The paper's rule with hysteresis and its two safety nets, decided at every tick."""
    assert params.deadline_hours is not None
    ledger = Ledger(params)
    work, deadline = params.work_s, params.deadline_hours * 3600
    gap = min(p.gap_seconds for p in traces.pools)
    changeover = params.boot_s + params.restore_s + params.checkpoint_every_s
    committed, t = 0.0, 0.0
    market: str = "idle"
    pool: Pool | None = None  # the spot pool while on spot
    gang: Gang | None = None
    while True:
        drop: float | None = pool.next_drop(gang.launched_at, nodes=params.nodes) if pool and gang else None
        if gang is not None and gang.finish_at(work) <= min(t, drop if drop is not None else math.inf):
            done = gang.finish_at(work)
            ledger.pay(gang.launched_at, done, market)
            return ledger.result(folder=str(traces.folder), strategy="uniform-progress", done_at=done, useful_s=work)
        if gang is not None and drop is not None and drop <= t:  # reclaimed, without notice
            gang.stopped_at = drop
            ledger.pay(gang.launched_at, drop, "spot")
            ledger.interruptions += 1
            committed = max(committed, gang.committed_by(drop))
            ledger.lose(gang.progress_at(drop) - committed)
            market, pool, gang = "idle", None, None
        progress = gang.progress_at(t) if gang else committed
        spot_pool = pool or (traces.first_fit(t, nodes=params.nodes) if t < traces.end else None)
        want = _uniform_progress_rule(
            market=market,
            has_spot=spot_pool is not None,
            settled=gang is not None and t >= gang.ready_at,
            t=t,
            left=work - progress,
            work=work,
            deadline=deadline,
            gap=gap,
            changeover=changeover,
        )
        if want != market:
            if gang is not None:  # a switch it chose: save first, lose nothing
                gang.stopped_at = t
                committed = gang.progress_at(t)
                ledger.pay(gang.launched_at, t, market)
            market, pool = want, spot_pool if want == "spot" else None
            gang = None if want == "idle" else Gang.launch(params, at=t, resume_from=committed)
        t += gap


def _uniform_progress_rule(
    *,
    market: str,
    has_spot: bool,
    settled: bool,
    t: float,
    left: float,
    work: float,
    deadline: float,
    gap: float,
    changeover: float,
) -> str:
    """`rc_cr_threshold._step`: what to run in the tick starting at `t` ("spot", "on-demand", "idle")."""
    done = work - left
    behind = done - t * work / deadline < 0
    want = "spot" if has_spot else ("on-demand" if behind else "idle")
    if market == "on-demand" and (not has_spot or (t + 2 * changeover) * work / deadline - done >= 0):
        want = "on-demand"
    remaining = math.floor((deadline - t) / gap) * gap
    if math.ceil((left + 2 * changeover) / gap) * gap >= remaining and market in ("idle", "on-demand"):
        want = "on-demand"
    if math.ceil((left + changeover) / gap) * gap >= remaining:
        want = "spot" if market == "spot" and settled else "on-demand"
    return want
