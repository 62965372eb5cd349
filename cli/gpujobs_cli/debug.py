"""`gpujobs debug JOB`: the stacks a hung gang was dumped with before the control plane killed it.

When the reconciler finds a gang hung (its heartbeats stopped), it first asks every node for the
stacks of its ranks and kills the gang only a few minutes later (`domain.hangs`); each node's
launcher writes one file per rank, and the NCCL flight recorder's traces where it dumped any, under
its output folder's `gpujobs-hang-dumps/attempt-N/` and has them uploaded
(`gpujobs_trainer.stack_dumps`). So they are objects of the job's outputs,
`outputs/<team>/<job>/[node-K/]gpujobs-hang-dumps/attempt-N/`, read with the same credentials and
IAM scope as `gpujobs artifacts`. This prints them per node and rank, the newest dumped attempt by
default. Their text was written by the job: every line is shown through `printable`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from typing import Any

from gpujobs.domain.spec_errors import printable
from gpujobs_cli.artifacts import Artifact, artifacts_of
from gpujobs_cli.commands import EXIT_NOT_FOUND, EXIT_OK
from gpujobs_cli.resources import BUCKET, TABLE, discover

DUMPS_FOLDER = "gpujobs-hang-dumps"
"""The launcher's folder for them (`gpujobs_trainer.stack_dumps.DUMPS_FOLDER`; a test keeps the two equal)."""
_DUMP_KEY = re.compile(
    rf"^(?:node-(?P<node>\d+)/)?{DUMPS_FOLDER}/attempt-(?P<attempt>\d+)/"
    r"(?:rank-(?P<rank>\d+|unknown)\.txt|nccl-trace-rank-(?P<trace>\d+))$"
)

SUMMARY = "print the stacks a hung job was dumped with"
DESCRIPTION = (
    "Print the stacks of every rank of a job's gang, dumped (py-spy, or the trainer library's\n"
    "faulthandler where py-spy could not trace) when the control plane found the gang hung and\n"
    "before it terminated it; per node and rank, the newest dumped attempt unless --attempt. NCCL\n"
    "flight-recorder traces, where a rank's watchdog wrote one, are listed (binary: fetch them with\n"
    "`gpujobs download`). Exits 3 when the job has no dump (for that attempt)."
)
EPILOG = (
    "examples:\n  gpujobs debug j-0123456789abcdef\n  gpujobs debug j-0123456789abcdef --attempt 2\n"
    "  gpujobs debug j-0123456789abcdef --json | jq -r '.[] | select(.rank == 0) | .text'"
)


@dataclass(frozen=True)
class DumpFile:
    """One dump of one rank (or one NCCL trace) as uploaded; `key` is relative to the outputs prefix."""

    key: str
    attempt: int
    node: int
    rank: int | None
    nccl_trace: bool


def dump_files(artifacts: list[Artifact]) -> list[DumpFile]:
    """The hang dumps among a job's outputs, by attempt, node and rank; anything else is left out."""
    found = []
    for artifact in artifacts:
        match = _DUMP_KEY.match(artifact.key)
        if match is None:
            continue
        rank = match["trace"] or match["rank"]
        found.append(
            DumpFile(
                key=artifact.key,
                attempt=int(match["attempt"]),
                node=int(match["node"] or 0),
                rank=int(rank) if rank is not None and rank != "unknown" else None,
                nccl_trace=match["trace"] is not None,
            )
        )
    return sorted(found, key=lambda d: (d.attempt, d.node, d.nccl_trace, -1 if d.rank is None else d.rank))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id", metavar="ID", help="job id, as printed by submit (j-...)")
    parser.add_argument("--attempt", type=int, metavar="N", help="the attempt whose dumps to print (default: newest)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def cmd_debug(args: argparse.Namespace) -> int:
    resources = discover(stack=args.stack, region=args.region, needs=(BUCKET, TABLE))
    prefix, artifacts = artifacts_of(resources, args.job_id, quiet=True)
    dumps = dump_files(artifacts)
    attempt = args.attempt if args.attempt is not None else max((d.attempt for d in dumps), default=None)
    chosen = [d for d in dumps if d.attempt == attempt]
    if not chosen:
        which = f" for attempt {args.attempt}" if args.attempt is not None else ""
        print(
            f"gpujobs: {args.job_id} has no hang dump{which}: a gang is dumped only when the control plane "
            "finds it hung, just before it is replaced (docs/training.md, 'Debugging a hang')",
            file=sys.stderr,
        )
        return EXIT_NOT_FOUND
    s3, bucket = resources.client("s3"), resources.values[BUCKET]
    where = f"s3://{bucket}/{prefix}"
    texts = {d.key: _text(s3, bucket, prefix + d.key) for d in chosen if not d.nccl_trace}
    if args.json:
        print(json.dumps([_as_json(d, where, texts.get(d.key)) for d in chosen], indent=2))
        return EXIT_OK
    for dump in chosen:
        if dump.nccl_trace:
            print(f"== attempt {dump.attempt}, node {dump.node}: NCCL flight recorder of rank {dump.rank} ==")
            print(f"{printable(where + dump.key)} (binary; `gpujobs download` fetches it)\n")
            continue
        print(f"== attempt {dump.attempt}, node {dump.node}, rank {_rank(dump)} ==")
        for line in texts[dump.key].splitlines():
            print(printable(line))
        print()
    return EXIT_OK


def _rank(dump: DumpFile) -> str:
    return "unknown" if dump.rank is None else str(dump.rank)


def _text(s3: Any, bucket: str, key: str) -> str:
    body: bytes = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    return body.decode("utf-8", errors="replace")


def _as_json(dump: DumpFile, where: str, text: str | None) -> dict[str, Any]:
    return {
        "attempt": dump.attempt,
        "node": dump.node,
        "rank": dump.rank,
        "kind": "nccl-trace" if dump.nccl_trace else "stacks",
        "uri": where + dump.key,
        "text": text,
    }
