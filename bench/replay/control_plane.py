"""The `gpujobs` row: the real control plane, replayed against spot traces at simulated time.

Nothing of the control plane's policy is written here. The service layer (`JobService`,
`Reactions`, `Reconciler`, `Reports`) runs on the in-memory fakes of `gpujobs_fakes.memory` and
an injected clock (`stack.Stack`), and this module plays only what lies on the other side of its
ports:

- EC2 (the fake compute, refusing through `_refuse_without_room`): one subnet per trace file; a
  spot launch is refused with `InsufficientInstanceCapacity` unless the pool's count, less the spot
  instances the job already holds there, has room for the gang; a running gang gets the warning `warning_s`
  before the first tick without room for it (at once if it launched later than that) and is
  reclaimed at that tick; every instance that goes away is reported as a state change.
- The trainers (`model.Gang`), each following the run document the launch put in its user data:
  boot, wait for the attempt the document names (`wait_for_attempt`) to commit its last save or end,
  as `instance/handover.py` does, restore the newest committed checkpoint, train, heartbeat every
  minute, save every `checkpoint_every_minutes`, and on the notice (the trainer's IMDS watcher; the
  control plane's SSM checkpoint-now arrives in the same seconds) save once, commit, exit 75 and
  power off. A checkpoint-now without a notice (a deadline's move to the other market) saves once
  and trains on until the reconciler takes the instances. A gang that finishes exits 0. Reports
  are signed with the document's report key.
- EventBridge and the schedule: every report and state change is delivered at once, in order,
  through the calls the Lambda handlers make (`Reports.receive`, which checks the signature, and
  `Reactions`), and the reconciler runs every minute.

The run is driven by a queue of timed events; the clock jumps from one to the next and nothing
sleeps, so a 45-day trace replays in seconds.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from gpujobs.contract import ExitCode
from gpujobs.domain.effects import Outcome
from gpujobs.domain.job import Job
from gpujobs.domain.report_auth import sign
from gpujobs.domain.reports import CheckpointReport, ExitReport, HeartbeatReport, Report, SignedReport
from gpujobs.domain.rundoc import RunDocument
from gpujobs.domain.states import JobState
from gpujobs.service.ports import CapacityError, LaunchRequest, Subnet
from gpujobs.service.repairs import Repair
from gpujobs_fakes.memory import FixedClock

from .model import Gang, Ledger, Params, Result
from .stack import Stack, spec_for
from .traces import Pool, TraceSet

START = datetime(2026, 1, 1, tzinfo=UTC)
RECONCILE_EVERY_S = 60.0
"""The stack's schedule: `rate(1 minute)`."""
HEARTBEAT_EVERY_S = 60.0
"""The trainer's default `GPUJOBS_HEARTBEAT_SECONDS`."""
HANDOVER_TIMEOUT_S = 240.0
"""`instance.handover.wait_for_attempt`'s bound: the notice plus margin."""


class ReplayError(RuntimeError):
    """The control plane refused what the replay did (an error counted by the reconciler, a report
    it could not verify): numbers from such a run would describe a bug in the replay, not the policy."""


@dataclass
class Run:
    """One attempt's gang as the cloud sees it: its instances, where, and its trainer."""

    attempt: int
    instance_ids: tuple[str, ...]
    pool: Pool
    launched_at: float
    market: str
    document: RunDocument
    up: set[str] = field(default_factory=set)
    gang: Gang | None = None
    warned_at: float | None = None
    ends_by: float | None = None
    """When it will be gone: its trainer exits after the warning's save, or EC2 reclaims it."""

    @property
    def training(self) -> bool:
        return self.gang is not None and self.gang.stopped_at == math.inf and len(self.up) == len(self.instance_ids)


class ControlPlaneReplay:
    """The control plane wired to the fakes, EC2 following `traces`, and the workload on top."""

    def __init__(self, traces: TraceSet, params: Params, *, capacity: str = "spot-first") -> None:
        self.traces, self.params, self.capacity = traces, params, capacity
        self.pools = {f"subnet-{i:02d}": pool for i, pool in enumerate(traces.pools)}
        subnets = [Subnet(subnet_id, pool.name) for subnet_id, pool in self.pools.items()]
        self.stack = Stack.wire(params, clock=FixedClock(START), subnets=subnets, refuse=self._refuse_without_room)
        self.clock, self.compute, self.store = self.stack.clock, self.stack.compute, self.stack.store
        self.reactions = self.stack.reactions
        self.ledger = Ledger(params)
        self.runs: dict[int, Run] = {}
        self._signals_seen = 0
        self.commits: list[float] = [0.0]
        self.done_at: float | None = None
        self.job_id = ""
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()

    # ---- time -------------------------------------------------------------------------------
    @property
    def now(self) -> float:
        return (self.clock.now() - START).total_seconds()

    def at(self, t: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._queue, (t, next(self._order), action))

    def replay(self) -> Result:
        """Submit the job at the trace's start and play events until it ends or the trace does."""
        outcome = self.stack.service.handle_message(
            json.dumps(spec_for(self.params, capacity=self.capacity)), message_id="goodput-bench"
        )
        if outcome.job.state is JobState.REJECTED:
            raise ReplayError(f"the control plane rejected the job: {'; '.join(outcome.job.problems)}")
        self.job_id = outcome.job.job_id
        self._observe()
        self._reconcile()
        while self._queue and not self.job.state.is_terminal:
            t, _, action = heapq.heappop(self._queue)
            self.clock.current = START + timedelta(seconds=min(t, self.traces.end))
            if t > self.traces.end:
                break
            action()
            self._observe()
        for run in self.runs.values():  # the trace ended under a gang that was still up: paid until its end
            self.ledger.pay(run.launched_at, self.now, run.market, instances=len(run.up))
        return self._result()

    @property
    def job(self) -> Job:
        return self.store.get(self.job_id)

    def _reconcile(self) -> None:
        report = self.stack.reconciler.run()
        if report.repairs[Repair.ERRORS]:
            raise ReplayError(f"the reconciler failed at {self.now:.0f} s: {dict(report.repairs)}")
        self.at(self.now + RECONCILE_EVERY_S, self._reconcile)

    # ---- EC2 --------------------------------------------------------------------------------
    def _refuse_without_room(self, request: LaunchRequest) -> None:
        if request.market.value != "spot":
            return
        pool = self.pools[request.subnet.subnet_id]
        held = sum(
            len(r.up) for r in self.runs.values() if r.pool is pool and r.market == "spot"
        )  # on-demand has its own room
        if pool.capacity(self.now) - held < request.count:
            raise CapacityError(
                "InsufficientInstanceCapacity",
                f"We currently do not have sufficient {request.instance_type} capacity in {pool.name}.",
            )

    def _observe(self) -> None:
        """Take note of the gangs the control plane launched and the instances it terminated, until
        nothing changes (reporting an instance gone may make the control plane launch or terminate)."""
        while self._observe_once():
            pass

    def _observe_once(self) -> bool:
        regroups = {(c.attempt, c.generation) for c in self.compute.calls if c.generation}
        self.ledger.node_reclaims = max(self.ledger.node_reclaims, len(regroups))
        launched: dict[int, list[str]] = {}
        for iid, fake in self.compute.instances.items():
            if fake.request.generation:  # a reclaimed node's replacement found room in its gang's pool
                raise ReplayError(
                    f"at {self.now:.0f} s a reclaimed node's replacement found room in its gang's pool: this"
                    " replay models whole gangs only (its pools' counts never exceed the gang that holds them)"
                )
            if fake.request.attempt not in self.runs:  # even one terminated within the same call
                launched.setdefault(fake.request.attempt, []).append(iid)
        for attempt, ids in launched.items():
            self._start(attempt, tuple(ids))
        ended = [(run, iid) for run in self.runs.values() for iid in sorted(run.up)]
        ended = [(run, iid) for run, iid in ended if self.compute.instances[iid].state != "running"]
        for run, iid in ended:
            self._gone(run, iid)
        signals = self.stack.signaller.signals[self._signals_seen :]
        self._signals_seen += len(signals)
        for instance_ids, _container in signals:
            for run in (r for r in self.runs.values() if set(instance_ids) & r.up):
                self._checkpoint_now(run)
        return bool(launched or ended)

    def _start(self, attempt: int, ids: tuple[str, ...]) -> None:
        request = self.compute.instances[ids[0]].request
        pool = self.pools[request.subnet.subnet_id]
        document = RunDocument.model_validate_json(request.user_data)  # small enough to travel inline
        run = Run(attempt, ids, pool, self.now, request.market.value, document, up=set(ids))
        self.runs[attempt] = run
        self.at(self.now + self.params.boot_s, lambda: self._boot(run))
        drop = pool.next_drop(self.now, nodes=self.params.nodes) if run.market == "spot" else None
        if drop is not None:
            run.ends_by = drop
            reclaimed = ids[pool.capacity(drop) :]  # the nodes beyond what the pool still holds
            self.at(max(self.now, drop - self.params.warning_s), lambda: self._warn(run, reclaimed))
            self.at(drop, lambda: self._reclaim(run, reclaimed))

    def _gone(self, run: Run, iid: str) -> None:
        """An instance went away (reclaimed, powered off or terminated): paid until now, reported."""
        fake = self.compute.instances[iid]
        if fake.state == "running":
            fake.state = "terminated"
        run.up.discard(iid)
        self.ledger.pay(run.launched_at, self.now, run.market, instances=1)
        if run.gang is not None:
            run.gang.stopped_at = min(run.gang.stopped_at, self.now)
        self.reactions.instance_state(iid, fake.state)

    def _warn(self, run: Run, reclaimed: tuple[str, ...]) -> None:
        for iid in reclaimed:
            if iid in run.up:
                self.reactions.spot_warning(iid)
        run.warned_at = self.now
        if run.training:  # the trainer saves once, commits, then exits 75
            gang = run.gang
            assert gang is not None
            gang.stopped_at = self.now
            saved = gang.progress_at(self.now)
            exits_at = self.now + self.params.save_commit_s
            run.ends_by = min(run.ends_by or math.inf, exits_at)
            self.at(exits_at, lambda: self._commit(run, saved))
            self.at(exits_at, lambda: self._exit(run, ExitCode.PREEMPTED))
        elif run.gang is not None:  # still restoring: it stops without anything new to save
            run.gang.stopped_at = self.now

    def _checkpoint_now(self, run: Run) -> None:
        """The SSM signal alone: one save, committed in seconds, and the trainer goes on (a notice,
        handled in `_warn`, comes with its own save)."""
        if run.training and run.warned_at is None and run.gang is not None:
            saved = run.gang.progress_at(self.now)
            run.ends_by = min(run.ends_by or math.inf, self.now + self.params.save_commit_s)
            self.at(self.now + self.params.save_commit_s, lambda: self._commit(run, saved))

    def _reclaim(self, run: Run, reclaimed: tuple[str, ...]) -> None:
        for iid in reclaimed:
            if iid in run.up:
                self._gone(run, iid)

    # ---- the trainers -------------------------------------------------------------------------
    def _boot(self, run: Run) -> None:
        if len(run.up) < len(run.instance_ids) or run.warned_at is not None:
            return  # gone or warned before its trainer started
        awaited = self.runs.get(run.document.wait_for_attempt or 0)
        if awaited is not None and awaited.up and awaited.ends_by is not None:
            handover = min(awaited.ends_by, run.launched_at + self.params.boot_s + HANDOVER_TIMEOUT_S)
            if handover > self.now:  # the bootstrap waits for the reclaimed attempt's last save
                self.at(handover, lambda: self._boot(run))
                return
        every = dataclasses.replace(self.params, checkpoint_every_minutes=run.document.checkpoint_every_minutes)
        gang = Gang.launch(every, at=run.launched_at, resume_from=max(self.commits), booted_at=self.now)
        run.gang = gang
        self.at(gang.ready_at + gang.every, lambda: self._save(run))
        self.at(gang.ready_at + HEARTBEAT_EVERY_S, lambda: self._heartbeat(run))
        self.at(gang.finish_at(self.params.work_s), lambda: self._finish(run))

    def _save(self, run: Run) -> None:
        if run.training and run.gang is not None:
            saved = run.gang.progress_at(self.now)
            self.at(self.now + self.params.save_commit_s, lambda: self._commit(run, saved))
            self.at(self.now + run.gang.every, lambda: self._save(run))

    def _commit(self, run: Run, saved: float) -> None:
        if run.up:  # a save still uploading when its instances went is lost with them
            self.commits.append(saved)
            step = self._step(saved)
            uri = f"{run.document.checkpoint_uri}/step-{step:08d}"
            self._report(run, CheckpointReport(self.job_id, run.attempt, step=step, uri=uri))

    def _heartbeat(self, run: Run) -> None:
        if run.training and run.gang is not None:
            step = self._step(run.gang.progress_at(self.now))
            self._report(run, HeartbeatReport(self.job_id, run.attempt, step=step))
            self.at(self.now + HEARTBEAT_EVERY_S, lambda: self._heartbeat(run))

    def _finish(self, run: Run) -> None:
        if run.training:
            self.done_at = self.now
            self._exit(run, ExitCode.SUCCEEDED)

    def _exit(self, run: Run, code: int) -> None:
        """Each node reports its exit, then its bootstrap powers it off."""
        for iid in run.instance_ids:
            if iid in run.up:
                self._report(run, ExitReport(self.job_id, run.attempt, exit_code=code, instance_id=iid))
                self._gone(run, iid)

    def _report(self, run: Run, report: Report) -> None:
        """Sign with the attempt's key from its run document, as the instance does, and deliver."""
        signed_at = int(self.clock.now().timestamp())
        key = bytes.fromhex(run.document.report_key)
        signature = sign(key, report.DETAIL_TYPE, report.signed_fields(), signed_at=signed_at)
        reaction = self.stack.reports.receive(SignedReport(report, signed_at, signature))
        if reaction.outcome is Outcome.UNPROVEN_REPORT:
            raise ReplayError(f"the control plane refused the trainer's report: {reaction.detail}")

    def _step(self, progress: float) -> int:
        return int(progress // self.params.step_s)

    # ---- the score ----------------------------------------------------------------------------
    def _result(self) -> Result:
        done = self.job.state is JobState.SUCCEEDED and self.done_at is not None
        useful = self.params.work_s if done else max(self.commits)
        gangs = [r.gang for r in self.runs.values() if r.gang is not None]
        trained = sum(g.progress_at(min(g.stopped_at, self.now)) - g.resumed_from for g in gangs)
        self.ledger.lose(trained - useful)
        self.ledger.interruptions = self.job.interruptions
        return self.ledger.result(
            folder=str(self.traces.folder),
            strategy="gpujobs" if self.capacity == "spot-first" else f"gpujobs ({self.capacity})",
            done_at=self.done_at if done else None,
            useful_s=useful,
        )


def gpujobs(traces: TraceSet, params: Params) -> Result:
    """The job as most users submit it: `capacity: spot-first` (the spec's default)."""
    return ControlPlaneReplay(traces, params).replay()


def gpujobs_spot(traces: TraceSet, params: Params) -> Result:
    """The same job with `capacity: spot`, on the anchors' market: it waits for spot rather than pay
    for on-demand, and fails past `max_interruptions` (100, the most a spec may ask)."""
    return ControlPlaneReplay(traces, params, capacity="spot").replay()
