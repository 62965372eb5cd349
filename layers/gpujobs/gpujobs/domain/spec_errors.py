"""A spec's problems as a submitter reads them: one line each, naming the field, printable, bounded.

Whoever may send to the queue writes the documents these lines quote, so every line is printable
(control characters spelled out) and there are at most `MAX_PROBLEMS` of at most `MAX_PROBLEM_CHARS`.
"""

from __future__ import annotations

import re

MAX_PROBLEMS = 20
"""Problems listed for one spec; the rest are counted ("and N more")."""
MAX_PROBLEM_CHARS = 300

_ANY_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class SpecError(Exception):
    """A submission that is not a valid job spec. `problems` are one line each, naming the field."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = bounded(problems)
        super().__init__("; ".join(self.problems))


def bounded(problems: list[str]) -> list[str]:
    """At most MAX_PROBLEMS lines of at most MAX_PROBLEM_CHARS each, then a count of the rest."""
    lines = [_one_line(p) for p in problems[:MAX_PROBLEMS]]
    if len(problems) > MAX_PROBLEMS:
        lines.append(f"(spec): and {len(problems) - MAX_PROBLEMS} more problems")
    return lines


def printable(text: str) -> str:
    """`text` with every control character (tab and newline too) spelled out as `\\xNN`: safe to
    show on one line of a terminal, whoever wrote it."""
    return _ANY_CONTROL.sub(lambda c: f"\\x{ord(c.group()):02x}", text)


def _one_line(problem: str) -> str:
    """`problem` printable (it names fields the submitter chose), cut short."""
    shown = printable(problem)
    return shown if len(shown) <= MAX_PROBLEM_CHARS else shown[: MAX_PROBLEM_CHARS - 3] + "..."
