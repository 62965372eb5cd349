"""What a script reports of its training (``run.log(loss=...)``, ``step_done(metrics=...)``), as
rank 0's heartbeats carry it to the control plane.

The control plane keeps the newest metrics and a bounded series of them on the job's record, one
DynamoDB item; so a heartbeat carries a small number (`MAX_METRICS`) of finite floats under short
names, each to 6 significant digits. A value that does not fit (a NaN loss, a string, a name too
long, a ninth name) is dropped with one warning per name and reason, never raised into training:
reporting is advisory. The limits are the control plane's (`gpujobs.contract`), copied here
because the training image imports nothing from gpujobs; a test compares the copies.
"""

from __future__ import annotations

import logging
import math
import numbers
import re
from collections.abc import Mapping

log = logging.getLogger("gpujobs_trainer")

MAX_METRICS = 8
METRIC_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_./-]{0,31}$"
_NAME = re.compile(METRIC_NAME_PATTERN)


class LatestMetrics:
    """The newest value of each reported metric (at most `MAX_METRICS` names, the first ones given).

    A tensor is kept as given (detached) and read only when a heartbeat is sent: logging every step
    costs no device sync, only each heartbeat does."""

    def __init__(self) -> None:
        self._values: dict[str, object] = {}
        self._warned: set[tuple[str, str]] = set()

    def update(self, values: Mapping[str, object]) -> None:
        for name, value in values.items():
            if not isinstance(name, str) or not _NAME.match(name):
                self._warn(
                    str(name), f"a name is a letter or _ then up to 31 of [A-Za-z0-9_./-] ({METRIC_NAME_PATTERN})"
                )
            elif name not in self._values and len(self._values) >= MAX_METRICS:
                self._warn(name, f"only {MAX_METRICS} metrics are reported (kept: {', '.join(self._values)})")
            else:
                detach = getattr(value, "detach", None)
                self._values[name] = detach() if callable(detach) else value

    def snapshot(self) -> dict[str, float]:
        """The finite values, as floats; a value that is not one is dropped (and warned of once)."""
        numbers: dict[str, float] = {}
        for name, value in self._values.items():
            problem, number = _check(value)
            if problem:
                self._warn(name, problem)
            else:
                numbers[name] = number
        return numbers

    def _warn(self, name: str, problem: str) -> None:
        if (name, problem) not in self._warned:
            self._warned.add((name, problem))
            log.warning("metric %r dropped: %s", name[:64], problem)


def _check(value: object) -> tuple[str, float]:
    """('', the value as reported) or (why it is dropped, 0.0)."""
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:  # a 0-d tensor or numpy scalar
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return f"not a number ({type(value).__name__})", 0.0
    number = float(value)
    if not math.isfinite(number):
        return f"not finite ({number})", 0.0
    return "", float(f"{number:.6g}")
