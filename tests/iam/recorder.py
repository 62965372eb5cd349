"""Record every AWS call made in this process, attributed to the principal that would make it.

botocore gives every session the handlers in `botocore.handlers.BUILTIN_HANDLERS` (moto registers
its own stub the same way), so appending ours there reaches every client created afterwards,
whoever creates it. `before-parameter-build` sees the request's parameters as the caller passed
them, `before-call` sees the credentials that will sign it; `after-call` on STS AssumeRole learns
which access key belongs to which role, so a call signed with a job session counts as the job role's.

Who made a call is read off the Python stack at that moment: a frame in `functions/<name>/app.py`
is that Lambda function (its role), a frame in `gpujobs/instance/` is the instance bootstrap (the
instance role, or the job role when signed with a job session), `gpujobs_trainer` is the training
container (the job role). Anything else (a test's own setup, the CLI) is `None`: not a principal
the stack defines, and not checked.

What the call touched is read where IAM would read it too: the stack's names come from the
environment the code ran with (the Lambda settings), and the tags and settings of the resources a
request names come from moto's own state at the moment of the call (`facts`), before the call
changes them.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import botocore.handlers

ROOT = Path(__file__).resolve().parents[2]
FUNCTIONS = ROOT / "functions"
INSTANCE_CODE = ROOT / "layers" / "gpujobs" / "gpujobs" / "instance"
TRAINER_CODE = ROOT / "training_image" / "gpujobs_trainer"
FUNCTION_FOLDERS = {
    "submit": "SubmitFunction",
    "spot": "SpotFunction",
    "instance_state": "InstanceStateFunction",
    "reports": "ReportsFunction",
    "idle": "IdleFunction",
    "budget": "BudgetFunction",
    "reconciler": "ReconcilerFunction",
    "credentials": "CredentialsFunction",
    "publisher": "PublisherFunction",
}
"""functions/<folder> -> the template's function (checked against CodeUri by the ledger test)."""
BINDING_ENV = (
    "JOBS_TABLE",
    "EVENT_BUS_NAME",
    "CHECKPOINT_BUCKET",
    "JOBS_QUEUE_URL",
    "LAUNCH_TEMPLATE_ID",
    "SECURITY_GROUP_ID",
    "SUBNET_IDS",
    "ALLOWED_INSTANCE_TYPES",
    "GPUJOBS_STACK_NAME",
    "CHECKPOINT_DOCUMENT",
    "REPORT_SECRET_ARN",
    "JOB_ROLE_ARN",
    "JOB_LOG_GROUP",
    "TEAMS_PARAMETER",
)
"""The settings that name the stack's resources: what the rendered policy is bound to."""


@dataclass
class Call:
    principal: str | None
    service: str
    operation: str
    region: str
    params: dict[str, Any]
    binding: dict[str, str]
    facts: dict[str, Any] = field(default_factory=dict)
    test: str = ""
    session: dict[str, Any] = field(default_factory=dict)
    """For a call signed with an assumed role's keys: the role, the session's tags and session policy."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), default=_json_default, sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> Call:
        return cls(**json.loads(line))


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return {"__bytes__": base64.b64encode(bytes(value)[:64]).decode()}
    if isinstance(value, datetime.datetime | datetime.date):
        return value.isoformat()
    if hasattr(value, "read"):
        return "<stream>"
    return repr(value)


class Recorder:
    """Collects calls while active; `calls` holds them in order. One per process (see `install`)."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.test = ""
        self._lock = threading.Lock()
        self._sessions: dict[str, dict[str, Any]] = {}
        self._sinks: list[list[Call]] = []
        self._unattributed = threading.local()
        self.facts: Callable[[str, str, dict[str, Any], str], dict[str, Any]] = lambda *_: {}
        self.binding_facts: Callable[[dict[str, str], str], dict[str, str]] = lambda *_: {}

    # ---- botocore handlers ----------------------------------------------------------------
    def before_parameter_build(self, params: dict[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
        context["gpujobs_ledger_params"] = _plain(params)

    def before_call(
        self, model: Any, params: dict[str, Any], request_signer: Any, context: dict[str, Any], **_: Any
    ) -> None:
        if context.get("gpujobs_ledger_recorded"):  # its specific handler (ANSWERED_BY_HOOKS) ran first
            return
        context["gpujobs_ledger_recorded"] = True
        api_params = context.get("gpujobs_ledger_params", {})
        service = model.service_model.service_name
        region = getattr(request_signer, "_region_name", "") or ""
        key = _access_key(request_signer)
        session = self._sessions.get(key or "", {})
        principal = None if getattr(self._unattributed, "why", None) else self._principal(session.get("role"))
        binding = {k: os.environ[k] for k in BINDING_ENV if os.environ.get(k)}
        facts: dict[str, Any] = {}
        if principal is not None:
            try:
                facts = self.facts(service, model.name, api_params, region)
                binding.update(self.binding_facts(binding, region))
            except Exception as exc:  # a fact moto cannot give is reported by the check, not here
                facts = {"error": f"{type(exc).__name__}: {exc}"}
        call = Call(principal, service, model.name, region, api_params, binding, facts, self.test, session)
        with self._lock:
            self.calls.append(call)
            for sink in self._sinks:
                sink.append(call)

    def after_assume_role(self, parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        params = context.get("gpujobs_ledger_params", {})
        key = parsed.get("Credentials", {}).get("AccessKeyId")
        if params.get("RoleArn") and key:
            session = {
                "role": params["RoleArn"],
                "tags": {t["Key"]: t["Value"] for t in params.get("Tags", [])},
                "policy": json.loads(params["Policy"]) if params.get("Policy") else None,
            }
            with self._lock:
                self._sessions[key] = session

    # ---- attribution -------------------------------------------------------------------------
    def _principal(self, role: str | None) -> str | None:
        if role is not None and role.endswith("-InstanceRole"):  # the session EC2 gives an instance
            return "InstanceRole"
        if role is not None:
            return "JobRole" if role == os.environ.get("JOB_ROLE_ARN") or "JobRole" in role else f"role:{role}"
        frame = sys._getframe(2)
        while frame is not None:
            path = Path(frame.f_code.co_filename)
            if path.name == "app.py" and path.parent.parent == FUNCTIONS:
                return FUNCTION_FOLDERS.get(path.parent.name, f"function:{path.parent.name}")
            if INSTANCE_CODE in path.parents:
                return "InstanceRole"
            if TRAINER_CODE in path.parents:
                return "JobRole"
            frame = frame.f_back  # type: ignore[assignment]
        return None

    @contextmanager
    def unattributed(self, why: str) -> Iterator[None]:
        """Calls made on this thread inside the block belong to no stack principal: a unit test that
        hands instance code a client of its own, where a deployment hands it another principal's
        (`why` says whose, and which test covers that principal's calls)."""
        self._unattributed.why = why
        try:
            yield
        finally:
            self._unattributed.why = None

    @contextmanager
    def collecting(self) -> Iterator[list[Call]]:
        """The calls made inside the block (they are also kept in `calls`)."""
        sink: list[Call] = []
        with self._lock:
            self._sinks.append(sink)
        try:
            yield sink
        finally:
            with self._lock:
                self._sinks.remove(sink)


def _access_key(request_signer: Any) -> str | None:
    credentials = getattr(request_signer, "_credentials", None)
    if credentials is None:
        return None
    try:
        return str(credentials.get_frozen_credentials().access_key)
    except Exception:
        return None


def _plain(value: Any) -> Any:
    """The parameters as JSON-able data (bodies and user data shortened: only their presence matters)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value[:2048] if isinstance(value, str) else value
    return _json_default(value)


RECORDER = Recorder()


ANSWERED_BY_HOOKS = (
    "ec2.CreatePlacementGroup",
    "ec2.DescribePlacementGroups",
    "ec2.DeletePlacementGroup",
    "ec2.RunInstances",
    "ec2.GetSpotPlacementScores",
    "pricing.GetProducts",
)
"""Calls the local cloud answers itself where moto cannot (`gpujobs_local.stack`), with a
`before-call.<service>.<operation>` hook that returns the response. botocore calls the handlers of
the most specific event first and stops at the first response, so the plain `before-call` handler
would never see these calls; one on the same event, registered with the session (before the stack's
hooks), does."""


def install() -> Recorder:
    """Give every botocore session created from now on the recording handlers (idempotent)."""
    handlers = [
        ("before-parameter-build", RECORDER.before_parameter_build),
        ("before-call", RECORDER.before_call),
        *((f"before-call.{operation}", RECORDER.before_call) for operation in ANSWERED_BY_HOOKS),
        ("after-call.sts.AssumeRole", RECORDER.after_assume_role),
    ]
    if handlers[0] not in botocore.handlers.BUILTIN_HANDLERS:
        botocore.handlers.BUILTIN_HANDLERS.extend(handlers)
        from tests.iam.facts import moto_binding_facts, moto_facts

        RECORDER.facts = moto_facts
        RECORDER.binding_facts = moto_binding_facts
    return RECORDER
