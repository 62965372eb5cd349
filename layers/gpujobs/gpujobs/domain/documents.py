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

import yaml
from yaml.nodes import MappingNode, ScalarNode

MAX_DEPTH = 10
"""Levels of mappings and lists a document may have; a job spec has three."""
MAX_YAML_EVENTS = 8192
"""Scalars, mappings and lists a YAML document may hold; a full spec has about 1,300. YAML is read in
Python, so a document of 100,000 tiny values would take seconds per message; counting the parser's
events (in C where libyaml is present) stops one early."""
MERGE_TAG = "tag:yaml.org,2002:merge"

_BaseLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class DocumentError(Exception):
    """The text is not a document gpujobs will read; the message is one line."""


class _StrictLoader(_BaseLoader):  # type: ignore[valid-type, misc]
    """PyYAML's safe loader refusing duplicate keys and merge keys (`_check_events` refused aliases)."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[tuple[str, str]] = set()
        for key_node, _ in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == MERGE_TAG:
                raise DocumentError(f"YAML merge keys (<<) are not allowed, at line {line}")
            if isinstance(key_node, ScalarNode):
                key = (key_node.tag, key_node.value)
                if key in seen:
                    raise DocumentError(f"duplicate key {key_node.value[:64]!r} at line {line}")
                seen.add(key)
        return super().construct_mapping(node, deep=deep)  # type: ignore[no-any-return]


def _check_events(text: str) -> None:
    """Refuse aliases, nesting past MAX_DEPTH and more than MAX_YAML_EVENTS values, reading the
    parser's events one by one (no recursion, no more work than the limits allow)."""
    depth = 0
    for count, event in enumerate(yaml.parse(text, Loader=_BaseLoader)):
        if count > MAX_YAML_EVENTS:
            raise DocumentError(f"more than {MAX_YAML_EVENTS} values")
        if isinstance(event, yaml.AliasEvent):
            where = f", at line {event.start_mark.line + 1}" if event.start_mark else ""
            raise DocumentError(f"YAML aliases (*{event.anchor}) are not allowed{where}")
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise DocumentError(f"nested more than {MAX_DEPTH} levels deep")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


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
            _check_events(text)
            data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (_StrictLoader is a SafeLoader)
    except RecursionError:
        raise DocumentError(f"nested more than {MAX_DEPTH} levels deep") from None
    except json.JSONDecodeError as exc:
        raise DocumentError(f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except yaml.YAMLError as exc:
        raise DocumentError(f"invalid YAML: {str(exc).splitlines()[0]}") from None
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
