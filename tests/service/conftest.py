from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from gpujobs.domain.rundoc import RunDocument, RunDocumentPointer
from gpujobs.service.config import LaunchConfig
from gpujobs.service.repairs import ReconcileReport
from gpujobs_fakes.memory import (
    FakeCompute,
    FixedClock,
    InMemoryBlobStore,
    InMemoryBudgetBook,
    InMemoryIdleAlarms,
    InMemoryJobStore,
    RecordingPublisher,
    RecordingSignaller,
    TablePrices,
)
from gpujobs_fakes.wiring import Services, fake_ports, json_user_data, rewired, wire

ALLOWED = ("g5.xlarge", "g6.xlarge", "p4d.24xlarge", "c7i.large")
CONFIG = LaunchConfig(
    checkpoint_bucket="ckpt-bucket", event_bus_name="gpujobs-jobs", region="us-east-1", allowed_instance_types=ALLOWED
)

__all__ = ["ALLOWED", "World", "dumped_then_killed", "json_user_data", "spec"]


class World:
    """The control plane core wired to in-memory fakes, as a test sees it."""

    def __init__(self, renderer: Callable[[RunDocument | RunDocumentPointer], str | bytes] = json_user_data) -> None:
        self.store = InMemoryJobStore()
        self.clock = FixedClock()
        self.compute = FakeCompute(clock=self.clock)
        self.publisher = RecordingPublisher()
        self.blobs = InMemoryBlobStore()
        self.budgets = InMemoryBudgetBook()
        self.alarms = InMemoryIdleAlarms()
        self.signaller = RecordingSignaller()
        self.prices = TablePrices({("g5.xlarge", "spot"): 0.5, ("g5.xlarge", "on-demand"): 1.0})
        ports = fake_ports(
            store=self.store,
            clock=self.clock,
            compute=self.compute,
            publisher=self.publisher,
            blobs=self.blobs,
            budgets=self.budgets,
            alarms=self.alarms,
            signaller=self.signaller,
            prices=self.prices,
            render_user_data=renderer,
        )
        self._use(wire(ports, CONFIG))

    def _use(self, services: Services) -> None:
        self.services = services
        self.ports = services.ports
        self.service = services.jobs
        self.reactions = services.reactions
        self.reconciler = services.reconciler
        self.reports = services.reports
        self.budget_reactions = services.budgets

    def rewire(self, *, config: LaunchConfig | None = None, **ports: Any) -> World:
        """The same fakes and records, with some ports (or the launch configuration) replaced."""
        self._use(rewired(self.services, config=config, **ports))
        return self

    def submit(self, spec: dict[str, Any], *, message_id: str = "msg-1") -> Any:
        return self.service.handle_message(json.dumps(spec), message_id=message_id)

    def transitions(self, job_id: str) -> list[tuple[str | None, str, str]]:
        return [
            (e.source.value if e.source else None, e.target.value, e.reason)
            for e in self.publisher.events
            if e.job_id == job_id
        ]


@pytest.fixture
def world() -> World:
    return World()


def spec(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "digits",
        "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/train:1",
        "command": ["python", "train.py", "--steps", "600"],
        "instance_types": ["g5.xlarge", "g6.xlarge"],
    }
    base.update(overrides)
    return base


def dumped_then_killed(world: World) -> ReconcileReport:
    """A hung gang is dumped before it is killed (`domain.hangs`): the tick that finds it hung asks
    for its ranks' stacks and terminates nothing; the tick `HANG_DUMP_WAIT` later terminates it.
    That second tick's report."""
    from gpujobs.domain.hangs import HANG_DUMP_WAIT
    from gpujobs.service.repairs import Repair

    terminated_before = set(world.compute.terminated)
    asked = world.reconciler.run()
    assert asked.repairs[Repair.HUNG_ATTEMPTS_DUMPED] >= 1, "the hung gang's stacks were not asked for"
    assert asked.repairs[Repair.HUNG_ATTEMPTS_TERMINATED] == 0, "a hung gang was killed before its dump"
    assert set(world.compute.terminated) == terminated_before
    world.clock.advance(seconds=HANG_DUMP_WAIT.total_seconds())
    return world.reconciler.run()


def stopped_for_cost_after(world: World, job_id: str, *, minutes: int) -> bool:
    """The reconciler leaves the job alone a minute before `minutes` of running and asks it to stop
    for its cost cap (`max-cost`) a minute after; False if the stop came early or not at all."""
    from gpujobs.domain.states import Reason

    world.clock.advance(minutes=minutes - 1)
    world.reconciler.run()
    if world.store.get(job_id).stop_request is not None:
        return False
    world.clock.advance(minutes=2)
    world.reconciler.run()
    request = world.store.get(job_id).stop_request
    return request is not None and request.reason is Reason.MAX_COST
