"""Judge recorded calls: each one's requests against its principal's rendered policies.

A job role session is judged twice, as IAM does: by the role's policies and by the session
policy the control plane passed to AssumeRole, with the session's tags as `aws:PrincipalTag/*`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from tests.iam.evaluate import Request, UnmodelledKeyError, evaluate
from tests.iam.recorder import Call
from tests.iam.requests import Context, UnmodelledCallError, requests_for
from tests.iam.stack_policies import PRINCIPALS, Resolver, principal_policies, rendered


def _context(binding: Mapping[str, str], parameters: Mapping[str, Any]) -> Context:
    template = rendered()
    resolver = Resolver(template, binding, parameters)
    data = resolver.resolve(template["Resources"]["InstanceLaunchTemplate"]["Properties"]["LaunchTemplateData"])
    return Context(
        launch_template=data,
        stack_template_id=binding.get("LAUNCH_TEMPLATE_ID", ""),
        instance_role_arn=resolver.physical["InstanceRole"]["Arn"],
        ami_parameter=str(resolver.refs.get("AmiParameter", "")),
    )


def judged(call: Call, parameters: Mapping[str, Any] | None = None) -> list[tuple[Request, bool, str]]:
    """Each request of `call` with IAM's answer and why."""
    parameters = parameters or {}
    binding = {"REGION": call.region, **call.binding}
    statements = principal_policies(str(call.principal), binding, parameters)
    variables = {f"aws:PrincipalTag/{k}": v for k, v in call.session.get("tags", {}).items()}
    requests = requests_for(call, _context(binding, parameters))
    results = []
    for request in requests:
        verdict = evaluate(statements, request, variables)
        allowed, reason = verdict.allowed, verdict.reason
        session_policy = call.session.get("policy")
        if allowed and session_policy is not None:
            by_session = evaluate(_as_list(session_policy.get("Statement", [])), request, variables)
            if not by_session.allowed:
                allowed, reason = False, f"the session policy refuses it: {by_session.reason}"
        results.append((request, allowed, reason))
    return results


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def refusals(calls: Iterable[Call], parameters: Mapping[str, Any] | None = None) -> list[str]:
    """One line per request IAM would refuse (or that cannot be judged), deduplicated."""
    lines: dict[str, None] = {}
    for call in calls:
        if call.principal not in PRINCIPALS:
            continue
        where = f"{call.test or '(no test)'}: {call.principal} {call.service}:{call.operation}"
        try:
            for request, allowed, reason in judged(call, parameters):
                if not allowed:
                    lines[f"{where}: {request.action} on {request.resource}: {reason}"] = None
        except (UnmodelledCallError, UnmodelledKeyError, KeyError) as exc:
            lines[f"{where}: cannot be judged: {exc}"] = None
    return list(lines)


def summary(calls: list[Call], refused: list[str]) -> str:
    ours = [c for c in calls if c.principal in PRINCIPALS]
    per = Counter(str(c.principal) for c in ours)
    each = ", ".join(f"{p} {n}" for p, n in sorted(per.items()))
    return f"{len(ours)} calls of the stack's principals ({each}); {len(refused)} refused"
