"""The services over the in-memory ports, wired the way `gpujobs.runtime.bootstrap` wires the real ones.

`fake_ports(**overrides)` is every port as a fake (a fixed clock, nothing sleeps), with any of them
replaced; `wire(ports, config)` builds the services a deployed stack runs over whatever ports it is
given. Tests, the benchmarks and the goodput replay all call these two, so the in-memory control
plane is assembled in exactly one place.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from gpujobs.domain.rundoc import RunDocument, RunDocumentPointer
from gpujobs.service.budgeting import BudgetReactions
from gpujobs.service.config import LaunchConfig
from gpujobs.service.jobs import JobService
from gpujobs.service.outbox import Outbox
from gpujobs.service.ports import Ports
from gpujobs.service.reactions import Reactions
from gpujobs.service.reconcile import Reconciler
from gpujobs.service.reports import Reports
from gpujobs_fakes.evidence import FixedPlacementScores, InMemoryPoolEvidence
from gpujobs_fakes.memory import (
    FakeCompute,
    FakeServiceQuotas,
    FixedClock,
    FixedReportKeys,
    InMemoryBlobStore,
    InMemoryBudgetBook,
    InMemoryIdleAlarms,
    InMemoryJobStore,
    InMemoryStream,
    RecordingPublisher,
    RecordingSignaller,
    TablePrices,
)


def json_user_data(doc: RunDocument | RunDocumentPointer) -> str:
    """User data as the document itself: what a fake instance (or a test) reads back."""
    return doc.model_dump_json()


def fake_ports(**overrides: Any) -> Ports:
    """Every port in memory: a fixed clock the compute fake shares and a capacity-wait jitter of one
    half; any port given as a keyword replaces its fake. Lost races back off as deployed (real
    sleeps, which threaded race tests rely on); a simulation at injected time passes its own `backoff`."""
    clock = overrides.get("clock") or FixedClock()
    defaults: dict[str, Any] = {
        "store": InMemoryJobStore(),
        "publisher": RecordingPublisher(),
        "blobs": InMemoryBlobStore(),
        "clock": clock,
        "alarms": InMemoryIdleAlarms(),
        "signaller": RecordingSignaller(),
        "budgets": InMemoryBudgetBook(),
        "report_keys": FixedReportKeys(),
        "prices": TablePrices({("g5.xlarge", "spot"): 0.5, ("g5.xlarge", "on-demand"): 1.0}),
        "render_user_data": json_user_data,
        "jitter": lambda: 0.5,
        "quotas": FakeServiceQuotas(),
        "pool_evidence": InMemoryPoolEvidence(),
        "placement_scores": FixedPlacementScores(),
    }
    if "compute" not in overrides:
        defaults["compute"] = FakeCompute(clock=clock)
    return Ports(**{**defaults, **overrides})


@dataclass(frozen=True)
class Services:
    """What the Lambda handlers call, over one set of ports."""

    ports: Ports
    jobs: JobService
    reactions: Reactions
    reconciler: Reconciler
    reports: Reports
    budgets: BudgetReactions
    outbox: Outbox
    """The Publisher function's use case: the table's stream to state-change events."""


def wire(ports: Ports, config: LaunchConfig, *, stack_name: str = "gpujobs") -> Services:
    """The services over `ports`; an in-memory store's stream is read into their outbox (published
    on each write unless the stream is told otherwise, `gpujobs_fakes.stream`)."""
    jobs = JobService(ports=ports, config=config)
    reactions = Reactions(ports=ports, jobs=jobs)
    outbox = Outbox(ports.publisher)
    stream = getattr(ports.store, "stream", None)
    if isinstance(stream, InMemoryStream):
        stream.outbox = outbox
    return Services(
        ports=ports,
        jobs=jobs,
        reactions=reactions,
        reconciler=Reconciler(ports=ports, jobs=jobs, reactions=reactions),
        reports=Reports(ports=ports, reactions=reactions),
        budgets=BudgetReactions(ports=ports, reactions=reactions, stack_name=stack_name),
        outbox=outbox,
    )


def rewired(services: Services, *, config: LaunchConfig | None = None, **ports: Any) -> Services:
    """The same world with some ports (or the launch configuration) replaced: state kept, services anew."""
    return wire(
        replace(services.ports, **ports), config or services.jobs.config, stack_name=services.budgets.stack_name
    )
