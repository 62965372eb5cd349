"""`gpujobs metrics` and `gpujobs tensorboard`: watching a job's training from outside.

`metrics` prints the series the control plane kept on the job's record from its heartbeats (the
metrics the script logged with `run.log` or `step_done(metrics=...)`, the step and the throughput;
the newest `domain.progress.MAX_PROGRESS_POINTS` points). `tensorboard` downloads the event files
the job wrote under `$GPUJOBS_TB_DIR` (uploaded with its outputs, `outputs/<team>/<job-id>/tensorboard/`)
and serves them with a local `tensorboard --logdir` (run as argv, never through a shell) when
TensorBoard is installed; otherwise it says where the files are and how to install it. Keys are
written by the job, so they are downloaded only when safe (`artifacts.safe_target`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpujobs.adapters.dynamodb import DynamoJobStore
from gpujobs.contract import TENSORBOARD_OUTPUTS, outputs_prefix
from gpujobs.domain.job import Job
from gpujobs.domain.spec_errors import printable
from gpujobs.service.ports import JobNotFoundError
from gpujobs_cli.artifacts import human_size, list_artifacts, safe_target, unwritable
from gpujobs_cli.commands import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_OK, CommandError
from gpujobs_cli.render import metric_series
from gpujobs_cli.resources import BUCKET, TABLE, Resources, discover

TENSORBOARD = "tensorboard"
"""The executable `gpujobs tensorboard` runs, found on PATH."""
INSTALL_HINT = "pip install tensorboard"


def add_arguments(made: dict[str, argparse.ArgumentParser]) -> None:
    for name in ("metrics", "tensorboard"):
        made[name].add_argument("job_id", metavar="ID", help="job id, as printed by submit (j-...)")
    made["metrics"].add_argument("--json", action="store_true", help="print JSON instead of text")
    board = made["tensorboard"]
    board.add_argument("--dir", metavar="DIR", help="where to put the event files (default: ./ID-tensorboard)")
    board.add_argument("--port", type=int, default=6006, metavar="N", help="the local port to serve on (default 6006)")
    board.add_argument("--no-serve", action="store_true", help="download only; do not start TensorBoard")


def cmd_metrics(args: argparse.Namespace) -> int:
    job = _job(discover(stack=args.stack, region=args.region, needs=(TABLE,)), args.job_id)
    if args.json:
        print(json.dumps(series_json(job), indent=2))
    else:
        print(metric_series(job))
    return EXIT_OK


def series_json(job: Job) -> dict[str, Any]:
    return {
        "job_id": job.job_id,
        "state": job.state.value,
        "dropped": job.progress.dropped,
        "points": [p.model_dump(mode="json") for p in job.progress.points],
    }


def cmd_tensorboard(args: argparse.Namespace) -> int:
    resources = discover(stack=args.stack, region=args.region, needs=(BUCKET, TABLE))
    job = _job(resources, args.job_id)
    s3, bucket = resources.client("s3"), resources.values[BUCKET]
    prefix = outputs_prefix(job.job_id, team=job.team) + TENSORBOARD_OUTPUTS
    files = list_artifacts(s3, bucket=bucket, prefix=prefix)
    if not files:
        print(
            f"{job.job_id} ({job.state.value}) has no TensorBoard files in s3://{bucket}/{printable(prefix)} yet:"
            " a job writes them under $GPUJOBS_TB_DIR, and they are uploaded with its outputs when it ends"
            " or when it calls run.save_outputs() (docs/training.md)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    root = Path(args.dir if args.dir is not None else f"{job.job_id}-tensorboard")
    keys = frozenset(f.key for f in files)
    fetched = skipped = 0
    for file in files:
        target = safe_target(root, file.key)
        why = f"not a path inside {root}" if target is None else unwritable(file.key, keys)
        if target is None or why is not None:
            print(f"gpujobs: skipping '{printable(file.key)}': {why}", file=sys.stderr)
            skipped += 1
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink():
            target.unlink()  # never write through a link
        s3.download_file(bucket, prefix + file.key, str(target))
        fetched += 1
    total = human_size(sum(f.size for f in files))
    print(f"downloaded {fetched} file(s), {total}, to {printable(str(root))}", file=sys.stderr)
    if args.no_serve:
        return EXIT_FAILED if skipped else EXIT_OK
    executable = shutil.which(TENSORBOARD)
    if executable is None:
        print(
            f"TensorBoard is not installed: {INSTALL_HINT}, then: {TENSORBOARD} --logdir {printable(str(root))}",
            file=sys.stderr,
        )
        return EXIT_FAILED if skipped else EXIT_OK
    print(f"serving {printable(str(root))} on http://localhost:{args.port}/ (Ctrl-C stops it)", file=sys.stderr)
    return subprocess.call([executable, "--logdir", str(root), "--port", str(args.port)])


def _job(resources: Resources, job_id: str) -> Job:
    store = DynamoJobStore(table_name=resources.table_name, client=resources.client("dynamodb"))
    try:
        return store.get(job_id)
    except JobNotFoundError:
        raise CommandError(f"no job {job_id}", EXIT_NOT_FOUND) from None
