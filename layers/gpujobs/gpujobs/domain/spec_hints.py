"""What the spec's refusals suggest instead: the answers that turn a rule into a fix.

A refusal that only names the rule sends the user to the docs; these helpers write the line to
paste: the argv list for a `command` written as one shell string, the nearest known instance type
for a typo. Pure string work, kept apart from the model so that `spec` holds the rules alone.

An instance type is a family and a size (`p6-b200` `.` `48xlarge`), and a typo is in one of them, so
the suggestion keeps the two apart: first the family (as typed, then without punctuation,
`p6b200` -> `p6-b200`, then the closest spelling), then that family's size (one the typed size
begins, `24xl` -> `24xlarge`, else the closest, the smaller on a tie). Matching the whole name at
once answered with another family's type (`g9.xlarge` -> `g6.xlarge`) and broke ties by spelling
(`g7.xlarge` -> `g7.8xlarge`, not the smallest `g7.2xlarge`). A family nobody knows gets the list of
the known families, never a type of another.
"""

from __future__ import annotations

import difflib
import json
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence

from gpujobs.domain import documents


def unknown_type(instance_type: str, gpus: Mapping[str, int]) -> str:
    """The refusal of a type the catalog (`gpus`: type -> GPUs) lacks, with the nearest known one."""
    return f"{instance_type} is not an instance type gpujobs knows ({_nearest_type(instance_type, gpus)})"


def _nearest_type(instance_type: str, known: Iterable[str]) -> str:
    sizes: dict[str, list[str]] = {}
    for name in known:
        known_family, _, known_size = name.partition(".")
        sizes.setdefault(known_family, []).append(known_size)
    typed_family, _, typed_size = instance_type.partition(".")  # the spec's pattern: lowercase, one dot
    family = _nearest_family(typed_family, sorted(sizes))
    if family is None:
        return f"nor any {typed_family or '(unnamed)'} type; known families: {', '.join(sorted(sizes))}"
    ordered = sorted(sizes[family], key=_size_order)
    size = typed_size if typed_size in ordered else _nearest_size(typed_size, ordered)
    if size is None:
        return f"{family} comes in {', '.join(ordered)}"
    return f"did you mean {family}.{size}?"


def _bare(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name)


def _nearest_family(typed: str, families: Sequence[str]) -> str | None:
    if typed in families:
        return typed
    bare = [f for f in families if _bare(f) == _bare(typed)]
    if bare:
        return bare[0]
    scored = [(difflib.SequenceMatcher(None, _bare(typed), _bare(f)).ratio(), f) for f in families]
    best = max((score for score, _ in scored), default=0.0)
    return next((f for score, f in scored if score == best), None) if best >= _FAMILY_CUTOFF else None


def _nearest_size(typed: str, ordered: Sequence[str]) -> str | None:
    """Of a family's sizes (smallest first), one `typed` begins, else the closest spelling; ties go to the smaller."""
    begun = [s for s in ordered if typed and s.startswith(typed)]
    candidates = begun or ordered
    scored = [(difflib.SequenceMatcher(None, typed, s).ratio(), s) for s in candidates]
    best = max((score for score, _ in scored), default=0.0)
    if not begun and best < _SIZE_CUTOFF:
        return None
    return next(s for score, s in scored if score == best)


_FAMILY_CUTOFF = 0.75
"""`g4d` -> `g4dn` (0.86), `p4` -> `p4d` (0.8); `g9` -> `g5` (0.5) is no suggestion but a list."""
_SIZE_CUTOFF = 0.6
_SIZE_WORDS = {"nano": 0.05, "micro": 0.1, "small": 0.2, "medium": 0.25, "large": 0.5, "xlarge": 1.0}


def _size_order(size: str) -> tuple[float, str]:
    """`large` < `xlarge` < `2xlarge` < ... < `48xlarge` < `metal` (and anything unknown last)."""
    if size in _SIZE_WORDS:
        return _SIZE_WORDS[size], size
    times = re.fullmatch(r"(\d+)xlarge", size)
    return (float(times.group(1)), size) if times else (float("inf"), size)


_PLAIN_CANDIDATE = re.compile(r"^[A-Za-z0-9_/.~+=@%,-]+$")
"""Characters that never start a YAML indicator inside a flow list; YAML itself judges the rest."""


def argv_form(command: str) -> str:
    """A command line as the YAML list the spec wants: `python train.py --steps 600` ->
    `[python, train.py, --steps, "600"]`. A word is left bare only when YAML reads it back as the
    same string; the rest (`600`, `no`, `3e-4`, `my run`) is quoted."""
    try:
        words = shlex.split(command)
    except ValueError:  # an unbalanced quote: split on blanks, the user fixes the rest
        words = command.split()
    return "[" + ", ".join(word if _reads_back(word) else json.dumps(word) for word in words) + "]"


def _reads_back(word: str) -> bool:
    if "," in word or not _PLAIN_CANDIDATE.match(word):
        return False
    try:
        return documents.load(f"- {word}\n") == [word]
    except documents.DocumentError:
        return False
