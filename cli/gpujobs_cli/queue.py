"""`gpujobs queue` and `gpujobs quota`: the admission queue and each team's use of its GPU quota.

Both read what the reconciler decides on: the waiting and holding jobs (the table's `ByState`
index), the GPU ledger (one item) and the team configuration (the SSM parameter the stack names as
its `TeamsParameterName` output, or `GPUJOBS_TEAMS_PARAMETER`). The queue's order is the admission
plan's own (`domain.queue_view`). A configuration this user may not read is said in one line and
the rest is shown without quotas.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from gpujobs.adapters.dynamodb import DynamoJobStore
from gpujobs.domain.job import Job
from gpujobs.domain.ledger import Ledger, holds, waits
from gpujobs.domain.queue_view import Place, places
from gpujobs.domain.spec_errors import printable
from gpujobs.domain.states import ACTIVE_STATES, MAX_ACTIVE_JOBS
from gpujobs.domain.teams import TeamConfigError, TeamDirectory, parse_team_config
from gpujobs_cli.render import table, when
from gpujobs_cli.resources import TABLE, TEAMS_PARAMETER, Resources, discover, optional

EXIT_OK = 0


def cmd_queue(args: argparse.Namespace) -> int:
    resources = discover(stack=args.stack, region=args.region, needs=(TABLE,))
    store = DynamoJobStore(table_name=resources.table_name, client=resources.client("dynamodb"))
    directory = team_directory(resources)
    waiting, holders = _active(store)
    found = places(waiting, holders, directory, utc_now())
    if args.team:
        found = [p for p in found if p.job.team == args.team]
    if args.json:
        print(json.dumps([_place_json(p) for p in found], indent=2))
    elif found:
        print(queue_table(found))
    else:
        print(f"nobody waits{f' in team {args.team}' if args.team else ''}")
    return EXIT_OK


def cmd_quota(args: argparse.Namespace) -> int:
    resources = discover(stack=args.stack, region=args.region, needs=(TABLE,))
    store = DynamoJobStore(table_name=resources.table_name, client=resources.client("dynamodb"))
    directory = team_directory(resources)
    ledger = store.ledger()
    rows = quota_rows(ledger, directory)
    fleet = {"gpus": ledger.gpus, "max_gpus": directory.fleet.max_gpus, "drain": directory.fleet.drain}
    if args.json:
        print(json.dumps({"teams": rows, "fleet": fleet, "waiting": ledger.waiting}, indent=2))
        return EXIT_OK
    headers = ["TEAM", "GPUS", "OWN", "BORROWED", "QUOTA", "WEIGHT", "BORROWS", "LENDS", "WAITING", "NOTE"]
    print(
        table(
            headers,
            [
                [
                    r["team"],
                    str(r["gpus"]),
                    str(r["own"]),
                    str(r["borrowed"]),
                    "-" if r["quota"] is None else str(r["quota"]),
                    f"{r['weight']:g}",
                    "yes" if r["borrow"] else "no",
                    "yes" if r["lend"] else "no",
                    str(r["waiting"]),
                    "paused" if r["paused"] else "",
                ]
                for r in rows
            ],
        )
    )
    cap = "no cap" if fleet["max_gpus"] is None else f"{fleet['max_gpus']} at most"
    print(
        f"\nfleet: {ledger.gpus} GPU(s) held ({cap}); {ledger.waiting} job(s) waiting"
        + (", DRAINED" if fleet["drain"] else "")
    )
    return EXIT_OK


def quota_rows(ledger: Ledger, directory: TeamDirectory) -> list[dict[str, Any]]:
    rows = []
    for team in sorted(set(directory.teams) | ledger.teams()):
        quota = directory.quota(team)
        held, borrowed = ledger.team(team), ledger.borrowed(team)
        rows.append(
            {
                "team": team,
                "gpus": held,
                "own": held - borrowed,
                "borrowed": borrowed,
                "quota": quota.gpus,
                "weight": quota.weight,
                "borrow": quota.borrow,
                "lend": quota.lend,
                "paused": quota.paused,
                "waiting": ledger.team_waiting(team),
                "by_family": {
                    name.split("/")[2]: value
                    for name, value in ledger.counters.items()
                    if name.startswith(f"gpus/{team}/") and name.count("/") == 2
                },
            }
        )
    return rows


def queue_table(found: Sequence[Place]) -> str:
    rows = [
        [
            str(p.position),
            str(p.in_team),
            p.job.job_id,
            printable(p.job.team),
            p.job.require_spec().priority.value,
            str(p.job.require_spec().nodes * p.job.require_spec().gpus_per_node),
            when(p.job.created_at),
            when(p.latest_start) if p.latest_start is not None else "-",
            printable(p.why)[:90],
        ]
        for p in found
    ]
    headers = ["#", "IN TEAM", "JOB", "TEAM", "PRIORITY", "GPUS", "SUBMITTED", "STARTS BY", "WHY IT WAITS"]
    return table(headers, rows)


def place_line(resources: Resources, job: Job) -> str | None:
    """`status`'s line for a job that waits for admission: its place and why (None otherwise)."""
    if not waits(job):
        return None
    store = DynamoJobStore(table_name=resources.table_name, client=resources.client("dynamodb"))
    waiting, holders = _active(store)
    found = next(
        (p for p in places(waiting, holders, team_directory(resources), utc_now()) if p.job.job_id == job.job_id), None
    )
    if found is None:
        return None
    start = f"; starts by {when(found.latest_start)} at the latest" if found.latest_start else ""
    return f"queue     {_nth(found.in_team)} in team {job.team}'s queue, {_nth(found.position)} overall: {found.why}{start}"


def team_directory(resources: Resources) -> TeamDirectory:
    """The team configuration the stack names, or none (said on stderr when it cannot be read)."""
    name = optional(resources, TEAMS_PARAMETER)
    if name is None:
        return TeamDirectory.open()
    from botocore.exceptions import ClientError

    try:
        text = resources.client("ssm").get_parameter(Name=name)["Parameter"]["Value"]
        return parse_team_config(text)
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "error")
        print(f"note: quotas not shown: cannot read the team configuration {name} ({code})", file=sys.stderr)
    except TeamConfigError as exc:
        print(f"note: quotas not shown: the team configuration {name} is malformed ({exc})", file=sys.stderr)
    return TeamDirectory.open()


def _active(store: DynamoJobStore) -> tuple[list[Job], list[Job]]:
    jobs = [job for state in ACTIVE_STATES for job in store.list_by_state(state, limit=MAX_ACTIVE_JOBS)]
    return [j for j in jobs if waits(j)], [j for j in jobs if holds(j)]


def _place_json(place: Place) -> dict[str, Any]:
    spec = place.job.require_spec()
    return {
        "position": place.position,
        "in_team": place.in_team,
        "job_id": place.job.job_id,
        "name": place.job.name,
        "team": place.job.team,
        "priority": spec.priority.value,
        "gpus": spec.nodes * spec.gpus_per_node,
        "submitted": place.job.created_at.isoformat(),
        "latest_start": place.latest_start.isoformat() if place.latest_start else None,
        "why": place.why,
    }


def _nth(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def utc_now() -> datetime:
    """This module's clock (the queue's estimates and ages): tests replace it rather than race the wall clock."""
    return datetime.now(UTC)
