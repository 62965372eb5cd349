"""Each handler's cold start loads only the gpujobs modules its path needs.

A handler is imported as Lambda imports it (layer and function folder on `sys.path`, in a fresh
interpreter, with the settings the template gives it), and the `gpujobs.*` modules it loaded are
compared with the list below. Launch-only pieces (the ladder walk, run documents, hardware, the
catalog, job access policies, YAML) load on the first launch or the first YAML document, never at
import; a module that joins a handler's import path must be added here on purpose, where a
reviewer sees the cold start grow (bench/control_plane_bench.py measures what it costs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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
}
_LOADED = """
import json, sys
sys.path.insert(0, {layer!r})
sys.path.insert(0, {function!r})
import app
print(json.dumps(sorted(m for m in sys.modules if m == "gpujobs" or m.startswith("gpujobs."))))
"""

EVERY_HANDLER = {
    "gpujobs",
    "gpujobs.adapters",
    "gpujobs.adapters.budgets",
    "gpujobs.adapters.cloudwatch",
    "gpujobs.adapters.dynamodb",
    "gpujobs.adapters.ec2",
    "gpujobs.adapters.eventbus",
    "gpujobs.adapters.prices",
    "gpujobs.adapters.s3",
    "gpujobs.adapters.secrets",
    "gpujobs.adapters.ssm",
    "gpujobs.adapters.teams",
    "gpujobs.contract",
    "gpujobs.domain",
}


def loaded_by(handler: str) -> set[str]:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            _LOADED.format(layer=str(ROOT / "layers" / "gpujobs"), function=str(ROOT / "functions" / handler)),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **STACK_ENV},
        timeout=120,
        check=True,
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))
