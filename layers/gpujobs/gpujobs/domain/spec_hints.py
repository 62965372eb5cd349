"""What the spec's refusals suggest instead: the answers that turn a rule into a fix.

A refusal that only names the rule sends the user to the docs; these helpers write the line to
paste: the argv list for a `command` written as one shell string, the nearest known instance type
for a typo. Pure string work, kept apart from the model so that `spec` holds the rules alone.
"""

from __future__ import annotations

import difflib
import json
import re
import shlex
from collections.abc import Mapping

from gpujobs.domain import documents


def unknown_type(instance_type: str, gpus: Mapping[str, int]) -> str:
    near = difflib.get_close_matches(instance_type, list(gpus), n=1)
    hint = f"did you mean {near[0]}?" if near else f"known: {', '.join(sorted(gpus))}"
    return f"{instance_type} is not an instance type gpujobs knows ({hint})"


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
