"""The workload every strategy runs, its time costs and prices, and how a run is scored.

One model of the training job serves every strategy, so that they differ only in what they decide:
a gang is paid from its launch; it boots (instance, AMI, image pull) for `boot_s`, restores the
newest committed checkpoint for `restore_s` when there is one, then trains one second of work per
second, saving a checkpoint every `checkpoint_every_minutes` of training wall time. A save stalls
training for `save_stall_s` (the asynchronous save's blocking phase) and is committed, so a
replacement can resume from it, `save_commit_s` after it started. Work after the newest committed
checkpoint dies with its gang. Progress is measured in seconds of work; a step is `step_s` of it.

Score: goodput = useful GPU-hours / paid GPU-hours, where useful is the job's work (done once) and
paid is every second an instance of the job existed, booting, restoring, saving, redoing lost work
or overlapping its replacement; cost per useful GPU-hour is what was paid over what was useful.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Params:
    """The benchmark's knobs; every default is documented with its source in the README."""

    hours_of_work: float = 48.0
    nodes: int = 1
    gpus_per_node: int = 1
    deadline_hours: float | None = None
    boot_s: float = 480.0
    """Launch to the training container running: provisioning about 4 min for p3.2xlarge (Can't Be
    Late, Table 4) plus a multi-GB image pull, 4 to 6 min for a DLC image (AWS ML blog); the low end."""
    restore_s: float = 30.0
    """Reading the newest checkpoint (1 GB model and optimizer) from S3 onto the GPU: no public
    figure (anchors, section 4); 1 GB at S3's ~100 MB/s per stream plus the load."""
    save_stall_s: float = 0.14
    """Training stall of one asynchronous save: README checkpoint bench, worst case (0.029 s typical)."""
    save_commit_s: float = 12.0
    """Save start to COMMIT.json in S3: README checkpoint bench, spot notice to committed on S3 (moto)."""
    checkpoint_every_minutes: int = 30
    """The job spec's default; the `gpujobs` row passes it in the spec, as a user would."""
    step_s: float = 1.0
    warning_s: float = 120.0
    """EC2's spot interruption notice."""
    spot_usd_per_hour: float = 0.918
    """p3.2xlarge spot, 2023-04 (the `prices` field of the 2023-04-22 us-east-1c trace; paper: $0.92)."""
    on_demand_usd_per_hour: float = 3.06
    """p3.2xlarge on-demand, us-east-1 (skypilot-catalog v7)."""
    instance_type: str = "p3.2xlarge"

    @property
    def checkpoint_every_s(self) -> float:
        return self.checkpoint_every_minutes * 60.0

    @property
    def work_s(self) -> float:
        return self.hours_of_work * 3600

    def price(self, market: str) -> float:
        return self.spot_usd_per_hour if market == "spot" else self.on_demand_usd_per_hour

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class Gang:
    """One launch of the job's gang and the progress it makes (closed forms, no time steps)."""

    launched_at: float
    ready_at: float
    """When training starts: after the boot and, when resuming, the restore."""
    resumed_from: float
    every: float
    stall: float
    commit: float
    stopped_at: float = math.inf
    """Training stops here (the trainer saves on a spot notice and exits, or the gang is gone)."""

    @classmethod
    def launch(cls, params: Params, *, at: float, resume_from: float, booted_at: float | None = None) -> Gang:
        """A gang launched `at`; it resumes from `resume_from` once booted (later if it had to wait)."""
        booted = max(at + params.boot_s, booted_at or 0.0)
        ready = booted + (params.restore_s if resume_from > 0 else 0.0)
        return cls(at, ready, resume_from, params.checkpoint_every_s, params.save_stall_s, params.save_commit_s)

    def progress_at(self, t: float) -> float:
        """Work done by `t`: every save in between stalls training for `stall` seconds."""
        elapsed = min(t, self.stopped_at) - self.ready_at
        if elapsed <= 0:
            return self.resumed_from
        saves = math.floor(elapsed / self.every)
        stalled = 0.0 if saves == 0 else (saves - 1) * self.stall + min(self.stall, elapsed - saves * self.every)
        return self.resumed_from + elapsed - stalled

    def finish_at(self, work: float) -> float:
        """When progress reaches `work` if nothing stops the gang (the inverse of `progress_at`)."""
        need = work - self.resumed_from
        if need <= self.every:
            return self.ready_at + max(need, 0.0)
        periods, rest = divmod(need - self.every, self.every - self.stall)
        end = self.ready_at + (periods + 1) * self.every
        return end if rest == 0 else end + self.stall + rest

    def save_starts(self, until: float) -> list[float]:
        """Periodic saves started before `until` (and before training stopped)."""
        last = min(until, self.stopped_at)
        count = max(0, math.floor((last - self.ready_at) / self.every))
        return [self.ready_at + k * self.every for k in range(1, count + 1) if self.ready_at + k * self.every < last]

    def committed_by(self, t: float) -> float:
        """The newest work this gang's periodic saves committed by `t` (its resume point otherwise)."""
        done = [s for s in self.save_starts(t) if s + self.commit <= t]
        return self.progress_at(done[-1]) if done else self.resumed_from


@dataclass
class Ledger:
    """What a run paid for and what it lost, whichever strategy ran it."""

    params: Params
    intervals: list[tuple[float, float, str, int]] = field(default_factory=list)
    """(start, end, market, instances) of everything paid for, in seconds from the trace start."""
    lost_s: float = 0.0
    interruptions: int = 0
    node_reclaims: int = 0

    def pay(self, start: float, end: float, market: str, *, instances: int | None = None) -> None:
        """Instances (default: the whole gang) held from `start` to `end`."""
        count = self.params.nodes if instances is None else instances
        if end > start and count > 0:
            self.intervals.append((start, end, market, count))

    def lose(self, seconds: float) -> None:
        self.lost_s += max(0.0, seconds)

    def result(self, *, folder: str, strategy: str, done_at: float | None, useful_s: float) -> Result:
        p = self.params
        paid_gpu_h = sum((end - start) * n for start, end, _, n in self.intervals) / 3600 * p.gpus_per_node
        cost = sum((end - start) / 3600 * n * p.price(market) for start, end, market, n in self.intervals)
        useful_gpu_h = useful_s / 3600 * p.nodes * p.gpus_per_node
        hours = None if done_at is None else done_at / 3600
        met = None if p.deadline_hours is None else hours is not None and hours <= p.deadline_hours
        return Result(
            traces=folder,
            strategy=strategy,
            goodput=useful_gpu_h / paid_gpu_h if paid_gpu_h else 0.0,
            cost_per_useful_gpu_hour=cost / useful_gpu_h if useful_gpu_h else None,
            hours_to_finish=hours,
            steps_lost=round(self.lost_s / p.step_s),
            interruptions=self.interruptions,
            met_deadline=met,
            paid_gpu_hours=paid_gpu_h,
            cost_usd=cost,
            node_reclaims=self.node_reclaims,
        )


@dataclass(frozen=True)
class Result:
    traces: str
    strategy: str
    goodput: float
    cost_per_useful_gpu_hour: float | None
    hours_to_finish: float | None
    """None: the job was not done when the trace ended."""
    steps_lost: int
    interruptions: int
    met_deadline: bool | None
    paid_gpu_hours: float
    cost_usd: float
    node_reclaims: int = 0
    """gpujobs: reclaims of one node of a gang whose replacement it tried in the gang's own pool
    (`domain.regroup`); in these traces none finds room there (a reclaim is the pool's count falling
    below the gang), and the whole gang moves."""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)
