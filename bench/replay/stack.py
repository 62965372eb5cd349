"""The control plane as a deployed stack wires it, on the in-memory fakes: what the `gpujobs` row runs.

`runtime/bootstrap.py` wires the same services to boto3 clients for the Lambda handlers; here
`gpujobs_fakes.wiring` wires them over the fakes of `gpujobs_fakes.memory`: the clock is injected and nothing sleeps (a
lost race's backoff included). EC2 is the `FakeCompute` with one subnet per trace file; whoever
builds the stack says, through `refuse`, when a launch finds no room.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpujobs.service.config import LaunchConfig
from gpujobs.service.jobs import JobService
from gpujobs.service.ports import Backoff, LaunchRequest, Subnet
from gpujobs.service.reactions import Reactions
from gpujobs.service.reconcile import Reconciler
from gpujobs.service.reports import Reports
from gpujobs_fakes.memory import (
    FakeCompute,
    FixedClock,
    InMemoryBlobStore,
    InMemoryJobStore,
    RecordingPublisher,
    RecordingSignaller,
    TablePrices,
)
from gpujobs_fakes.wiring import fake_ports, wire

from .model import Params

BUCKET = "goodput-bench"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/train:goodput"


def spec_for(params: Params, *, capacity: str = "spot-first") -> dict[str, object]:
    """The job as a user would submit it. `spot-first` (the default) lets the control plane decide:
    spot while it holds, on-demand while spot reclaims the job too often (`domain.volatility`) and
    back when it is calm; with a deadline, the deadline's rule decides instead. `spot` waits for
    spot as the anchors do, every interruption up to the spec's limit (100) tolerated."""
    spec: dict[str, object] = {
        "name": "goodput-bench",
        "image": IMAGE,
        "command": ["python", "train.py"],
        "nodes": params.nodes,
        "gpus_per_node": params.gpus_per_node,
        "instance_types": [params.instance_type],
        "capacity": capacity,
        "max_runtime_minutes": 43200,
        "checkpoint_every_minutes": params.checkpoint_every_minutes,
        "idle": {"action": "ignore"},
    }
    if capacity == "spot":
        spec["max_interruptions"] = 100
    if params.deadline_hours is not None:
        spec["deadline"] = {
            "hours": params.deadline_hours,
            "expected_hours": params.hours_of_work,
            "total_steps": math.ceil(params.work_s / params.step_s),
        }
    return spec


@dataclass(frozen=True)
class Stack:
    """The services the Lambda handlers call, and the fakes behind them that the replay plays."""

    clock: FixedClock
    compute: FakeCompute
    store: InMemoryJobStore
    publisher: RecordingPublisher
    signaller: RecordingSignaller
    service: JobService
    reactions: Reactions
    reconciler: Reconciler
    reports: Reports

    @classmethod
    def wire(
        cls,
        params: Params,
        *,
        clock: FixedClock,
        subnets: Sequence[Subnet],
        refuse: Callable[[LaunchRequest], None],
        seed: int = 0,
    ) -> Stack:
        compute = FakeCompute(subnet_list=list(subnets), clock=clock, on_run=refuse)
        store, publisher, signaller = InMemoryJobStore(), RecordingPublisher(), RecordingSignaller()
        rng = random.Random(seed)
        ports = fake_ports(
            store=store,
            compute=compute,
            publisher=publisher,
            blobs=InMemoryBlobStore(bucket=BUCKET),
            clock=clock,
            signaller=signaller,
            prices=TablePrices(
                {
                    (params.instance_type, "spot"): params.spot_usd_per_hour,
                    (params.instance_type, "on-demand"): params.on_demand_usd_per_hour,
                }
            ),
            jitter=rng.random,
            backoff=Backoff(sleep=lambda _seconds: None, jitter=rng.random),
        )
        config = LaunchConfig(
            checkpoint_bucket=BUCKET,
            event_bus_name="goodput-bench",
            region="us-east-1",
            allowed_instance_types=(params.instance_type,),
        )
        services = wire(ports, config)
        return cls(
            clock=clock,
            compute=compute,
            store=store,
            publisher=publisher,
            signaller=signaller,
            service=services.jobs,
            reactions=services.reactions,
            reconciler=services.reconciler,
            reports=services.reports,
        )
