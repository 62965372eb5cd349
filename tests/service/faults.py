"""A fault at any port call: wrap a port object so that one chosen call raises, before or after it ran.

The service layer only ever talks to the cloud through its ports, so wrapping every port object of a
wired world reaches every AWS call the control plane makes, without touching the fakes (which other
tests extend). A fault raised *before* a call is a request AWS refused or that timed out unsent; a
fault raised *after* it is the nastier case of a call that took effect while its caller died: a
Lambda killed right after RunInstances returned, a DynamoDB write that committed but whose response
never came back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class InjectedFaultError(RuntimeError):
    """The one exception a test expects to escape a handler: the Lambda died, its event may come again."""


class When(StrEnum):
    BEFORE = "before"
    """The call never reached AWS."""
    AFTER = "after"
    """The call took effect, then the caller died before it could use the answer."""


@dataclass(frozen=True)
class Fired:
    """A fault that struck: which call, when, and what it was called with."""

    port: str
    method: str
    when: When
    args: tuple[Any, ...]


@dataclass
class FaultPlan:
    """One-shot faults armed per (port, method); each fires at the next such call, wherever it comes from."""

    armed: dict[tuple[str, str], When] = field(default_factory=dict)
    fired: list[Fired] = field(default_factory=list)
    called: set[tuple[str, str]] = field(default_factory=set)
    """Every (port, method) the service has called so far: the calls worth failing."""

    def arm(self, port: str, method: str, when: When) -> None:
        self.armed[(port, method)] = when

    def disarm_all(self) -> None:
        self.armed.clear()

    def strike(self, port: str, method: str, when: When, args: tuple[Any, ...]) -> None:
        self.called.add((port, method))
        if self.armed.get((port, method)) is when:
            del self.armed[(port, method)]
            self.fired.append(Fired(port, method, when, args))
            raise InjectedFaultError(f"{port}.{method} failed ({when.value} the call)")


class FaultyPort:
    """Forwards everything to `target`; its public methods strike the plan before and after the call."""

    def __init__(self, name: str, target: object, plan: FaultPlan) -> None:
        self._name = name
        self._target = target
        self._plan = plan

    @property
    def target(self) -> object:
        return self._target

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._target, attr)
        if attr.startswith("_") or not callable(value):
            return value
        return self._guarded(attr, value)

    def _guarded(self, method: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def guarded(*args: Any, **kwargs: Any) -> Any:
            given = (*args, *kwargs.values())
            self._plan.strike(self._name, method, When.BEFORE, given)
            result = call(*args, **kwargs)
            self._plan.strike(self._name, method, When.AFTER, given)
            return result

        return guarded


def wrap_ports(ports: object, plan: FaultPlan, *, is_port: Callable[[object], bool]) -> dict[str, object]:
    """A FaultyPort around every field of `ports` (the services' one `Ports`) that `is_port` accepts.

    Returns them by field name, to wire in place of the originals (`World.rewire(**wrapped)`), so a
    test can choose which calls to fail without knowing in advance which ports the services have
    (new ports are wrapped as they are added).
    """
    wrapped: dict[str, object] = {}
    for spec in dataclasses.fields(ports):  # type: ignore[arg-type]
        value = getattr(ports, spec.name)
        if isinstance(value, FaultyPort) or not is_port(value):
            continue
        wrapped[spec.name] = FaultyPort(spec.name, value, plan)
    return wrapped
