"""IAM's evaluation of identity policies for one request: explicit deny, then allow, else deny.

Implemented as the IAM User Guide's "Policy evaluation logic" and "Condition operators" pages say:
actions are matched case-insensitively with `*`/`?`, resources as ARNs with `*`/`?` (`NotAction`
and `NotResource` invert), and every condition block must hold. A key missing from the request
makes a plain operator false and a negated one (`StringNotEquals`, `ArnNotLike`, ...) true, except
`...IfExists` (missing: true) and `Null`; `ForAllValues` holds on a missing key, `ForAnyValue`
does not. Policy variables (`${aws:PrincipalTag/k}`) are replaced from the session's tags.

Not modelled, on purpose: resource-based policies and SCPs (the stack's bucket policy only denies
plain HTTP, and every SDK call here is HTTPS), permission boundaries (none in the stack), and
`Numeric*`/`Date*` operators (the stack uses none; one appearing fails loudly).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Statement = dict[str, Any]


@dataclass
class Request:
    """One authorization IAM makes for a call: an action on one resource, with its context keys."""

    action: str
    resource: str
    context: dict[str, list[str]] = field(default_factory=dict)
    modelled: set[str] = field(default_factory=set)
    """Condition keys (lower case) this request's model decides, present in `context` or known absent."""

    def key(self, name: str) -> list[str] | None:
        return self.context.get(name.lower())

    def decides(self, name: str) -> bool:
        """Whether this request's model says if `name` is present (a `prefix/*` entry covers its tags)."""
        lowered = name.lower()
        return lowered in self.modelled or any(m.endswith("/*") and lowered.startswith(m[:-1]) for m in self.modelled)


@dataclass
class Verdict:
    allowed: bool
    reason: str


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _wildcard(pattern: str, value: str, *, ignore_case: bool = False) -> bool:
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, re.IGNORECASE | re.DOTALL if ignore_case else re.DOTALL) is not None


_VARIABLE = re.compile(r"\$\{([^}]+)\}")


def _substitute(text: str, variables: Mapping[str, str]) -> str:
    lowered = {k.lower(): v for k, v in variables.items()}

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in ("*", "?", "$"):
            return name
        return lowered.get(name.lower(), "\x00unresolved\x00")  # an unknown variable matches nothing

    return _VARIABLE.sub(replace, text)


class UnmodelledKeyError(Exception):
    """A statement conditions on a key the request's model does not decide."""


def _operator_holds(operator: str, policy_values: list[str], found: list[str] | None) -> bool:
    base = operator
    qualifier = ""
    if ":" in base:
        qualifier, base = base.split(":", 1)
    if_exists = base.endswith("IfExists")
    base = base.removesuffix("IfExists")
    if base == "Null":
        want_absent = str(policy_values[0]).lower() == "true"
        return (found is None or found == []) == want_absent
    negated = "Not" in base
    if found is None or found == []:
        if qualifier == "ForAllValues":
            return True
        if qualifier == "ForAnyValue":
            return False
        return True if if_exists else negated

    def one(value: str) -> bool:
        if base in ("StringEquals", "StringNotEquals"):
            return value in policy_values
        if base in ("StringEqualsIgnoreCase", "StringNotEqualsIgnoreCase"):
            return value.lower() in [p.lower() for p in policy_values]
        if base in ("StringLike", "StringNotLike", "ArnLike", "ArnNotLike", "ArnEquals", "ArnNotEquals"):
            return any(_wildcard(p, value) for p in policy_values)
        if base == "Bool":
            return value.lower() in [p.lower() for p in policy_values]
        raise UnmodelledKeyError(f"condition operator {operator} is not implemented in tests/iam/evaluate.py")

    matched = all(one(v) for v in found) if qualifier == "ForAllValues" else any(one(v) for v in found)
    return not matched if negated and base != "Bool" else matched


def _conditions_hold(statement: Statement, request: Request, variables: Mapping[str, str]) -> bool:
    for operator, block in statement.get("Condition", {}).items():
        for key, values in block.items():
            lowered = key.lower()
            found = request.key(lowered)
            if found is None and not request.decides(lowered) and not _is_variable_key(lowered, variables):
                raise UnmodelledKeyError(
                    f"{statement.get('Sid', '(no Sid)')} conditions on {key}, which the model of {request.action} "
                    "does not decide (add it to tests/iam/requests.py)"
                )
            if found is None and _is_variable_key(lowered, variables):
                found = [variables[k] for k in variables if k.lower() == lowered]
            policy_values = [_substitute(str(v), variables) for v in _as_list(values)]
            if not _operator_holds(operator, policy_values, found):
                return False
    return True


def _is_variable_key(key: str, variables: Mapping[str, str]) -> bool:
    return key in {k.lower() for k in variables}


def _matches(statement: Statement, request: Request, variables: Mapping[str, str]) -> bool:
    if "Action" in statement:
        action_ok = any(_wildcard(a, request.action, ignore_case=True) for a in _as_list(statement["Action"]))
    else:
        action_ok = not any(_wildcard(a, request.action, ignore_case=True) for a in _as_list(statement["NotAction"]))
    if not action_ok:
        return False
    if "Resource" in statement:
        resources = [_substitute(str(r), variables) for r in _as_list(statement["Resource"])]
        resource_ok = any(_wildcard(r, request.resource) for r in resources)
    else:
        resources = [_substitute(str(r), variables) for r in _as_list(statement["NotResource"])]
        resource_ok = not any(_wildcard(r, request.resource) for r in resources)
    return resource_ok and _conditions_hold(statement, request, variables)


def evaluate(statements: Sequence[Statement], request: Request, variables: Mapping[str, str] | None = None) -> Verdict:
    """IAM's answer for `request` under `statements` (one principal's identity policies)."""
    variables = variables or {}
    matching = [s for s in statements if _matches(s, request, variables)]
    denies = [s for s in matching if s.get("Effect") == "Deny"]
    if denies:
        return Verdict(False, f"explicitly denied by {denies[0].get('Sid', '(no Sid)')}")
    allows = [s for s in matching if s.get("Effect") == "Allow"]
    if allows:
        return Verdict(True, f"allowed by {allows[0].get('Sid', '(no Sid)')}")
    near = [s.get("Sid", "(no Sid)") for s in statements if _action_only(s, request)]
    hint = f"; statements for the action: {', '.join(near)}" if near else "; no statement names the action"
    return Verdict(False, f"no statement allows it{hint}")


def _action_only(statement: Statement, request: Request) -> bool:
    return statement.get("Effect") == "Allow" and any(
        _wildcard(a, request.action, ignore_case=True) for a in _as_list(statement.get("Action", []))
    )
