"""Each handler's cold start loads only the gpujobs modules its path needs.

A handler is imported as Lambda imports it (layer and function folder on `sys.path`, in a fresh
interpreter, with the settings the template gives it), and the `gpujobs.*` modules it loaded are
compared with the list below. Launch-only pieces (the ladder walk, run documents, hardware, the
catalog, job access policies, YAML) load on the first launch or the first YAML document, never at
import; a module that joins a handler's import path must be added here on purpose, where a
reviewer sees the cold start grow (bench/control_plane_bench.py measures what it costs). A few
other packages' costly modules (the X-Ray SDK, asyncio, Powertools' batch utility and data classes)
stay off every import path, with X-Ray SDK tracing on or off.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STACK_ENV = {
    "JOBS_TABLE": "t",
    "EVENT_BUS_NAME": "b",
    "GPUJOBS_STACK_NAME": "s",
    "CHECKPOINT_BUCKET": "c",
    "LAUNCH_TEMPLATE_ID": "lt-0123456789abcdef0",
    "SECURITY_GROUP_ID": "sg-0123456789abcdef0",
    "SUBNET_IDS": "subnet-a",
    "ALLOWED_INSTANCE_TYPES": "g5.xlarge",
    "CHECKPOINT_DOCUMENT": "d",
    "REPORT_SECRET_ARN": "arn:aws:secretsmanager:us-east-1:123456789012:secret:r-AbCdEf",
    "POWERTOOLS_TRACE_DISABLED": "true",
    "AWS_DEFAULT_REGION": "us-east-1",
    "JOB_ROLE_ARN": "arn:aws:iam::123456789012:role/s-JobRole",
    "INSTANCE_ROLE_ARN": "arn:aws:iam::123456789012:role/s-InstanceRole",
}
_LOADED = """
import json, sys
sys.path.insert(0, {layer!r})
sys.path.insert(0, {function!r})
import app
watched = {watched!r}
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("gpujobs", "detect_secrets") or m in watched)))
"""

EVERY_HANDLER = {
    "gpujobs",
    "gpujobs.contract",
    # the ports' adapters, wired whole by runtime.bootstrap (their boto3 clients are made on first use)
    "gpujobs.adapters",
    *(f"gpujobs.adapters.{name}" for name in ("budgets", "catalog", "cloudwatch", "dynamodb", "ec2", "eventbus")),
    "gpujobs.adapters.clock",  # the one UTC clock the adapters and the ports default to (10 lines)
    *(f"gpujobs.adapters.{name}" for name in ("prices", "s3", "secrets", "ssm", "teams")),
    # the job record and spec every path reads, and the decisions every write path takes
    "gpujobs.domain",
    *(f"gpujobs.domain.{name}" for name in ("budget", "cost", "credentials", "decisions", "documents", "effects")),
    "gpujobs.domain.env_secrets",  # its rules; detect-secrets itself is NOT_AT_IMPORT
    *(f"gpujobs.domain.{name}" for name in ("fate", "hardware", "job", "job_metrics", "launching", "report_auth")),
    *(f"gpujobs.domain.{name}" for name in ("reports", "spec", "spec_errors", "spec_hints", "states")),
    "gpujobs.domain.trainer_settings",
    "gpujobs.domain.job_ids",  # the deterministic job id (out of `job`, which holds the record)
    "gpujobs.domain.records",  # how the store reads and writes a record of any neighbouring release
    "gpujobs.domain.retention",  # the store writes the sparse ByEnd key of an ended job (pure, 50 lines)
    "gpujobs.domain.stored",
    # parts of the record and the spec split out of `job` and `spec` (the module size limit), and of
    # the store: its typed errors and DynamoDB's item size arithmetic
    "gpujobs.domain.values",
    "gpujobs.domain.attempts",
    "gpujobs.domain.progress",  # the record's bounded series of training metrics (pure, ~50 lines)
    "gpujobs.domain.keep",  # a failed gang kept up for inspection: the record's `kept` (pure, ~60 lines)
    "gpujobs.domain.spec_parts",
    "gpujobs.service.store_errors",
    "gpujobs.adapters.item_size",
    "gpujobs.domain.ledger",  # every write of the store adds its change to the GPU ledger (pure, ~150 lines)
    "gpujobs.runtime",
    "gpujobs.runtime.bootstrap",
    "gpujobs.runtime.observability",
    "gpujobs.runtime.settings",
    "gpujobs.service",
    "gpujobs.service.changes",
    "gpujobs.service.config",
    "gpujobs.service.jobs",
    "gpujobs.service.ports",
    "gpujobs.service.offerings",  # the offerings port and its default, a field of `Ports` (30 lines)
    "gpujobs.service.pool_evidence",  # the spot-evidence port and its default, a field of `Ports` (35 lines)
}
EVENTS = {"gpujobs.adapters.inbound"}
"""What the EventBridge handlers parse their envelopes (and EC2's events) with; each handler adds
only the models of its own events."""
ALLOWED = {
    # the session policy it renders is the launcher's (domain.job_access): this function's only path
    "credentials": EVERY_HANDLER
    | {"gpujobs.adapters.inbound_sessions", "gpujobs.domain.job_sessions", "gpujobs.domain.job_access"}
    | {"gpujobs.service.job_sessions"},
    "budget": EVERY_HANDLER | EVENTS | {"gpujobs.adapters.inbound_anomaly", "gpujobs.domain.cost_anomaly"},
    "idle": EVERY_HANDLER | EVENTS | {"gpujobs.adapters.inbound_alarms", "gpujobs.service.reactions"},
    "instance_state": EVERY_HANDLER | EVENTS,
    # the stream's records, read as the store reads items, and the outbox that publishes them
    "publisher": EVERY_HANDLER | {"gpujobs.adapters.job_stream", "gpujobs.service.outbox"},
    "reconciler": EVERY_HANDLER,
    "reports": EVERY_HANDLER | EVENTS | {"gpujobs.adapters.inbound_reports", "gpujobs.service.reactions"},
    "spot": EVERY_HANDLER | EVENTS,
    "submit": EVERY_HANDLER | {"gpujobs.runtime.sqs_batch"},
}
LAUNCH_ONLY = {
    "gpujobs.domain.admission",  # a waiting job's admission at its launch, and the reconciler's plan
    "gpujobs.service.admitting",
    "gpujobs.service.launcher",
    "gpujobs.domain.ladder",
    "gpujobs.domain.deadline",
    "gpujobs.domain.gangs",
    "gpujobs.domain.rundoc",
    "gpujobs.domain.job_access",
    "gpujobs.instance.userdata",
}
"""The ladder walk and what only it needs: loaded on a function's first launch."""
NOT_AT_IMPORT = {
    "gpujobs.domain.yaml_documents",
    "gpujobs.service.reconcile",
    "gpujobs.service.sweeps",
    "gpujobs.service.budgeting",
    "gpujobs.service.reports",
    "gpujobs.domain.budget_alerts",
    "gpujobs.domain.hangs",
    "detect_secrets",
    "gpujobs.domain.teams",
    "gpujobs.domain.team_quotas",
}
"""Loaded by the first YAML document (submit only), the first submitted `env` (detect-secrets, about
0.3 s) or the first call of the use case that needs them (the team rules: the first submission or
launch)."""


FOREIGN_NOT_AT_IMPORT = {
    "aws_xray_sdk",  # SDK tracing's: built on the first traced call (runtime.observability)
    "aws_xray_sdk.core",
    "asyncio",  # what the X-Ray SDK's async recorder and Powertools' batch utility import
    "aws_lambda_powertools.utilities.batch",  # submit's loop is runtime.sqs_batch
    "aws_lambda_powertools.utilities.data_classes",  # every event source's classes, in its __init__
    "aws_lambda_powertools.utilities.parser",
    "requests",  # detect-secrets' and the X-Ray SDK's patch_all's
}
"""Other packages' modules that cost a cold start tens of milliseconds each, which no handler
needs at import."""


def loaded_by(handler: str, **settings: str) -> set[str]:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            _LOADED.format(
                layer=str(ROOT / "layers" / "gpujobs"),
                function=str(ROOT / "functions" / handler),
                watched=sorted(FOREIGN_NOT_AT_IMPORT),
            ),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **STACK_ENV, **settings},
        timeout=120,
        check=True,
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_every_handler_is_in_the_list() -> None:
    assert set(ALLOWED) == {p.parent.name for p in (ROOT / "functions").glob("*/app.py")}


@pytest.mark.parametrize("handler", sorted(ALLOWED))
def test_a_handler_imports_only_what_its_path_needs(handler: str) -> None:
    loaded = loaded_by(handler)

    launch_only = loaded & (LAUNCH_ONLY - ALLOWED[handler])
    assert not launch_only, f"{handler} loads launch-only modules at import: {sorted(launch_only)}"
    assert not loaded & NOT_AT_IMPORT, f"{handler} loads at import: {sorted(loaded & NOT_AT_IMPORT)}"
    assert not loaded & FOREIGN_NOT_AT_IMPORT, f"{handler} loads at import: {sorted(loaded & FOREIGN_NOT_AT_IMPORT)}"
    grown = loaded - ALLOWED[handler]
    assert not grown, f"{handler}'s cold start grew by {sorted(grown)}: add them here on purpose, or import them lazily"
    assert "gpujobs_fakes" not in {m.split(".")[0] for m in loaded}


@pytest.mark.parametrize("handler", sorted(ALLOWED))
def test_with_sdk_tracing_on_a_handler_imports_the_x_ray_sdk_on_its_first_call_not_at_import(handler: str) -> None:
    loaded = loaded_by(handler, POWERTOOLS_TRACE_DISABLED="false", LAMBDA_TASK_ROOT=str(ROOT / "functions" / handler))

    assert not loaded & FOREIGN_NOT_AT_IMPORT, f"{handler} loads at import: {sorted(loaded & FOREIGN_NOT_AT_IMPORT)}"
    assert loaded == loaded_by(handler)
