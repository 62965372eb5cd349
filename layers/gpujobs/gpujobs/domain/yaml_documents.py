"""YAML documents, read with every hazard of `domain.documents` closed (aliases, merge keys,
duplicate keys, nesting, size). Imported only when a document is not JSON: of the functions, only
the submit path ever reads YAML, so nothing else pays for loading PyYAML. Refusals are
`RefusedYamlError`, which `domain.documents` turns into its DocumentError.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, ScalarNode

MAX_YAML_EVENTS = 8192
"""Scalars, mappings and lists a YAML document may hold; a full spec has about 1,300. YAML is read in
Python, so a document of 100,000 tiny values would take seconds per message; counting the parser's
events (in C where libyaml is present) stops one early."""
MERGE_TAG = "tag:yaml.org,2002:merge"


class RefusedYamlError(Exception):
    """The text is not a YAML document gpujobs will read (`domain.documents` says so as a DocumentError)."""


_BaseLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _StrictLoader(_BaseLoader):  # type: ignore[valid-type, misc]
    """PyYAML's safe loader refusing duplicate keys and merge keys (`_check_events` refused aliases)."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[tuple[str, str]] = set()
        for key_node, _ in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == MERGE_TAG:
                raise RefusedYamlError(f"YAML merge keys (<<) are not allowed, at line {line}")
            if isinstance(key_node, ScalarNode):
                key = (key_node.tag, key_node.value)
                if key in seen:
                    raise RefusedYamlError(f"duplicate key {key_node.value[:64]!r} at line {line}")
                seen.add(key)
        return super().construct_mapping(node, deep=deep)  # type: ignore[no-any-return]


def _check_events(text: str, max_depth: int) -> None:
    """Refuse aliases, nesting past max_depth and more than MAX_YAML_EVENTS values, reading the
    parser's events one by one (no recursion, no more work than the limits allow)."""
    depth = 0
    for count, event in enumerate(yaml.parse(text, Loader=_BaseLoader)):
        if count > MAX_YAML_EVENTS:
            raise RefusedYamlError(f"more than {MAX_YAML_EVENTS} values")
        if isinstance(event, yaml.AliasEvent):
            where = f", at line {event.start_mark.line + 1}" if event.start_mark else ""
            raise RefusedYamlError(f"YAML aliases (*{event.anchor}) are not allowed{where}")
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > max_depth:
                raise RefusedYamlError(f"nested more than {max_depth} levels deep")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def load_yaml(text: str, *, max_depth: int) -> object:
    """The data in a YAML document; RefusedYamlError says why not."""
    try:
        _check_events(text, max_depth)
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (_StrictLoader is a SafeLoader)
    except yaml.YAMLError as exc:
        raise RefusedYamlError(f"invalid YAML: {str(exc).splitlines()[0]}") from None
