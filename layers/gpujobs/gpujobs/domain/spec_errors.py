"""A spec's problems as a submitter reads them: one line each, naming the field, printable, bounded.

Whoever may send to the queue writes the documents these lines quote, so every line is printable
(control characters spelled out) and there are at most `MAX_PROBLEMS` of at most `MAX_PROBLEM_CHARS`.

"Control character" is wider than C0/C1: Unicode's format characters (category Cf: the bidi
overrides U+202E and isolates U+2066-2069, zero-width U+200B) reorder or hide what a terminal
shows, so a job named `report\\u202egnp.exe` would read as another. `printable` spells out every
character Python does not call printable (`str.isprintable`: categories Cc, Cf, Cs, Co, Cn, Zl, Zp
and the separators other than the space), as `repr` would.
"""

from __future__ import annotations

MAX_PROBLEMS = 20
"""Problems listed for one spec; the rest are counted ("and N more")."""
MAX_PROBLEM_CHARS = 300


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
    """`text` with every control and format character (tab and newline too) spelled out, as
    `\\xNN`, `\\uNNNN` or `\\UNNNNNNNN`: safe to show on one line of a terminal, whoever wrote it."""
    if text.isprintable():  # the common case, at C speed
        return text
    return "".join(c if c.isprintable() else _spelled(c) for c in text)


def _spelled(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _one_line(problem: str) -> str:
    """`problem` printable (it names fields the submitter chose), cut short."""
    shown = printable(problem)
    return shown if len(shown) <= MAX_PROBLEM_CHARS else shown[: MAX_PROBLEM_CHARS - 3] + "..."
