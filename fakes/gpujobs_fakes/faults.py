"""Faults to inject into the in-memory ports: a chosen call fails the next time(s) it is made."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


class InjectedFaultError(RuntimeError):
    """A port call a test told to fail."""


@dataclass
class Faults:
    """Port calls told to fail: `fail_next("terminate")` makes the next terminate raise."""

    pending: Counter[str] = field(default_factory=Counter)
    errors: dict[str, Exception] = field(default_factory=dict)
    """The error a call raises instead of InjectedFaultError (a ConcurrentUpdateError, say)."""

    def fail_next(self, call: str, *, times: int = 1, error: Exception | None = None) -> None:
        self.pending[call] += times
        if error is not None:
            self.errors[call] = error

    def check(self, call: str) -> None:
        if self.pending[call] > 0:
            self.pending[call] -= 1
            raise self.errors.get(call) or InjectedFaultError(f"injected failure of {call}")
