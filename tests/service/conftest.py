from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from gpujobs.adapters.memory import (
    FakeCompute,
    FixedClock,
    FixedReportKeys,
    InMemoryBlobStore,
    InMemoryBudgetBook,
    InMemoryIdleAlarms,
    InMemoryJobStore,
    RecordingPublisher,
    RecordingSignaller,
    TablePrices,
)
from gpujobs.domain.rundoc import RunDocument, RunDocumentPointer
from gpujobs.service.jobs import JobService, LaunchConfig
from gpujobs.service.reactions import Reactions
from gpujobs.service.reconcile import Reconciler

ALLOWED = ("g5.xlarge", "g6.xlarge", "p4d.24xlarge", "c7i.large")


def json_user_data(doc: RunDocument | RunDocumentPointer) -> str:
    return doc.model_dump_json()


class World:
    """The control plane core wired to in-memory fakes, as a test sees it."""

    def __init__(self, renderer: Callable[[RunDocument | RunDocumentPointer], str | bytes] = json_user_data) -> None:
        self.store = InMemoryJobStore()
        self.compute = FakeCompute()
        self.publisher = RecordingPublisher()
        self.blobs = InMemoryBlobStore()
        self.clock = FixedClock()
        self.compute.clock = self.clock
        self.budgets = InMemoryBudgetBook()
        self.alarms = InMemoryIdleAlarms()
        self.signaller = RecordingSignaller()
        self.service = JobService(
            store=self.store,
            compute=self.compute,
            publisher=self.publisher,
            blobs=self.blobs,
            clock=self.clock,
            config=LaunchConfig(
                checkpoint_bucket="ckpt-bucket",
                event_bus_name="gpujobs-jobs",
                region="us-east-1",
                allowed_instance_types=ALLOWED,
            ),
            render_user_data=renderer,
            budgets=self.budgets,
            alarms=self.alarms,
            report_keys=FixedReportKeys(),
            jitter=lambda: 0.5,
        )

        self.reactions = Reactions(jobs=self.service, signaller=self.signaller)
        self.prices = TablePrices({("g5.xlarge", "spot"): 0.5, ("g5.xlarge", "on-demand"): 1.0})
        self.reconciler = Reconciler(reactions=self.reactions, prices=self.prices)

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
