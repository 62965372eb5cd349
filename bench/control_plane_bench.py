"""Control-plane benchmarks: handler cold start and warm per-message cost.

Reported as ratios measured in one run, because these machines are noisy:

* cold start: importing each handler module in a fresh interpreter, divided by the time to `import
  boto3` alone in a fresh interpreter (target: at most 2x), with and without the X-Ray SDK, and the
  import plus the wiring its first invocation does (so that nothing is hidden by moving work from
  the import into the first call; with the X-Ray SDK, that includes the Powertools Tracer the first
  traced call builds, and the SDK's import and patching with it). The layer is imported as `sam
  build` ships it: a copy of the package with its bytecode compiled beside it
  (layers/gpujobs/Makefile; boto3, the baseline, has pip's). `from_source_ratio_to_boto3` is the
  same import compiling the package from source, as every cold start did while the layer shipped no
  bytecode;
* warm cost: our own code's time per message for a 10-message batch through the real submit
  handler (its partial-batch loop included) against the in-memory fakes (target: at most 5 ms).

Run: `python bench/control_plane_bench.py [--repeat N] [--json]`.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import functools
import importlib.util
import json
import os
import py_compile
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LAYER = str(ROOT / "layers" / "gpujobs")
HANDLERS = sorted(p.parent.name for p in (ROOT / "functions").glob("*/app.py"))
STACK_ENV = {
    "JOBS_TABLE": "bench-jobs",
    "EVENT_BUS_NAME": "bench-jobs",
    "GPUJOBS_STACK_NAME": "bench",
    "CHECKPOINT_BUCKET": "bench-checkpoints",
    "LAUNCH_TEMPLATE_ID": "lt-0123456789abcdef0",
    "SECURITY_GROUP_ID": "sg-0123456789abcdef0",
    "SUBNET_IDS": "subnet-a,subnet-b",
    "ALLOWED_INSTANCE_TYPES": "g5.xlarge",
    "CHECKPOINT_DOCUMENT": "bench-checkpoint-now",
    "REPORT_SECRET_ARN": "arn:aws:secretsmanager:us-east-1:123456789012:secret:bench-report-AbCdEf",
}
"""What the template gives every function: each handler checks its settings at import."""
WIRING = {
    "budget": "budget_reactions",
    "idle": "reactions",
    "instance_state": "reactions",
    "reconciler": "reconciler",
    "reports": "reports",
    "spot": "reactions",
    "submit": "job_service",
}
"""The `runtime.bootstrap` factory each handler calls on its first invocation (it builds every port
and service; boto3 clients are made on their first call, so no AWS call happens here)."""

# Lambda puts the layer's python/ folder and the function's folder on sys.path; do the same, so the
# layer is imported as Lambda imports it rather than through the development editable install.
_TIMED_IMPORT = """
import sys, time
sys.path.insert(0, {layer!r})
sys.path.insert(0, {path!r})
t = time.perf_counter()
{statement}
print(time.perf_counter() - t)
"""


def fresh_import_seconds(statement: str, path: str, *, xray_sdk: bool = False, layer: str = LAYER) -> float:
    """One fresh interpreter's time for `statement`, with the environment Lambda gives the function
    (LAMBDA_TASK_ROOT included: the X-Ray SDK's recorder reads it to use Lambda's own sampling
    instead of building a client for the X-Ray daemon's)."""
    env = {
        **os.environ,
        **STACK_ENV,
        "LAMBDA_TASK_ROOT": path,
        "POWERTOOLS_TRACE_DISABLED": "false" if xray_sdk else "true",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    out = subprocess.run(
        [sys.executable, "-c", _TIMED_IMPORT.format(layer=layer, path=path, statement=statement)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=120,
    )
    return float(out.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def shipped_layer() -> Iterator[str]:
    """A copy of the layer's package with unchecked-hash bytecode beside it, as the build makes it."""
    with tempfile.TemporaryDirectory(prefix="gpujobs-layer-") as folder:
        shutil.copytree(Path(LAYER) / "gpujobs", Path(folder) / "gpujobs", ignore=shutil.ignore_patterns("__pycache__"))
        compiled = compileall.compile_dir(
            folder, quiet=1, invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH
        )
        if not compiled:
            raise RuntimeError("the layer's package did not compile")
        yield folder


def cold_start(repeat: int) -> dict[str, Any]:
    """Medians over `repeat` rounds; each round times `import boto3` and then every handler, so the
    baseline and the handlers share the machine's state of that moment."""
    samples: dict[str, list[float]] = {"boto3": []}
    with shipped_layer() as layer:
        for _ in range(repeat):
            samples["boto3"].append(fresh_import_seconds("import boto3", str(ROOT)))
            for name in HANDLERS:
                path = str(ROOT / "functions" / name)
                wired = f"import app\nfrom gpujobs.runtime import bootstrap\nbootstrap.{WIRING[name]}()"
                traced = f"{wired}\nfrom gpujobs.runtime import observability\nobservability.tracer.prepare()"
                for key, statement, xray, source in (
                    (name, "import app", False, layer),
                    (f"{name}+xray", "import app", True, layer),
                    (f"{name}+wired", wired, False, layer),
                    (f"{name}+xray+wired", traced, True, layer),
                    (f"{name}+source", "import app", False, LAYER),
                ):
                    samples.setdefault(key, []).append(
                        fresh_import_seconds(statement, path, xray_sdk=xray, layer=source)
                    )
    median = {key: statistics.median(values) for key, values in samples.items()}
    baseline = median["boto3"]
    rows = {
        name: {
            "seconds": round(median[name], 4),
            "ratio_to_boto3": round(median[name] / baseline, 2),
            "with_xray_sdk_seconds": round(median[f"{name}+xray"], 4),
            "with_xray_sdk_ratio_to_boto3": round(median[f"{name}+xray"] / baseline, 2),
            "import_and_wiring_seconds": round(median[f"{name}+wired"], 4),
            "import_and_wiring_ratio_to_boto3": round(median[f"{name}+wired"] / baseline, 2),
            "with_xray_sdk_import_and_wiring_seconds": round(median[f"{name}+xray+wired"], 4),
            "with_xray_sdk_import_and_wiring_ratio_to_boto3": round(median[f"{name}+xray+wired"] / baseline, 2),
            "from_source_ratio_to_boto3": round(median[f"{name}+source"] / baseline, 2),
        }
        for name in HANDLERS
    }
    return {"import_boto3_seconds": round(baseline, 4), "handlers": rows, "target_ratio": 2.0}


def warm_cost(repeat: int) -> dict[str, Any]:
    os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")
    os.environ.setdefault("POWERTOOLS_METRICS_NAMESPACE", "GpuJobs")
    os.environ.setdefault("POWERTOOLS_SERVICE_NAME", "gpujobs")
    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
    for key, value in STACK_ENV.items():
        os.environ.setdefault(key, value)
    from gpujobs.instance.userdata import render_user_data
    from gpujobs.service.config import LaunchConfig
    from gpujobs_fakes.memory import FakeCompute
    from gpujobs_fakes.wiring import fake_ports, wire

    spec = importlib.util.spec_from_file_location("submit_app", ROOT / "functions" / "submit" / "app.py")
    assert spec is not None
    assert spec.loader is not None
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)

    class Context:
        function_name, memory_limit_in_mb, aws_request_id = "bench", 512, "r"
        invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:bench"

        def get_remaining_time_in_millis(self) -> int:
            return 60_000  # the submit function's timeout: launches walk the ladder within it

    def batch(round_: int) -> dict[str, Any]:
        body = {"name": "bench", "image": "r/i:1", "command": ["python", "train.py"], "instance_types": ["g5.xlarge"]}
        return {
            "Records": [
                {
                    "messageId": f"m-{round_}-{i}",
                    "receiptHandle": "h",
                    "body": json.dumps(body),
                    "attributes": {},
                    "messageAttributes": {},
                    "md5OfBody": "x",
                    "eventSource": "aws:sqs",
                    "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:q",
                    "awsRegion": "us-east-1",
                }
                for i in range(10)
            ]
        }

    compute = FakeCompute()
    ports = fake_ports(
        compute=compute, render_user_data=functools.partial(render_user_data, bucket="b", region="us-east-1")
    )
    service = wire(ports, LaunchConfig(checkpoint_bucket="b", event_bus_name="bus", region="us-east-1")).jobs
    app.job_service = lambda: service
    app.handler(batch(-1), Context())  # warm-up: first-call caches (pydantic, regexes)
    per_message = []
    for round_ in range(repeat):
        event = batch(round_)
        start = time.perf_counter()
        response = app.handler(event, Context())
        per_message.append((time.perf_counter() - start) / 10)
        assert response == {"batchItemFailures": []}, response
    launched = len(compute.live())
    assert launched == 10 * (repeat + 1), launched
    return {
        "ms_per_message_median": round(statistics.median(per_message) * 1000, 3),
        "ms_per_message_p90": round(sorted(per_message)[int(0.9 * (len(per_message) - 1))] * 1000, 3),
        "batches": repeat,
        "target_ms": 5.0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=7, help="fresh interpreters per import and batches timed")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    results = {"cold_start": cold_start(args.repeat), "warm": warm_cost(args.repeat * 5)}
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    cold = results["cold_start"]
    print(f"import boto3 alone: {cold['import_boto3_seconds'] * 1000:.0f} ms (median of {args.repeat})")
    print(
        f"{'handler':<15} {'import ms':>10} {'x boto3':>8} {'+X-Ray SDK ms':>14} {'x boto3':>8}"
        f" {'+wiring ms':>11} {'x boto3':>8} {'+X-Ray +wiring ms':>18} {'x boto3':>8}"
    )
    for name, row in cold["handlers"].items():
        print(
            f"{name:<15} {row['seconds'] * 1000:>10.0f} {row['ratio_to_boto3']:>8.2f}"
            f" {row['with_xray_sdk_seconds'] * 1000:>14.0f} {row['with_xray_sdk_ratio_to_boto3']:>8.2f}"
            f" {row['import_and_wiring_seconds'] * 1000:>11.0f} {row['import_and_wiring_ratio_to_boto3']:>8.2f}"
            f" {row['with_xray_sdk_import_and_wiring_seconds'] * 1000:>18.0f}"
            f" {row['with_xray_sdk_import_and_wiring_ratio_to_boto3']:>8.2f}"
        )
    print(f"target: at most {cold['target_ratio']}x boto3 (default deployment: X-Ray SDK tracing off)")
    warm = results["warm"]
    print(
        f"warm submit: {warm['ms_per_message_median']:.2f} ms/message median, "
        f"{warm['ms_per_message_p90']:.2f} ms p90 over {warm['batches']} batches of 10 (target <= 5 ms)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
