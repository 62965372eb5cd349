"""A simulated cloud around the wired world: EC2, EventBridge and the trainers, with a clock.

The service layer sees only its ports; this model plays everything on the other side of them. EC2
reclaims spot instances two minutes after their warning and reports every state change; trainers
heartbeat, commit checkpoints and exit; EventBridge delivers each report late, twice or never, in
whatever order the test chooses; the reconciler runs every few minutes of simulated time. Every port
is wrapped by `faults.FaultyPort`, so any call the control plane makes can be made to fail.

`violations()` states, as data, what must hold after any step; `quiet()` plays the period after the
storm (faults off, capacity back, every event delivered, the clock past every grace and lease) and
`unhealthy()` lists what is still wrong once it is over.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from gpujobs.adapters.catalog import packaged_hardware
from gpujobs.adapters.cloudwatch import THROTTLE_LOOKBACK
from gpujobs.adapters.dynamodb import MAX_ITEM_BYTES, item_size, job_item
from gpujobs.contract import IDLE_DETECTION_OFF, UP_STATES, ExitCode
from gpujobs.domain import keep, retention
from gpujobs.domain.admission import plan
from gpujobs.domain.budget import BudgetMode, launch_hold
from gpujobs.domain.deadline import DeadlineMarkets, launch_markets, time_trained
from gpujobs.domain.fate import (
    BOOT_DEATH_LIMIT,
    BOOT_WINDOW,
    MISCONFIGURED_EXIT_CODES,
    UNHEALTHY_LIMIT,
    Verdict,
    unhealthy_in_a_row,
)
from gpujobs.domain.gangs import RECLAIM_GRACE, SPOT_WARNING_WINDOW, placement_group_of
from gpujobs.domain.hangs import HANG_DUMP_WAIT, launched_at
from gpujobs.domain.idle_detection import GPU_METRIC_GRACE
from gpujobs.domain.job import Admission, Job, Market
from gpujobs.domain.job_access import job_prefix
from gpujobs.domain.launching import LEASE_MARGIN
from gpujobs.domain.ledger import gpus_of, holds, truth, waits
from gpujobs.domain.pools import reclaims_of
from gpujobs.domain.progress import MAX_PROGRESS_POINTS
from gpujobs.domain.quotas import QUOTA_ERROR_CODES
from gpujobs.domain.reports import CheckpointReport, ExitReport, HeartbeatReport
from gpujobs.domain.spec import Capacity
from gpujobs.domain.states import JobState, Reason
from gpujobs.domain.teams import TeamDirectory, parse_team_config
from gpujobs.domain.volatility import VOLATILE_COUNT, VOLATILE_WINDOW, is_spot_reclaim
from gpujobs.service.budgeting import BudgetReactions
from gpujobs.service.ports import CapacityError, JobNotFoundError, LaunchRequest, QuotaExceededError
from gpujobs.service.repairs import Repair
from gpujobs.service.sweeps import ORPHAN_GRACE
from gpujobs_fakes.evidence import FixedPlacementScores
from gpujobs_fakes.memory import FixedClock, StaticTeamConfig
from tests.service.conftest import CONFIG, World
from tests.service.faults import FaultPlan, InjectedFaultError, When, wrap_ports

START = datetime(2026, 11, 30, 21, 0, tzinfo=UTC)
"""Three hours before a budget period rolls over, so that clock jumps cross it."""
RECONCILE_EVERY = timedelta(minutes=5)
"""The schedule says every minute; five keeps the model cheap and still inside every bound below."""
UNRECORDED_LIMIT = timedelta(minutes=15)
RECLAIM_WINDOW = SPOT_WARNING_WINDOW + RECLAIM_GRACE + 2 * RECONCILE_EVERY
"""How long the gang of a reclaimed attempt may overlap its replacement: the warning, the grace its
trainers get to exit, and two reconciler runs (one of them may be the run a fault killed)."""
CAPACITY_MESSAGE = (
    "We currently do not have sufficient {type} capacity in the Availability Zone you requested ({zone}). "
    "Our system will be working on provisioning additional capacity. You can currently get {type} capacity "
    "by not specifying an Availability Zone in your request or choosing us-east-1b, us-east-1c, us-east-1d."
)
"""EC2's own InsufficientInstanceCapacity message: the ~250 characters every refusal records."""
OBJECT_RETENTION = timedelta(hours=1)
"""How long an ended job's objects are kept here: two of the clock's half-hour jumps, or its 4 h one, cross it."""
RUN_INSTANCES_SECONDS = 10
FALLBACKS = {
    DeadlineMarkets.SPOT_FIRST: (Market.ON_DEMAND, Market.SPOT),
    DeadlineMarkets.ON_DEMAND: (Market.ON_DEMAND,),
}
"""A replacement may land on the market its move left when the deadline, as its walk found it, allows it."""
"""What one RunInstances call spends of its invocation's time (the simulation's clock stands still)."""
EXIT_CODES = (ExitCode.SUCCEEDED, ExitCode.PREEMPTED, ExitCode.CRASHED, ExitCode.SYNC_FAILED)
CONFIG_ERROR_CODES = (ExitCode.CONFIG_ERROR, 2)
HARDWARE_CODES = (ExitCode.UNHEALTHY_NODE, ExitCode.HARDWARE_FAULT)
HARDWARE_REASONS = frozenset({Reason.UNHEALTHY_NODE, Reason.HARDWARE_FAULT, Reason.SLOW_INTERCONNECT})
"""Endings by the gang's hosts (a failed GPU check, a hardware fault, an all-reduce below the floor):
never counted as a crash or an interruption (`_unhealthy_nodes_counted`)."""
CRASH_REASONS = frozenset(
    {Reason.CRASHED_RETRYING, Reason.CRASHED_TOO_OFTEN, Reason.SYNC_FAILED, Reason.INSTANCE_LOST, Reason.CONFIG_ERROR}
)
"""The transitions a crash is counted with (`fate.Move.counts_crash`)."""
RECLAIM_REASONS = frozenset(
    {Reason.SPOT_INTERRUPTION, Reason.NODE_RECLAIMED, Reason.NO_ROOM_FOR_NODE, Reason.INSTANCE_LOST}
)
"""The transitions an interruption is counted with (a reclaim, or a gang's node reclaimed)."""
MARKETS = (Market.SPOT.value, Market.ON_DEMAND.value)
FAULT_TIMINGS = (When.BEFORE, When.AFTER)
TEAM_PRINCIPAL = "AROAEXAMPLEID1234567"
"""Who submits when the sequence runs with a team configuration."""


def item_bytes(job: Job) -> int:
    """The size DynamoDB counts for the job's item as the store writes it."""
    return item_size(job_item(job))


FAKE_MODULES = frozenset({"gpujobs_fakes.memory", "gpujobs_fakes.recording"})
"""Where the in-memory fakes live. The recording ones (publisher, alarms, signaller, budgets, quotas,
prices, blobs, report keys) moved to their own module in a refactor and, while this named only the
first, were never faulted: every call of theirs is a call that can fail."""


def is_fake(value: object) -> bool:
    """A port implemented by the in-memory fakes (the clock is time itself, never faulted)."""
    return type(value).__module__ in FAKE_MODULES and not isinstance(value, FixedClock)


@dataclass
class Delivery:
    """One event on its way to a handler: a report from a trainer, EC2 or CloudWatch."""

    kind: str
    args: tuple[Any, ...]

    def __str__(self) -> str:
        return f"{self.kind}{self.args}"


@dataclass
class SimulatedCloud:
    world: World = field(default_factory=World)
    plan: FaultPlan = field(default_factory=FaultPlan)
    pending: list[Delivery] = field(default_factory=list)
    budget_has_room: bool = False
    budget_alerts_at: list[datetime] = field(default_factory=list)
    """When a budget alert was applied: a policy that tightens between a deadline's move and its
    replacement's launch may land the replacement on the market the move left."""
    reclaim_at: dict[str, datetime] = field(default_factory=dict)
    steps: dict[tuple[str, int], int] = field(default_factory=dict)
    hung: set[tuple[str, int]] = field(default_factory=set)
    """Gangs whose trainer reports nothing more: stuck in a collective, or, hung before its first
    heartbeat, in NCCL/EFA initialisation. Every other live gang heartbeats on each tick."""
    refused: dict[tuple[str, str, str], str] = field(default_factory=dict)
    """Pools EC2 refuses now, with the refusal's code (no capacity, or a vCPU quota's)."""
    invocation_seconds: int | None = None
    """What each handler's invocation has left when it starts (None: no deadline); each RunInstances
    spends `RUN_INSTANCES_SECONDS` of it, so a walk is cut short after a few rungs."""
    spent_seconds: int = 0
    seen_state: dict[str, str] = field(default_factory=dict)
    terminal: dict[str, JobState] = field(default_factory=dict)
    published: int = 0
    last_reconcile: datetime = START
    faults_absorbed: int = 0
    leases_left_held: list[str] = field(default_factory=list)
    reports_throttled: bool = False
    """The Reports function is throttled: trainers' heartbeats wait in Lambda's queue (`pending`)."""
    throttled_at: datetime | None = None
    """When the Reports function was last throttled (what its CloudWatch Throttles metric says)."""
    hangs_judged_wrongly: list[str] = field(default_factory=list)
    heard_at: dict[tuple[str, int], datetime] = field(default_factory=dict)
    """When the control plane first acted on a report (heartbeat, checkpoint, exit) of each attempt:
    one it ignored (the attempt was over, the step stale) was not heard."""
    progress_heard: set[str] = field(default_factory=set)
    """Jobs of which the control plane acted on a heartbeat or a checkpoint, in any attempt."""
    config_exits_heard: set[str] = field(default_factory=set)
    """Jobs of which it acted on an exit with a configuration error's code."""
    signals_answered: int = 0
    """How many of the signaller's checkpoint-now calls the trainers have answered (each that reached
    its instances: a call that failed after SSM took it counts, one that failed before does not)."""
    quiet_since: datetime | None = None
    objects: dict[str, str] = field(default_factory=dict)
    """Job id -> the object its submitter stored under the job's prefix (the `code:` archive)."""
    deadline_markets: dict[tuple[str, int], DeadlineMarkets | None] = field(default_factory=dict)
    """What the deadline allowed each attempt's launch when its walk asked EC2 (`deadline.launch_markets`)."""
    event_ids: dict[tuple[str, int], tuple[Any, ...]] = field(default_factory=dict)
    """(job id, sequence) -> the transition the events with that id carried."""
    published_through: dict[str, int] = field(default_factory=dict)
    """Per job, the highest sequence published so far (each first published right after the one before)."""
    moves_broken_early: list[str] = field(default_factory=list)
    """Moved attempts the control plane terminated before their replacement's gang was up."""
    gone_on_its_own: dict[str, datetime] = field(default_factory=dict)
    """Instances that went away not by the control plane's hand (an exit's shutdown, a reclaim, a
    fault), and when."""
    zone_orders_broken: list[str] = field(default_factory=list)
    """Walks that tried a spot zone EC2 scored lower before a higher-scored one (`domain.pools`)."""
    warned: set[str] = field(default_factory=set)
    """Instances EC2 sent a spot warning for."""
    unreclaimed: dict[str, datetime | None] = field(default_factory=dict)
    """Instances warned by a warning whose reclaim never comes (a drill, or one sent by hand), and when
    the control plane first handled that warning (None: not yet)."""
    teams: StaticTeamConfig | None = None
    """The team configuration the sequence runs with (`use_teams`); None: none."""
    admissions: dict[str, Admission | None] = field(default_factory=dict)
    """Per job, its admission as the last step left it: a preemption takes only borrowed GPUs."""
    kept_work: dict[str, tuple[int, timedelta]] = field(default_factory=dict)
    item_sizes: dict[tuple[str, int], int] = field(default_factory=dict)
    """Per (job, version), the item's size as the store writes it: measured once per write (`violations`)."""
    kept_up: set[str] = field(default_factory=set)
    """Instances whose workload crashed under `keep_on_failure`: their bootstrap kept them up (`domain.keep`)."""
    counted: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    """Per job, (crashes, interruptions, transitions) as the last step left them (`_unhealthy_nodes_counted`)."""
    hardware_endings: Counter[tuple[str, int]] = field(default_factory=Counter)
    """Per job attempt, the unhealthy-node or hardware-fault transitions it was ever ended with."""

    """Per job, the most work its record has said is kept: (checkpoint step, time trained)."""

    def __post_init__(self) -> None:
        world = self.world
        world.clock.current = START
        # the fakes themselves, beneath the fault-injecting wrappers: what the sequence sets and reads
        self.scores: FixedPlacementScores = world.ports.placement_scores  # type: ignore[assignment]
        self.evidence = world.ports.pool_evidence
        self.last_reconcile = START
        world.rewire(
            config=replace(CONFIG, hardware=packaged_hardware()),  # EFA, GPU counts and floors per type, as deployed
            **wrap_ports(world.ports, self.plan, is_port=is_fake),
            budget_has_room=lambda _policy: self.budget_has_room,
            time_left=self._time_left,
            reports_throttled_at=self._reports_throttled_at,
        )
        world.compute.on_run = self._refuse_with_ec2_message
        world.compute.on_terminate = self._judge_termination
        world.store.stream.reads_on_write = False  # the Publisher function reads it when `read_stream` says
        world.reconciler = replace(world.reconciler, object_retention=OBJECT_RETENTION)
        self.budgets = BudgetReactions(ports=world.ports, reactions=world.reactions, stack_name="chaos")

    @property
    def now(self) -> datetime:
        return self.world.clock.now()

    # ---- acting on the control plane ------------------------------------------------------------
    def attempt(self, action: Callable[[], object]) -> bool:
        """Run a handler; a fault kills it like a Lambda dies. Anything else is a bug and propagates."""
        self.spent_seconds = 0  # a new invocation, with its own deadline
        leases = self._leases()
        fired = len(self.plan.fired)
        calls = len(self.world.compute.calls)
        try:
            action()
        except InjectedFaultError:
            self.faults_absorbed += 1
            self._leases_past_the_invocation(leases)
            return False
        finally:
            self.observe()
            self._judge_zone_order(self.world.compute.calls[calls:])
        if len(self.plan.fired) == fired:  # it ran to its end: no walk of its may hold a job for the lease
            self.leases_left_held += [
                f"{job_id}: a completed handler left the launch lease held until {lease}"
                for job_id, lease in self._leases().items()
                if lease > self.now and leases.get(job_id) != lease
            ]
        return True

    def _judge_zone_order(self, calls: list[LaunchRequest]) -> None:
        """Within one invocation (one set of scores), a walk tries a type's spot zones that neither
        the stack's evidence nor the job's record shows a reclaim in from the highest score to the
        lowest (`domain.pools.rank`); zones with reclaims are ordered by them first, and not judged."""
        reclaimed = {r.pool for r in self.evidence.recent(now=self.now)}
        walks: dict[tuple[str, int, str], list[str]] = defaultdict(list)
        for call in calls:
            if call.market is Market.SPOT and not call.generation:  # a regroup launches into its gang's pool
                walks[(call.job_id, call.attempt, call.instance_type)].append(call.subnet.zone)
        for (job_id, number, instance_type), zones in walks.items():
            own = {r.pool for r in reclaims_of(self.world.store.get(job_id))}
            quiet = [z for z in zones if (instance_type, z) not in reclaimed | own]
            scored = [self.scores.scores.get(z, 0) for z in quiet]
            if scored != sorted(scored, reverse=True):
                self.zone_orders_broken.append(
                    f"{job_id}: attempt {number} tried {instance_type} spot in {quiet} (scores {scored},"
                    f" none reclaimed), not the highest-scored zone first"
                )

    def _leases_past_the_invocation(self, before: dict[str, datetime]) -> None:
        """A handler killed mid-walk holds the launches it claimed no longer than its invocation
        could have lived (Lambda ends it at its deadline): the next tick after takes them over."""
        if self.invocation_seconds is None:
            return
        end = self.now + timedelta(seconds=self.invocation_seconds) + LEASE_MARGIN
        self.leases_left_held += [
            f"{job_id}: a walk killed mid-way holds the launch lease until {lease}, past its invocation's end {end}"
            for job_id, lease in self._leases().items()
            if lease > end and before.get(job_id) != lease
        ]

    def _reports_throttled_at(self, now: datetime) -> datetime | None:
        at = self.throttled_at
        return at if at is not None and now - at <= THROTTLE_LOOKBACK else None

    def _time_left(self) -> timedelta | None:
        if self.invocation_seconds is None:
            return None
        return timedelta(seconds=self.invocation_seconds - self.spent_seconds)

    def _leases(self) -> dict[str, datetime]:
        return {
            job.job_id: job.current_attempt.lease_expires_at
            for job in self.world.store.list_by_state(JobState.LAUNCHING, limit=10_000)
            if job.current_attempt is not None and job.current_attempt.lease_expires_at is not None
        }

    def use_teams(self, config: dict[str, Any] | None) -> None:
        """Run with a team configuration (quotas, weights, borrowing, priorities): submissions then
        come from its principal. None: without one, as a single-tenant stack."""
        if config is None:
            return
        document = {
            "teams": {team: {"principals": [TEAM_PRINCIPAL], **quota} for team, quota in config["teams"].items()},
            "fleet": config.get("fleet", {}),
        }
        self.teams = StaticTeamConfig(parse_team_config(json.dumps(document)))
        self.world.rewire(teams=self.teams)

    def switch_teams(self, *, drain: bool, pause: str | None) -> None:
        """The platform team drains the fleet or pauses a team (or lifts it): quotas stay as they are."""
        if self.teams is None:
            return
        directory = self.teams.directory
        teams = {
            name: replace(policy, quota=replace(policy.quota, paused=name == pause))
            for name, policy in directory.teams.items()
        }
        self.teams.directory = replace(directory, teams=teams, fleet=replace(directory.fleet, drain=drain))

    def submit(self, body: str, message_id: str) -> bool:
        sender = TEAM_PRINCIPAL if self.teams is not None else None
        handled = self.attempt(lambda: self.world.service.handle_message(body, message_id=message_id, sender=sender))
        for job in self.jobs():  # the CLI uploaded its code archive before it sent the message
            if job.job_id not in self.objects and not job.state.is_terminal:
                self.objects[job.job_id] = f"{job_prefix(job.job_id)}code/archive.tar.gz"
                self.world.blobs.objects[self.objects[job.job_id]] = "code"
        return handled

    def read_stream(self) -> bool:
        """The Publisher function reads the table's stream: every write's state changes not yet put
        on the bus go out in order, up to the first whose PutEvents fails (read again next time)."""
        return self.attempt(self.world.store.stream.read)

    def reconcile(self) -> bool:
        self.last_reconcile = self.now
        up = set(self.up_instances())
        gangs = self.gangs()
        hung = sum(1 for gang, nodes in gangs.items() if gang in self.hung and up.intersection(nodes))
        # a gang whose every live node crashed and was kept up (`keep_on_failure`) heartbeats no more
        # either: until its exit reports arrive, it looks as hung as it is (and is dumped before it is killed)
        kept_silent = {self._gang_of(iid) for iid in up & self.kept_up} - set(gangs)
        hung += len(kept_silent)
        dumped_long_enough = self._hung_gangs_dumped_before(self.now - HANG_DUMP_WAIT, up, silent=kept_silent)

        def run() -> None:
            repairs = self.world.reconciler.run().repairs
            judged = repairs[Repair.HUNG_ATTEMPTS_DUMPED] + repairs[Repair.HUNG_ATTEMPTS_TERMINATED]
            if judged > hung:
                self.hangs_judged_wrongly.append(
                    f"{self.now}: {judged} attempt(s) judged hung, but only {hung} gang(s) stopped heartbeating"
                    + (" (reports throttled)" if self.reports_throttled else "")
                )
            if repairs[Repair.HUNG_ATTEMPTS_TERMINATED] > dumped_long_enough:
                self.hangs_judged_wrongly.append(
                    f"{self.now}: {repairs[Repair.HUNG_ATTEMPTS_TERMINATED]} hung gang(s) killed, but only "
                    f"{dumped_long_enough} had their stacks asked for {HANG_DUMP_WAIT} before (`domain.hangs`)"
                )

        return self.attempt(run)

    def _hung_gangs_dumped_before(self, when: datetime, up: set[str], *, silent: set[tuple[str, int]]) -> int:
        """Hung (or `silent`) gangs, still up, whose record says their dump was asked for at or before `when`."""
        return sum(
            1
            for job in self.jobs()
            if (attempt := job.current_attempt) is not None
            and ((job.job_id, attempt.number) in self.hung or (job.job_id, attempt.number) in silent)
            and attempt.hang_dump_asked_at is not None
            and attempt.hang_dump_asked_at <= when
            and up.intersection(attempt.instance_ids)
        )

    def deliver(self, index: int, *, keep: bool = False) -> None:
        """Deliver one pending event; it stays pending if the handler died (Lambda retries) or `keep`."""
        event = self.pending[index]
        if self.attempt(lambda: self._handle(event)) and not keep:
            self.pending.remove(event)

    def deliver_all(self) -> None:
        while self.pending:
            self.deliver(0)

    def _handle(self, event: Delivery) -> object:
        reactions = self.world.reactions
        handlers: dict[str, Callable[..., object]] = {
            "state": reactions.instance_state,
            "warning": reactions.spot_warning,
            "rebalance": reactions.rebalance,
            "idle": reactions.idle_alarm,
            "heartbeat": lambda j, a, s: reactions.report(
                HeartbeatReport(job_id=j, attempt=a, step=s, metrics=(("loss", loss_at(s)),), steps_per_second=1.0)
            ),
            "checkpoint": lambda j, a, s: reactions.report(
                CheckpointReport(job_id=j, attempt=a, step=s, uri=f"s3://ckpt/{j}/step-{s:08d}")
            ),
            "exit": lambda j, a, i, c: reactions.report(ExitReport(job_id=j, attempt=a, instance_id=i, exit_code=c)),
        }
        if event.kind == "exit" and event.args[3] in MISCONFIGURED_EXIT_CODES:
            # Reported, even if the handler then fails: a fault after its write still leaves the verdict recorded.
            self.config_exits_heard.add(event.args[0])
        ended = event.kind in ("heartbeat", "checkpoint") and self._has_ended(event.args[0])
        reported = event.kind in ("heartbeat", "checkpoint", "exit")
        attempt_over = reported and self._attempt_over(event.args[0], event.args[1])
        handled = handlers[event.kind](*event.args)
        if event.kind == "warning" and event.args[0] in self.unreclaimed and self.unreclaimed[event.args[0]] is None:
            self.unreclaimed[event.args[0]] = self.now
        if reported and not getattr(handled, "ignored", True) and not attempt_over:
            # heard before the attempt's verdict: one recorded on an attempt already judged came after it
            self.heard_at.setdefault((event.args[0], event.args[1]), self.now)
            if event.kind != "exit" and not ended:  # a report that comes after the verdict did not precede it
                self.progress_heard.add(event.args[0])
        return handled

    def _attempt_over(self, job_id: str, number: int) -> bool:
        try:
            attempt = self.world.store.get(job_id).attempt(number)
        except JobNotFoundError:
            return False
        return attempt is not None and attempt.is_over

    def _has_ended(self, job_id: str) -> bool:
        try:
            return job_id in self.terminal or self.world.store.get(job_id).state.is_terminal
        except JobNotFoundError:
            return False

    # ---- EC2 ----------------------------------------------------------------------------------
    def _refuse_with_ec2_message(self, request: LaunchRequest) -> None:
        self.spent_seconds += RUN_INSTANCES_SECONDS
        markets = launch_markets(self.world.store.get(request.job_id), now=self.now)
        self.deadline_markets[(request.job_id, request.attempt)] = markets  # what the walk's ladder followed
        pool = (request.instance_type, request.subnet.zone, request.market.value)
        code = self.refused.get(pool)
        if code in QUOTA_ERROR_CODES:
            raise QuotaExceededError(code, "You have requested more vCPU capacity than your current vCPU limit")
        if code is not None:
            message = CAPACITY_MESSAGE.format(type=request.instance_type, zone=request.subnet.zone)
            raise CapacityError(code, message)

    def set_capacity(self, pool: tuple[str, str, str], *, available: bool, quota: bool = False) -> None:
        """A pool gains or loses room; `quota`: the Region's vCPU quota of its market refuses it."""
        if available:
            self.refused.pop(pool, None)
        elif quota:
            market = pool[2]
            self.refused[pool] = "MaxSpotInstanceCountExceeded" if market == "spot" else "VcpuLimitExceeded"
        else:
            self.refused[pool] = "InsufficientInstanceCapacity"

    def up_instances(self) -> list[str]:
        return sorted(iid for iid, f in self.world.compute.instances.items() if f.state in UP_STATES)

    def gangs(self) -> dict[tuple[str, int], list[str]]:
        """Instances that may run a trainer, by (job, attempt) as tagged at launch."""
        gangs: dict[tuple[str, int], list[str]] = defaultdict(list)
        for iid in self.up_instances():
            if iid in self.kept_up:  # its workload has crashed: no trainer runs there any more
                continue
            request = self.world.compute.instances[iid].request
            gangs[(request.job_id, request.attempt)].append(iid)
        return dict(sorted(gangs.items()))

    def shut_down(self, instance_id: str) -> None:
        """The instance goes away on its own (a shutdown after exit, a reclaim, a hardware fault)."""
        fake = self.world.compute.instances[instance_id]
        if fake.state in UP_STATES:
            fake.state = "terminated"
            self.gone_on_its_own.setdefault(instance_id, self.now)
        self.observe()

    def warn(self, instance_id: str, *, reclaimed: bool = True) -> None:
        """A spot warning: the event goes out now, and EC2 takes the instance two minutes later;
        `reclaimed` False: a drill or a warning sent by hand, after which nothing takes it."""
        self.warned.add(instance_id)
        if reclaimed:
            self.reclaim_at.setdefault(instance_id, self.now + SPOT_WARNING_WINDOW)
        elif instance_id not in self.reclaim_at:
            self.unreclaimed.setdefault(instance_id, None)
        self.pending.append(Delivery("warning", (instance_id,)))

    def observe(self) -> None:
        """EC2 reports every instance state change it made (the handlers ignore all but the ends);
        a trainer that got checkpoint-now saves and reports the commit."""
        for iid, fake in self.world.compute.instances.items():
            if self.seen_state.get(iid) != fake.state:
                self.seen_state[iid] = fake.state
                if fake.state not in UP_STATES:
                    self.pending.append(Delivery("state", (iid, fake.state)))
        signals = self.world.signaller.signals
        for instance_ids, _container in signals[self.signals_answered :]:
            for gang, nodes in self.gangs().items():
                if gang not in self.hung and set(nodes).intersection(instance_ids):
                    self.checkpoint(gang)
        self.signals_answered = len(signals)

    # ---- trainers -------------------------------------------------------------------------------
    def progress(self, gang: tuple[str, int], by: int) -> int:
        job = self.world.store.get(gang[0])
        resumed = max(self.steps.get(gang, 0), job.checkpoint_step or 0)
        self.steps[gang] = resumed + by
        return self.steps[gang]

    def heartbeat(self, gang: tuple[str, int], by: int = 10) -> None:
        self.pending.append(Delivery("heartbeat", (*gang, self.progress(gang, by))))

    def checkpoint(self, gang: tuple[str, int]) -> None:
        self.pending.append(Delivery("checkpoint", (*gang, self.progress(gang, 1))))

    def exit(self, gang: tuple[str, int], code: int, *, nodes: list[str]) -> None:
        """These nodes' containers exit with `code`; each reports it, then powers off, unless it
        crashed and its run document says keep_on_failure: then it stays up (`domain.keep`)."""
        # a hardware ending (121, 122) is never kept: the bootstrap keeps only a workload's own crash
        kept = code not in (0, ExitCode.PREEMPTED, *HARDWARE_CODES) and self._keeps_on_failure(gang[0])
        for iid in nodes:
            self.pending.append(Delivery("exit", (*gang, iid, code)))
            if kept:
                self.kept_up.add(iid)
            else:
                self.shut_down(iid)

    def _gang_of(self, instance_id: str) -> tuple[str, int]:
        request = self.world.compute.instances[instance_id].request
        return (request.job_id, request.attempt)

    def _keeps_on_failure(self, job_id: str) -> bool:
        try:
            spec = self.world.store.get(job_id).spec
        except JobNotFoundError:
            return False
        return spec is not None and spec.keep_on_failure is not None

    def idle_alarm(self, instance_id: str) -> None:
        self.pending.append(Delivery("idle", (instance_id,)))

    # ---- time ---------------------------------------------------------------------------------
    def advance(self, delta: timedelta, *, heartbeats: bool = True) -> None:
        """Let time pass: EC2 reclaims warned instances, live trainers heartbeat, the reconciler runs."""
        end = self.now + delta
        while self.now < end:
            self.world.clock.current = min(end, self.now + RECONCILE_EVERY)
            for iid, due in sorted(self.reclaim_at.items()):
                if due <= self.now:
                    del self.reclaim_at[iid]
                    self.shut_down(iid)
            if self.reports_throttled:
                self.throttled_at = self.now
            if heartbeats:
                for gang in self.gangs():
                    if gang in self.hung:
                        continue
                    beat = Delivery("heartbeat", (*gang, self.progress(gang, 10)))
                    if self.reports_throttled:  # it waits in Lambda's queue, delivered late (or never)
                        self.pending.append(beat)
                    else:
                        self.attempt(lambda b=beat: self._handle(b))
            if self.now - self.last_reconcile >= RECONCILE_EVERY:
                self.reconcile()

    def quiet(self) -> None:
        """The calm after the storm: no faults, capacity back, every event delivered, time past every grace."""
        self.plan.disarm_all()
        self.quiet_since = self.now
        self.reports_throttled = False
        self.refused.clear()
        self.invocation_seconds = None
        for _ in range(10):
            self.deliver_all()
            self.advance(RECONCILE_EVERY)
        self.deliver_all()
        self.reconcile()
        self.deliver_all()
        self.read_stream()

    # ---- what must hold -------------------------------------------------------------------------
    def jobs(self) -> list[Job]:
        store = self.world.store
        return [job for state in JobState for job in store.list_by_state(state, limit=10_000)]

    def violations(self) -> list[str]:
        """What must hold after any step, however the events came and whatever failed."""
        problems: list[str] = []
        jobs = {job.job_id: job for job in self.jobs()}
        for job in jobs.values():
            was = self.terminal.get(job.job_id)
            if was is not None and job.state is not was:
                problems.append(f"{job.job_id} left terminal state {was} for {job.state}")
            if job.state.is_terminal:
                self.terminal.setdefault(job.job_id, job.state)
            # the store bumps the version at every write: a record not written since is not measured again
            size = self.item_sizes.get((job.job_id, job.version))
            if size is None:
                size = self.item_sizes[(job.job_id, job.version)] = item_bytes(job)
            if size > MAX_ITEM_BYTES:
                problems.append(f"{job.job_id}: item of {size} bytes")
        for event in self.world.publisher.events[self.published :]:
            if event.source is not None and event.source.is_terminal:
                problems.append(f"{event.job_id} published {event.source} -> {event.target}")
            # an event id names one transition, whichever handler published it and however often
            said = (event.source, event.target, event.reason, event.at)
            if self.event_ids.setdefault((event.job_id, event.sequence), said) != said:
                problems.append(f"{event.job_id}:{event.sequence} named two transitions")
            # in the job's order: a transition goes out for the first time only after every earlier one
            through = self.published_through.get(event.job_id, 0)
            if event.sequence > through + 1:
                problems.append(f"{event.job_id}:{event.sequence} published before {event.job_id}:{through + 1}")
            self.published_through[event.job_id] = max(through, event.sequence)
        self.published = len(self.world.publisher.events)
        noted = Counter(
            (n["job_id"], n["attempt"]) for kind, n in self.world.publisher.notices if kind == IDLE_DETECTION_OFF
        )
        problems += [
            f"{job_id}: attempt {n} told {c} times that idle detection is off"
            for (job_id, n), c in noted.items()
            if c > 1
        ]
        problems += self.leases_left_held
        problems += _series_problems(jobs)
        problems += self.hangs_judged_wrongly
        problems += self._quota_waits_unexplained(jobs)
        problems += self._undeserved_boot_failures(jobs)
        problems += self._undeserved_config_errors(jobs)
        problems += self._undeserved_market_failures(jobs)
        problems += self._moves_that_went_nowhere(jobs)
        problems += self._spot_while_volatile(jobs)
        problems += self._regroups_in_place(jobs)
        problems += self._overlapping_gangs(jobs)
        problems += self._unaccounted_instances(jobs)
        problems += self._replaced_but_running(jobs)
        problems += self._kept_gangs(jobs)
        problems += self._objects_deleted_early(jobs)
        problems += self._kept_work_that_shrank(jobs)
        problems += self._unhealthy_nodes_counted(jobs)
        problems += self._slow_interconnects_judged(jobs)
        problems += self.moves_broken_early
        problems += self.zone_orders_broken
        problems += self._ledger_and_quotas(jobs)
        return problems

    def _ledger_and_quotas(self, jobs: dict[str, Job]) -> list[str]:
        """The GPU ledger equals what the records stand for; no team holds more of its own GPUs than
        its quota, nor the fleet more than its cap; only borrowed GPUs are ever preempted."""
        problems: list[str] = []
        ledger, expected = self.world.store.ledger(), truth(jobs.values())
        if ledger != expected:
            drift = {k: (ledger.get(k), expected.get(k)) for k in set(ledger.counters) | set(expected.counters)}
            problems.append(
                f"the GPU ledger drifted (ledger, records): { {k: v for k, v in drift.items() if v[0] != v[1]} }"
            )
        for job in jobs.values():
            before = self.admissions.get(job.job_id)
            preempted = bool(job.history) and job.history[-1].reason is Reason.PREEMPTED and job.admission is None
            if preempted and before is not None and not before.borrowed:
                problems.append(f"{job.job_id} was preempted holding none but its own team's GPUs")
            self.admissions[job.job_id] = job.admission
        if self.teams is None:
            return problems
        directory = self.teams.directory
        own: Counter[str] = Counter()
        for job in jobs.values():
            if holds(job) and job.admission is not None and not job.admission.borrowed:
                own[job.team] += gpus_of(job)
        problems += [
            f"team {team} holds {held} GPUs of its own, over its quota of {directory.quota(team).gpus}"
            for team, held in own.items()
            if directory.quota(team).gpus is not None and held > (directory.quota(team).gpus or 0)
        ]
        cap = directory.fleet.max_gpus
        if cap is not None and ledger.gpus > cap:
            problems.append(f"the fleet holds {ledger.gpus} GPUs, over its cap of {cap}")
        return problems

    def _judge_termination(self, instance_ids: Any) -> None:
        """A deadline's move is voluntary: the attempt it leaves is whole and training, so the control
        plane may take it only once a later attempt's gang is up (issue 19, item 6), unless the job
        ended or is being stopped, or the attempt broke meanwhile (a node gone, warned or exited)."""
        for iid in instance_ids:
            request = self.world.compute.instances[iid].request
            job = self.world.store.get(request.job_id)
            attempt = job.attempt(request.attempt)
            if attempt is None or not attempt.moved or job.state.is_terminal or job.stop_request is not None:
                continue
            if attempt.gone or attempt.exit_codes or self.warned.intersection(attempt.instance_ids):
                continue
            if any(later.number > attempt.number and later.instance_ids for later in job.attempts):
                continue
            self.moves_broken_early.append(
                f"{job.job_id}: attempt {attempt.number}, moved for its deadline at {attempt.interrupted_at}, had"
                f" {iid} terminated at {self.now} with no later gang up ({job.state}, {job.status_detail!r})"
            )

    def _kept_work_that_shrank(self, jobs: dict[str, Job]) -> list[str]:
        """What a job's record says its commits and syncs keep (the step it resumes from, the training
        time a `directory` job has to show) only grows: however many attempts the record lets go,
        the work they saved is still the job's, and its deadline is judged on it."""
        problems = []
        for job in jobs.values():
            if job.spec is None:
                continue
            now_kept = (job.checkpoint_step or 0, time_trained(job, running=False))
            before = self.kept_work.get(job.job_id, (0, timedelta(0)))
            if now_kept[0] < before[0] or now_kept[1] < before[1]:
                problems.append(f"{job.job_id}: its kept work shrank from {before} to {now_kept}")
            self.kept_work[job.job_id] = (max(now_kept[0], before[0]), max(now_kept[1], before[1]))
        return problems

    def _unhealthy_nodes_counted(self, jobs: dict[str, Job]) -> list[str]:
        """A node's failed GPU check or hardware fault (exit 122 or 121, however often and late it is
        reported) never counts a crash (an attempt of max_attempts) nor an interruption: a step that
        ended an attempt for it counted no more than the crash and reclaim transitions it also made.
        And it ends its attempt once: one relaunch for an unhealthy node, never two."""
        problems = []
        for job in jobs.values():
            crashes, interruptions, seen = self.counted.get(job.job_id, (0, 0, 0))
            total = job.history_dropped + len(job.history)
            new = job.history[max(0, len(job.history) - (total - seen)) :]
            self.counted[job.job_id] = (job.crashes, job.interruptions, total)
            hardware = [e for e in new if e.reason in HARDWARE_REASONS]
            for e in hardware:
                self.hardware_endings[(job.job_id, e.attempt or 0)] += 1
                if self.hardware_endings[(job.job_id, e.attempt or 0)] > 1:
                    problems.append(f"{job.job_id}: attempt {e.attempt} ended twice for an unhealthy node")
            if not hardware:
                continue
            crash_events = sum(1 for e in new if e.reason in CRASH_REASONS)
            reclaim_events = sum(1 for e in new if e.reason in RECLAIM_REASONS)
            if job.crashes - crashes > crash_events or job.interruptions - interruptions > reclaim_events:
                problems.append(
                    f"{job.job_id}: an unhealthy node counted (crashes {crashes}->{job.crashes}, interruptions"
                    f" {interruptions}->{job.interruptions}) with {[e.reason.value for e in new]}"
                )
        return problems

    @staticmethod
    def _slow_interconnects_judged(jobs: dict[str, Job]) -> list[str]:
        """An attempt ends slow-interconnect only on a node's 123 while its gang, as it stood, had made
        no progress (no heartbeat and no commit or sync since it formed): a 123 after that is the
        workload's own exit, judged a crash, and never a configuration error. Its pool is never
        scored down for it, and the job fails slow-interconnect only after `UNHEALTHY_LIMIT` attempts
        in a row ended by their hosts."""
        problems = []
        for job in jobs.values():
            scored = {r.key for r in reclaims_of(job)}
            for a in job.attempts:
                if not a.is_over or ExitCode.SLOW_INTERCONNECT not in a.exit_codes.values():
                    continue
                formed = a.regroup.launched_at if a.regroup and a.regroup.launched_at else a.started_at
                # What the control plane knew when it judged: a heartbeat is never recorded on an ended
                # attempt, but a commit is (the checkpoint is real), so one recorded at or after the end
                # may have come in late, behind the 123 it preceded: no evidence against the verdict.
                ended = a.ended_at or formed
                heard = a.last_heartbeat_at is not None and a.last_heartbeat_at >= formed
                committed = a.checkpoint_at is not None and formed <= a.checkpoint_at < ended
                trained = heard or committed
                if a.end_reason == Verdict.SLOW_INTERCONNECT.value and trained:
                    problems.append(f"{job.job_id}: attempt {a.number}'s 123 after progress ended it slow-interconnect")
                if a.end_reason == Verdict.MISCONFIGURED.value and set(a.exit_codes.values()) <= {0, 123}:
                    problems.append(f"{job.job_id}: attempt {a.number}'s 123 was taken for a configuration error")
                if a.end_reason == Verdict.SLOW_INTERCONNECT.value and f"{job.job_id}#{a.number}unhealthy" in scored:
                    problems.append(f"{job.job_id}: attempt {a.number}'s slow interconnect scored its pool down")
            last = job.history[-1] if job.history else None
            failed_for_it = (
                job.state is JobState.FAILED and last is not None and last.reason is Reason.SLOW_INTERCONNECT
            )
            if failed_for_it and unhealthy_in_a_row(job) < UNHEALTHY_LIMIT:
                problems.append(f"{job.job_id} failed slow-interconnect after {unhealthy_in_a_row(job)} in a row")
        return problems

    def _objects_deleted_early(self, jobs: dict[str, Job]) -> list[str]:
        """A job's objects go only `OBJECT_RETENTION` after it ended, never while it is active, and a
        job noted as swept has nothing left under its prefix."""
        problems = []
        stored = self.world.blobs.objects
        for job_id, key in self.objects.items():
            job = jobs[job_id]
            end = retention.ended_at(job)
            if key not in stored and (end is None or self.now - end < OBJECT_RETENTION):
                problems.append(f"{job_id}: its objects were deleted while {job.state} (ended {end})")
            if job.objects_deleted_at is not None and any(k.startswith(job_prefix(job_id)) for k in stored):
                problems.append(f"{job_id}: noted as swept at {job.objects_deleted_at} with objects left")
        return problems

    @staticmethod
    def _quota_waits_unexplained(jobs: dict[str, Job]) -> list[str]:
        """A job a vCPU quota keeps waiting says which quota and how to raise it (every type here has one)."""
        return [
            f"{job.job_id} waits quota-exceeded without naming the quota: {job.status_detail!r}"
            for job in jobs.values()
            if job.state is JobState.QUEUED
            and job.history
            and job.history[-1].reason is Reason.QUOTA_EXCEEDED
            and not ("vCPU quota refused" in job.status_detail and "--quota-code L-" in job.status_detail)
        ]

    def _undeserved_config_errors(self, jobs: dict[str, Job]) -> list[str]:
        """FAILED config-error only for a job whose configuration error's exit was heard and of which
        no progress (a heartbeat or a checkpoint, in any attempt) had been heard: once a job trained,
        a configuration error's code is a crash, retried."""
        problems = []
        for job in jobs.values():
            if job.state is not JobState.FAILED or job.history[-1].reason is not Reason.CONFIG_ERROR:
                continue
            if job.job_id not in self.config_exits_heard:
                problems.append(f"{job.job_id} failed config-error, but no such exit was reported")
            if job.job_id in self.progress_heard:
                problems.append(f"{job.job_id} failed config-error after it had made progress")
        return problems

    @staticmethod
    def _undeserved_market_failures(jobs: dict[str, Job]) -> list[str]:
        """FAILED for want of a market only for a spot job past `max_interruptions`: a budget's
        spot-only policy makes an on-demand or past-its-limit spot-first job wait, never fail."""
        problems = []
        for job in jobs.values():
            if job.state is not JobState.FAILED or job.spec is None:
                continue
            last, spec = job.history[-1], job.require_spec()
            if last.reason is Reason.LAUNCH_FAILED and "no market" in last.detail:
                problems.append(f"{job.job_id} ({spec.capacity}) failed launch-failed with no market: {last.detail!r}")
            if last.reason is Reason.INTERRUPTED_TOO_OFTEN and not (
                spec.capacity is Capacity.SPOT and job.interruptions > spec.max_interruptions
            ):
                problems.append(
                    f"{job.job_id} ({spec.capacity}) failed interrupted-too-often after {job.interruptions}"
                    f" of max_interruptions {spec.max_interruptions}"
                )
        return problems

    def _moves_that_went_nowhere(self, jobs: dict[str, Job]) -> list[str]:
        """A move replaces its attempt on the other market, never on the one it left: a deadline's
        either way, a move back to spot (`volatility.back_to_spot`) on spot (a move the budget or the
        spec would undo is not made: issue 19, item 6)."""
        problems = []
        reasons = (Reason.DEADLINE_MARKET, Reason.BACK_TO_SPOT)
        for job in jobs.values():
            moved = {  # by number: a reclaim and a move can share one instant of the fake clock
                e.attempt: e.reason for e in job.history if e.reason in reasons and e.target is JobState.INTERRUPTED
            }
            for old, new in zip(job.attempts, job.attempts[1:], strict=False):
                if old.number not in moved or not new.instance_ids or old.market is not new.market:
                    continue
                if not old.moved or old.interrupted_at is None:
                    continue  # its moves found no room: it trained on, and what came after is no move
                lost = [self.gone_on_its_own.get(i) for i in old.instance_ids]
                if any(t is not None and t <= self._launched_after(job.job_id, old.number) for t in lost):
                    continue  # (a node of) it went on its own (an exit, a fault) before its replacement was up
                if any(old.interrupted_at <= t <= new.started_at for t in self.budget_alerts_at):
                    continue  # a policy tightened in between: the replacement follows it
                if new.market in FALLBACKS.get(self.deadline_markets.get((job.job_id, new.number)), ()):
                    continue  # its walk began after the move's slack was gone: the deadline now allows it
                problems.append(
                    f"{job.job_id}: attempt {old.number} moved ({moved[old.number]}), and attempt {new.number}"
                    f" launched on the same market ({new.market})"
                )
        return problems

    def _spot_while_volatile(self, jobs: dict[str, Job]) -> list[str]:
        """A `spot-first` job without a deadline that spot reclaimed `VOLATILE_COUNT` times within
        `VOLATILE_WINDOW` launches its next attempt on on-demand, spot only when on-demand was refused
        (its tries show it) or a budget alert may have narrowed it to spot (issue 21)."""
        problems = []
        for job in jobs.values():
            spec = job.spec
            if spec is None or spec.capacity is not Capacity.SPOT_FIRST or spec.deadline is not None:
                continue
            for i, attempt in enumerate(job.attempts):
                if attempt.market is not Market.SPOT or not attempt.instance_ids or i == 0:
                    continue
                reclaims = [  # what the launch saw: the history's reclaims of the attempts before it
                    e.at
                    for e in job.history
                    if is_spot_reclaim(e) and e.attempt is not None and e.attempt < attempt.number
                ]
                # judged when its instances were launched (the market is chosen then), not when the attempt
                # began: a launch held for hours (a budget hold, refused capacity) may find spot calm again
                launched = next(
                    (
                        e.at
                        for e in job.history
                        if e.attempt == attempt.number and e.reason is Reason.INSTANCES_LAUNCHED
                    ),
                    attempt.started_at,
                )
                recent = [t for t in reclaims if launched - t <= VOLATILE_WINDOW]
                if len(recent) < VOLATILE_COUNT or any(t <= launched for t in self.budget_alerts_at):
                    continue
                if attempt.tries_dropped or any(t.market is Market.ON_DEMAND for t in attempt.tries):
                    continue
                problems.append(
                    f"{job.job_id}: attempt {attempt.number} launched on spot after {len(recent)} reclaims within"
                    f" {VOLATILE_WINDOW}, without trying on-demand first"
                )
            for i, regrouped in enumerate(job.history):
                if regrouped.reason is not Reason.NODE_RECLAIMED:
                    continue
                # a regroup replaces the node on spot, in its pool: never once spot is volatile for the job
                # (the reclaims up to this one, itself included, in the history's order)
                recent = [e.at for e in job.history[: i + 1] if is_spot_reclaim(e)]
                recent = [t for t in recent if regrouped.at - t <= VOLATILE_WINDOW]
                if len(recent) >= VOLATILE_COUNT:
                    problems.append(
                        f"{job.job_id}: a node reclaimed at {regrouped.at} was replaced in place on spot, the"
                        f" job's reclaim {len(recent)} within {VOLATILE_WINDOW}"
                    )
        return problems

    def _regroups_in_place(self, jobs: dict[str, Job]) -> list[str]:
        """A regroup (issue 21) keeps its gang whole and in place: an attempt never holds more nodes
        than its spec nor the same node twice, a replacement is launched into the attempt's own pool
        and placement group with the next generation's tag, each generation once (one node per lost
        one), and no more nodes of the attempt's current generation are up than the gang has."""
        problems: list[str] = []
        launched: dict[tuple[str, int, int], set[str]] = defaultdict(set)
        for iid, fake in self.world.compute.instances.items():
            request = fake.request
            if request.generation:
                launched[(request.job_id, request.attempt, request.generation)].add(iid)
        for (job_id, number, generation), ids in launched.items():
            job = jobs.get(job_id)
            attempt = job.attempt(number) if job is not None else None
            if job is None or attempt is None:
                continue
            nodes = job.require_spec().nodes
            if len(ids) > nodes - 1:
                problems.append(
                    f"{job_id}: attempt {number} launched {len(ids)} replacements for generation {generation}"
                )
            for iid in ids:
                request = self.world.compute.instances[iid].request
                where = (request.instance_type, request.subnet.subnet_id, request.market, request.placement_group)
                gang = (attempt.instance_type, attempt.subnet_id, attempt.market, placement_group_of(job, attempt))
                if where != gang:
                    problems.append(f"{job_id}: replacement {iid} of attempt {number} went to {where}, not {gang}")
        for job in jobs.values():
            nodes = job.require_spec().nodes if job.spec is not None else 0
            for attempt in job.attempts:
                ids = attempt.instance_ids
                if len(ids) > nodes or len(set(ids)) != len(ids):
                    problems.append(f"{job.job_id}: attempt {attempt.number} holds {list(ids)} for {nodes} node(s)")
                if attempt.is_over or not attempt.generation:
                    continue
                up = [
                    i
                    for i in self.up_instances()
                    if (f := self.world.compute.instances[i]).request.job_id == job.job_id
                    and f.request.attempt == attempt.number
                    and f.instance.generation == attempt.generation
                ]
                if len(up) > nodes:
                    problems.append(f"{job.job_id}: {up} up in generation {attempt.generation} of a {nodes}-node gang")
        return problems

    def _undeserved_boot_failures(self, jobs: dict[str, Job]) -> list[str]:
        """FAILED died-at-boot only after `BOOT_DEATH_LIMIT` attempts in a row that the control plane
        never heard from before they ended, whose instances EC2 took (no trainer exited), soon after launch."""
        problems = []
        for job in jobs.values():
            if job.state is not JobState.FAILED or job.history[-1].reason is not Reason.DIED_AT_BOOT:
                continue
            launched = [a for a in job.attempts if a.instance_ids]
            for attempt in launched[-BOOT_DEATH_LIMIT:]:
                heard = self.heard_at.get((job.job_id, attempt.number))
                if attempt.ended_at is None or (heard is not None and heard <= attempt.ended_at):
                    problems.append(
                        f"{job.job_id} failed died-at-boot, but attempt {attempt.number} had reported at {heard}"
                        f" (record: {attempt.model_dump_json()})"
                    )
                elif attempt.first_gone_at is None or attempt.first_gone_at - attempt.started_at > BOOT_WINDOW:
                    problems.append(f"{job.job_id} failed died-at-boot, but attempt {attempt.number} ran past boot")
            if len(launched) < BOOT_DEATH_LIMIT and job.retired.boot_deaths_in_a_row == 0:
                problems.append(f"{job.job_id} failed died-at-boot after {len(launched)} launched attempt(s)")
        return problems

    def _overlapping_gangs(self, jobs: dict[str, Job]) -> list[str]:
        attempts_up: dict[str, list[int]] = defaultdict(list)
        for job_id, number in self.gangs():
            attempts_up[job_id].append(number)
        problems = []
        for job_id, numbers in attempts_up.items():
            job = jobs.get(job_id)
            for number in sorted(numbers)[:-1]:
                older = job.attempt(number) if job else None
                warned = older.interrupted_at if older else None
                if warned is not None and older is not None and older.moved:  # kept until the next gang was up
                    warned = max(warned, self._launched_after(job_id, number))
                if warned is None or self.now - warned > RECLAIM_WINDOW:
                    problems.append(f"{job_id}: attempts {sorted(numbers)} both have live instances")
        return problems

    def _replaced_but_running(self, jobs: dict[str, Job]) -> list[str]:
        """An instance warned by a warning whose reclaim never came, once the control plane has taken
        it out of the job (it left its gang, or its attempt was interrupted and replaced), goes when the
        warning's window and the grace are over (a node younger than the orphan grace when it left
        its gang, once that grace is over): a drill never leaves the old instance running and paid.
        A deadline's move keeps its attempt until the next gang is up (`_overlapping_gangs` judges it)."""
        problems = []
        for iid, heard in self.unreclaimed.items():
            fake = self.world.compute.instances[iid]
            job = jobs.get(fake.request.job_id)
            attempt = job.attempt(fake.request.attempt) if job else None
            if heard is None or fake.state not in UP_STATES or attempt is None or attempt.moved:
                continue
            if iid not in attempt.left and attempt.interrupted_at is None:
                continue  # still one of its gang's nodes (the warning came before its launch was recorded)
            due = max(heard + RECLAIM_WINDOW, fake.launched_at + ORPHAN_GRACE + 2 * RECONCILE_EVERY)
            if self.now > due:
                problems.append(f"{iid}, warned at {heard} and replaced, still runs at {self.now} ({job.job_id})")
        return problems

    def _launched_after(self, job_id: str, number: int) -> datetime:
        """When the first gang of a later attempt than `number` was launched."""
        return min(
            f.launched_at
            for f in self.world.compute.instances.values()
            if f.request.job_id == job_id and f.request.attempt > number
        )

    def _unaccounted_instances(self, jobs: dict[str, Job]) -> list[str]:
        problems = []
        for iid in self.up_instances():
            fake = self.world.compute.instances[iid]
            if self.now - fake.launched_at <= UNRECORDED_LIMIT:
                continue
            job = jobs.get(fake.request.job_id)
            recorded = job is not None and (iid in job.all_instance_ids or any(iid in a.left for a in job.attempts))
            if job is None or not recorded:
                problems.append(f"{iid} has run unrecorded since {fake.launched_at}")
            elif job.state.is_terminal and self.now - job.updated_at > UNRECORDED_LIMIT:
                if keep.spares(job, fake.request.attempt, now=self.now):
                    continue  # kept for inspection: `_kept_gangs`
                ended = max(job.updated_at, job.kept.ends_at) if job.kept is not None else job.updated_at
                if self.now - ended > UNRECORDED_LIMIT:
                    problems.append(f"{iid} still runs {self.now - ended} after {job.job_id} ended {job.state}")
        return problems

    def _kept_gangs(self, jobs: dict[str, Job]) -> list[str]:
        """A gang is kept for inspection only by a FAILED job whose spec asks for it, for at most its
        `keep_on_failure` (never for a cancelled or succeeded job); a crashed node whose attempt is
        retried, or whose job ended otherwise, is terminated (within the bound every instance has)."""
        problems = []
        for job in jobs.values():
            if job.kept is None:
                continue
            if job.state is not JobState.FAILED:
                problems.append(f"{job.job_id} keeps a gang while {job.state}")
            keep_for = job.require_spec().keeps_on_failure
            if keep_for is None or job.kept.until - job.kept.since != keep_for:
                problems.append(
                    f"{job.job_id} keeps a gang {job.kept.until - job.kept.since}, its spec says {keep_for}"
                )
        for iid in sorted(self.kept_up & set(self.up_instances())):
            request = self.world.compute.instances[iid].request
            job = jobs.get(request.job_id)
            attempt = job.attempt(request.attempt) if job is not None else None
            if job is None or attempt is None or not attempt.is_over or job.state.is_terminal:
                continue  # a crash not yet judged, or an ended job's (`_unaccounted_instances`)
            assert attempt.ended_at is not None
            if self.now - attempt.ended_at > UNRECORDED_LIMIT:
                problems.append(f"{iid}, kept up by its crash, still runs though {job.job_id} retried it")
        return problems

    def unhealthy(self) -> list[str]:
        """After `quiet()`: what is still wrong with an active job, or leaked by an ended one."""
        problems: list[str] = []
        jobs = self.jobs()
        wanted: set[str] = set()
        directory = self.teams.directory if self.teams is not None else TeamDirectory.open()
        budgets = self.world.budgets
        queued = [j for j in jobs if waits(j) and launch_hold(j, budgets.policy_for(j.team), now=self.now) is None]
        holding = [j for j in jobs if holds(j)]
        self.admissible = {job_id for job_id, _ in plan(queued, holding, truth(jobs), directory, self.now).admit}
        problems += [problem for job in jobs if (problem := self._stopped_with_an_old_checkpoint(job))]
        for job in jobs:
            if job.kept is not None and job.kept.lasts(self.now):  # a failed gang kept for inspection
                wanted.update(i for a in job.attempts if a.number == job.kept.attempt for i in a.instance_ids)
            if job.state.is_terminal:
                continue
            problem = self._unhealthy(job)
            if problem:
                problems.append(f"{job.job_id} ({job.state}, {job.status_detail!r}): {problem}")
            if job.state is JobState.RUNNING:
                wanted.update(job.instance_ids)
            # a moved (or reclaimed) attempt's gang is taken once the grace after its move (or
            # warning) is over (`gangs.overdue_survivors`): a move in the quiet period's last
            # minutes leaves it up, wanted until then
            wanted.update(
                i
                for a in job.attempts
                if a.interrupted_at is not None
                and not a.is_over
                and self.now - a.interrupted_at < SPOT_WARNING_WINDOW + RECLAIM_GRACE
                for i in a.instance_ids
            )
        problems += self._unpublished(jobs)
        problems += [f"{iid} leaked (no running job wants it)" for iid in self.up_instances() if iid not in wanted]
        alarms = self.world.alarms.alarms
        problems += [f"idle alarm of {iid} leaked" for iid in sorted(alarms) if iid not in wanted]
        # A group is kept while its attempt runs, or while instances still stand in it (the stopped
        # instances an on-demand policy stop keeps on purpose; any running one is reported above).
        running = {(job.job_id, job.current_attempt.number) for job in jobs if job.state is JobState.RUNNING}
        in_use = {f.request.placement_group for f in self.world.compute.instances.values() if f.state != "terminated"}
        problems += [
            f"placement group {group.name} leaked"
            for group in self.world.compute.placement_groups.values()
            if (group.job_id, group.attempt) not in running and group.name not in in_use
        ]
        return problems

    def _unpublished(self, jobs: list[Job]) -> list[str]:
        """Every state change the record keeps must have been published (at least once), whatever
        handler died after its write and whatever PutEvents failed: the stream hands it over again."""
        published = {(e.job_id, e.source, e.target, e.reason, e.at) for e in self.world.publisher.events}
        return [
            f"{job.job_id}: {entry.source} -> {entry.target} ({entry.reason}) at {entry.at} was never published"
            for job in jobs
            for entry in job.history
            if (job.job_id, entry.source, entry.target, entry.reason.value, entry.at) not in published
        ]

    def _stopped_with_an_old_checkpoint(self, job: Job) -> str | None:
        """A policy stop whose trainer answers checkpoint-now takes its instances only after a commit
        newer than its request, if the quiet left it time for one: its checkpoint-now is sent again
        (a failed SendCommand, a death after the stop's write) until that commit is recorded."""
        request, attempt = job.stop_request, job.current_attempt
        if request is None or request.executed_at is None or attempt is None or self.quiet_since is None:
            return None
        if not job.require_spec().checkpoint.takes_checkpoint_requests or (job.job_id, attempt.number) in self.hung:
            return None
        if self.kept_up & set(attempt.instance_ids):
            return None  # a node's workload crashed and its host was kept up: that gang answers nothing
        if request.deadline <= self.quiet_since + RECONCILE_EVERY:
            return None  # its deadline came before the quiet's first tick could ask again
        before = request.checkpoint_step_at_request
        if job.checkpoint_step is not None and (before is None or job.checkpoint_step > before):
            return None
        return (
            f"{job.job_id}: its {request.reason} stop took the instances at {request.executed_at} with the "
            f"checkpoint from before its request (step {before}), though its trainer answers every checkpoint-now"
        )

    @staticmethod
    def _on_demand_only(job: Job) -> bool:
        """The spec allows on-demand only: an on-demand job (a spot-first one goes to spot under a
        budget's spot-only, however volatile spot has been and whatever its deadline says)."""
        return job.require_spec().capacity is Capacity.ON_DEMAND

    def _unhealthy(self, job: Job) -> str | None:
        policy = self.world.budgets.policy_for(job.team)
        held = policy.mode is BudgetMode.HOLD
        if job.state is JobState.QUEUED:
            if waits(job) and job.job_id not in self.admissible:
                return None  # its team's quota, the fleet's cap or a pause keeps it waiting, as the plan says
            waits_for_budget = held or (policy.mode is BudgetMode.SPOT_ONLY and self._on_demand_only(job))
            return None if waits_for_budget else "still queued with capacity back"
        if job.state is not JobState.RUNNING:
            return "stuck"
        if job.stop_request is not None and self.now >= job.stop_request.deadline + RECONCILE_EVERY:
            return f"its {job.stop_request.reason} stop was never carried out"  # one still under way is fine
        if held:
            return f"still running in a held budget scope ({policy.scope})"
        attempt = job.current_attempt
        spec = job.require_spec()
        if attempt is None or attempt.is_over or len(attempt.instance_ids) != spec.nodes:
            return "running without a whole current attempt"
        up = set(self.up_instances())
        missing = [i for i in attempt.instance_ids if i not in up]
        if missing:
            return f"recorded instances {missing} are gone"
        if spec.checkpoint.takes_checkpoint_requests and attempt.last_heartbeat_at is None:
            launched = launched_at(job, attempt)
            silent = self.now - max(launched, self._reports_throttled_at(self.now) or launched)
            if silent > spec.trainer.first_heartbeat + HANG_DUMP_WAIT + 2 * RECONCILE_EVERY:  # dumped, then killed
                return f"no first heartbeat for {silent}, yet not judged hung"
        if (job.job_id, attempt.number) in self.hung and attempt.last_heartbeat_at is not None and not attempt.regroup:
            since = max(attempt.last_heartbeat_at, self._reports_throttled_at(self.now) or attempt.last_heartbeat_at)
            if self.now - since > spec.trainer.heartbeat_overdue + HANG_DUMP_WAIT + 2 * RECONCILE_EVERY:
                return f"hung since {since}, yet its gang still runs (dumped at {attempt.hang_dump_asked_at})"
        if spec.gpus_per_node > 0:
            lacking = [i for i in attempt.instance_ids if i not in self.world.alarms.alarms]
            if lacking:
                return f"no idle alarm for {lacking}"
            silent = [i for i in attempt.instance_ids if self.world.alarms.datapoints.get(i) is False]
            overdue = self.now - attempt.started_at > GPU_METRIC_GRACE + RECONCILE_EVERY
            if silent and overdue and attempt.idle_detection_off_at is None:
                return f"{silent} fed no GPU metric, yet the job was never told its idle detection is off"
        return None


def loss_at(step: int) -> float:
    """The loss every simulated trainer reports at `step`: a point's metrics must be its own step's."""
    return 1.0 / (1 + step)


def _series_problems(jobs: dict[str, Job]) -> list[str]:
    """A job's progress series stays bounded, in the order it was recorded (one point per step of an
    attempt, each attempt's steps rising), and each point carries the metrics of its own step."""
    problems: list[str] = []
    for job in jobs.values():
        points = job.progress.points
        if len(points) > MAX_PROGRESS_POINTS:
            problems.append(f"{job.job_id}: {len(points)} progress points kept")
        for number in {p.attempt for p in points}:
            steps = [p.step for p in points if p.attempt == number]
            if steps != sorted(set(steps)):
                problems.append(f"{job.job_id}: attempt {number}'s points are at steps {steps}")
        problems += [
            f"{job.job_id}: step {p.step} recorded with the loss of another step"
            for p in points
            if p.metrics != {"loss": loss_at(p.step)}
        ]
        for attempt in job.attempts:
            newest = max((p.step for p in points if p.attempt == attempt.number), default=None)
            if newest is not None and newest != attempt.heartbeat_step:
                problems.append(
                    f"{job.job_id}: attempt {attempt.number} heartbeat at {attempt.heartbeat_step}, series at {newest}"
                )
    return problems
