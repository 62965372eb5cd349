"""Untrusted JSON or YAML text into plain data, with every way a document can hurt the reader closed.

Whoever may send to the queue chooses these bytes, and a submission that breaks the parser (rather
than being refused by it) would be retried until it reached the dead-letter queue. So each hazard is
a `DocumentError` with one line the submitter can act on, never an exception of the parser's own:

- nesting: Python's parsers recurse, and past about a thousand levels raise RecursionError; a job
  spec is a few levels deep, so anything beyond `MAX_DEPTH` is refused;
- YAML aliases (`*name`) and merge keys (`<<`): they expand references, so a few hundred bytes can
  become gigabytes ("billion laughs"); a job spec never needs one;
- duplicate keys: JSON and YAML readers keep the last value silently, so what a reviewer sees in the
  file is not what runs;
- values the readers raise on (a 5,000-digit integer exceeds Python's conversion limit).
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 10
"""Levels of mappings and lists a document may have; a job spec has three."""


class DocumentError(Exception):
    """The text is not a document gpujobs will read; the message is one line."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document: dict[str, Any] = {}
    for key, value in pairs:
        if key in document:
            raise DocumentError(f"duplicate key {key[:64]!r}")
        document[key] = value
    return document


def load(text: str) -> object:
    """The data in a JSON (starts with `{` or `[`) or YAML document; DocumentError says why not."""
    try:
        if text.lstrip().startswith(("{", "[")):
            data = json.loads(text, object_pairs_hook=_unique_keys)
        else:
            from gpujobs.domain import yaml_documents  # only the submit path and the CLI read YAML

            try:
                data = yaml_documents.load_yaml(text, max_depth=MAX_DEPTH)
            except yaml_documents.RefusedYamlError as exc:
                raise DocumentError(str(exc)) from None
    except RecursionError:
        raise DocumentError(f"nested more than {MAX_DEPTH} levels deep") from None
    except json.JSONDecodeError as exc:
        raise DocumentError(f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise DocumentError(f"unreadable value: {str(exc)[:120]}") from None
    if _depth(data) > MAX_DEPTH:
        raise DocumentError(f"nested more than {MAX_DEPTH} levels deep")
    return data


def _depth(data: object) -> int:
    """How many levels of mappings and lists `data` has (iteratively: `data` may be deep)."""
    deepest, stack = 0, [(data, 0)]
    while stack:
        value, level = stack.pop()
        if isinstance(value, dict | list):
            level += 1
            if level > MAX_DEPTH:
                return level
            deepest = max(deepest, level)
            stack += [(v, level) for v in (value.values() if isinstance(value, dict) else value)]
    return deepest
