"""What each `gpujobs` command does, once main.py has parsed its arguments.

The CLI never writes a job itself. It validates a spec with the same domain model the control plane
uses, sends it to the queue, and reads jobs from the table; the submit Lambda is the only writer.
So that a submission has a known job id before the Lambda has seen it, `submit` always sends a
client_token and computes the id exactly as the control plane does (`job_id_for`). A submission the
control plane rejects is recorded under an id derived from the SQS message id instead; `--wait`
watches both ids, so a rejection on the server (say, an instance type outside the stack's
allow-list) ends the wait rather than leaving it waiting for a job that will never exist. The
rejection is looked for first: a token reused with a different spec is rejected as a conflict while
the token's id still names the earlier job, which is not this submission's. With `--wait` (which
reads the table anyway) such a conflict is caught before anything is sent.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpujobs.adapters.dynamodb import DynamoJobStore
from gpujobs.domain.job import Job
from gpujobs.domain.job_ids import job_id_for
from gpujobs.domain.spec import MAX_SPEC_BYTES, CheckpointMode, JobSpec, json_schema, load_spec, validate_spec
from gpujobs.domain.spec_errors import SpecError, printable
from gpujobs.domain.states import ACTIVE_STATES, JobState
from gpujobs.service.ports import JobNotFoundError, JobStore, UnreadableJobError
from gpujobs_cli import code, queue, render
from gpujobs_cli.code import CodePackError
from gpujobs_cli.instance_types import TypeChecks, type_checks
from gpujobs_cli.logs import JobLogs, NoLogError, choose_attempt, choose_streams, failed_attempt
from gpujobs_cli.resources import BUCKET, LOG_GROUP, QUEUE, TABLE, ConfigError, Resources, discover
from gpujobs_cli.spend import spend_of

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NOT_FOUND = 0, 1, 2, 3
UNSUCCESSFUL_ENDS = frozenset({JobState.FAILED, JobState.REJECTED, JobState.CANCELLED})
POLL_SECONDS = 2.0
sleep: Callable[[float], None] = time.sleep
"""Replaced in tests, so that waiting loops run without waiting."""


class CommandError(Exception):
    """An expected failure: shown as one line, exits with `code`."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


# ---- offline ------------------------------------------------------------------------------
def cmd_validate(args: argparse.Namespace) -> int:
    """One result per file, in order; exit 1 when any spec is invalid. Every file is read first: one
    that cannot be read is a usage error (exit 2), as a mistyped path is, and nothing is judged."""
    if args.files.count("-") > 1:
        raise CommandError("standard input ('-') can be named only once")
    sources = [read_source(path) for path in args.files]
    checks = type_checks(args.region)
    results = [_validate_one(label, text, args.allowed_instance_types, checks) for label, text in sources]
    failed = sum(1 for r in results if not r["ok"])
    if args.json:
        print(json.dumps(results, indent=2))
        return EXIT_FAILED if failed else EXIT_OK
    several = len(results) > 1
    for result in results:
        if result["ok"]:
            print(f"{result['file']}: ok: {result['name']}" if several else f"ok: {result['name']}")
        for problem in result["problems"]:
            print(f"{result['file']}: {problem}")
    if several:
        print(f"{len(results) - failed} of {len(results)} specs valid", file=sys.stderr)
    return EXIT_FAILED if failed else EXIT_OK


def _validate_one(
    label: str, text: bytes, allowed_instance_types: Sequence[str] | None, checks: TypeChecks
) -> dict[str, Any]:
    try:
        spec = load_spec(text, allowed_instance_types=allowed_instance_types, local_code=True, **checks)
    except SpecError as exc:
        return {"file": label, "ok": False, "name": None, "problems": exc.problems}
    return {"file": label, "ok": True, "name": spec.name, "problems": []}


def cmd_schema(_args: argparse.Namespace) -> int:
    print(json.dumps(json_schema(), indent=2))
    return EXIT_OK


# ---- submit -------------------------------------------------------------------------------
def cmd_submit(args: argparse.Namespace) -> int:
    label, text = read_source(args.file)
    try:
        spec = load_spec(
            text, allowed_instance_types=args.allowed_instance_types, local_code=True, **type_checks(args.region)
        )
        if args.client_token and spec.client_token and args.client_token != spec.client_token:
            raise CommandError(
                f"--client-token {args.client_token!r} conflicts with the spec's client_token {spec.client_token!r}"
            )
        document = spec.model_dump(mode="json", exclude_unset=True)
        document["client_token"] = spec.client_token or args.client_token or uuid.uuid4().hex
        packed = _pack_local_code(label, spec)
        spec = validate_spec(
            document, allowed_instance_types=args.allowed_instance_types, local_code=True, **type_checks(args.region)
        )
    except (SpecError, CodePackError) as exc:
        for problem in exc.problems if isinstance(exc, SpecError) else [str(exc)]:
            print(f"{label}: {problem}", file=sys.stderr)
        return EXIT_FAILED
    warning = code.entrypoint_warning(spec.image, needs_launcher=_needs_launcher(spec))
    if warning:
        print(f"{label}: warning: {warning}", file=sys.stderr)
    token = str(document["client_token"])
    job_id = job_id_for(client_token=token, team=spec.team, message_id=None)
    needs = (QUEUE, TABLE) if args.wait else (QUEUE,)
    resources = _discover(args, needs=(*needs, BUCKET) if packed else needs)
    if packed is not None:
        uri = code.upload(packed, s3=resources.client("s3"), bucket=resources.values[BUCKET], job_id=job_id)
        document.update(code=uri, code_sha256=packed.sha256)
        print(f"packed {packed.files} file(s) of code ({len(packed.data)} bytes) to {uri}", file=sys.stderr)
    try:
        spec = validate_spec(document, allowed_instance_types=args.allowed_instance_types, **type_checks(args.region))
        body = json.dumps(document, ensure_ascii=False, separators=(",", ":"))
        if len(body.encode()) > MAX_SPEC_BYTES:
            raise SpecError([f"(spec): {len(body.encode())} bytes as JSON, more than one SQS message allows"])
    except SpecError as exc:
        for problem in exc.problems:
            print(f"{label}: {problem}", file=sys.stderr)
        return EXIT_FAILED
    if args.wait:
        existing = _find(_store(resources), job_id)
        if existing is not None and existing.spec != spec:
            print(
                f"{label}: client_token: {token!r} already names job {job_id} with a different spec; "
                "use a new client_token for a new job (nothing was sent)",
                file=sys.stderr,
            )
            return EXIT_FAILED
    sent = resources.client("sqs").send_message(QueueUrl=resources.queue_url, MessageBody=body)
    message_id = str(sent["MessageId"])
    result: dict[str, Any] = {
        "job_id": job_id,
        "name": spec.name,
        "team": spec.team,
        "client_token": token,
        "message_id": message_id,
    }
    if not args.json:
        print(job_id)
        print(f"submitted {spec.name!r} (team {spec.team}, client token {token}) as {job_id}", file=sys.stderr)
    if not args.wait:
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            print(f"follow it with: gpujobs status {job_id} --watch", file=sys.stderr)
        return EXIT_OK
    rejected_id = job_id_for(client_token=None, team=None, message_id=message_id)
    job = wait_for(
        _store(resources),
        job_id,
        done=lambda j: j.state is JobState.RUNNING or j.state.is_terminal,
        also_rejected_as=rejected_id,
    )
    if args.json:
        print(json.dumps({**result, "job": job.model_dump(mode="json")}, indent=2))
    else:
        print(render.job_status(job, now=utc_now()))
    return EXIT_FAILED if job.state in UNSUCCESSFUL_ENDS else EXIT_OK


def _pack_local_code(label: str, spec: JobSpec) -> code.PackedCode | None:
    """The spec's `code:` folder packed (relative to the spec file's folder), or None for S3 code;
    CodePackError also when the `requirements:` file is not among what was packed."""
    if spec.code is None or spec.code.startswith("s3://"):
        return None
    base = Path.cwd() if label == "<stdin>" else Path(label).resolve().parent
    packed = code.pack(base / Path(spec.code).expanduser())
    if spec.requirements and spec.requirements not in packed.names:
        raise CodePackError(f"requirements: {spec.requirements!r} is not a file packed from code: {spec.code}")
    return packed


def _needs_launcher(spec: JobSpec) -> bool:
    """Only `checkpoint: none` without `code:` runs on an image whose entrypoint is not our launcher."""
    return spec.code is not None or spec.checkpoint is not CheckpointMode.NONE


# ---- reading jobs -------------------------------------------------------------------------
def cmd_status(args: argparse.Namespace) -> int:
    resources = _discover(args, needs=(TABLE,))
    store = _store(resources)
    job = _get(store, args.job_id)
    if not args.watch:
        place = queue.place_line(resources, job)
        page = _status_page(job) + (f"\n{place}" if place and not args.json else "")
        print(json.dumps(_status_json(job), indent=2) if args.json else page)
        if not args.json:
            _print_failure_tail(args, job)
        return EXIT_OK

    def show(current: Job) -> None:
        if args.json:
            print(json.dumps(_status_json(current)), flush=True)
        else:
            print(_status_page(current) + "\n", flush=True)

    job = wait_for(store, job.job_id, done=lambda j: j.state.is_terminal, on_change=show, first=job)
    if not args.json:
        _print_failure_tail(args, job)
    return EXIT_FAILED if job.state in UNSUCCESSFUL_ENDS else EXIT_OK


def _print_failure_tail(args: argparse.Namespace, job: Job) -> None:
    """The last lines a failed attempt's node printed, under its status; a line saying why when unreadable."""
    found = failed_attempt(job)
    if found is None:
        return
    attempt, node = found
    streams = choose_streams(job, attempt, node=node)
    print(
        f"\nlast lines of attempt {attempt.number}, node {node} (gpujobs logs {job.job_id} --attempt {attempt.number}"
        f" --node {node}):"
    )
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        resources = _discover(args, needs=(LOG_GROUP,))
        lines = JobLogs(resources.client("logs"), resources.values[LOG_GROUP]).tail(streams)
    except (ConfigError, BotoCoreError, ClientError) as exc:
        print(f"  (unavailable: {printable(' '.join(str(exc).split()))})")
        return
    print("\n".join(f"  {line.text()}" for line in lines) if lines else "  (nothing was logged)")


# ---- logs ---------------------------------------------------------------------------------
def cmd_logs(args: argparse.Namespace) -> int:
    resources = _discover(args, needs=(TABLE, LOG_GROUP))
    store = _store(resources)
    job = _get(store, args.job_id)
    logs = JobLogs(resources.client("logs"), resources.values[LOG_GROUP])
    since = utc_now() - args.since if args.since else None
    try:
        attempt = choose_attempt(job, args.attempt)
        streams = choose_streams(job, attempt, node=args.node, bootstrap=args.bootstrap)
        if not args.follow:
            stream = logs.find(streams)
    except NoLogError as exc:
        raise CommandError(str(exc), EXIT_NOT_FOUND) from None

    def attempt_over() -> bool:
        current = next(a for a in _get(store, job.job_id).attempts if a.number == attempt.number)
        return current.is_over

    if args.follow:
        stream = _wait_for_stream(logs, streams, attempt_over)
        lines = logs.follow(stream, since=since, is_over=attempt_over, sleep=sleep, every=POLL_SECONDS)
    else:
        lines = iter(logs.read(stream, since=since)[0])
    for line in lines:
        print(json.dumps(line.as_json(stream)) if args.json else line.text(), flush=True)
    return EXIT_OK


def _wait_for_stream(logs: JobLogs, streams: tuple[str, ...], attempt_over: Callable[[], bool]) -> str:
    """Until the node has written its first line (under any of its names); NOT_FOUND if its attempt ends first."""
    told = False
    while True:
        over = attempt_over()
        try:
            return logs.find(streams)
        except NoLogError as exc:
            if over:
                raise CommandError(str(exc), EXIT_NOT_FOUND) from None
            if not told:
                print(f"[{_clock()}] waiting for {streams[0]} to start", file=sys.stderr)
                told = True
        sleep(POLL_SECONDS)


def _status_json(job: Job) -> dict[str, Any]:
    """The job record, and its deadline's standing now when it has one (`deadline`)."""
    deadline = render.deadline_json(job, utc_now())
    return _with_spend(job) | ({"deadline": deadline} if deadline is not None else {})


def _warn_unreadable(error: UnreadableJobError) -> None:
    """A record this CLI cannot read (a newer release's) is listed as a warning, not an exit."""
    print(f"warning: {printable(str(error))} (upgrade the CLI)", file=sys.stderr)


def cmd_list(args: argparse.Namespace) -> int:
    states = parse_states(args.state)
    store = _store(_discover(args, needs=(TABLE,)))
    jobs = [
        job
        for state in states
        for job in store.list_by_state(state, limit=args.limit, team=args.team, on_unreadable=_warn_unreadable)
    ]
    jobs.sort(key=lambda j: j.updated_at, reverse=True)
    jobs = jobs[: args.limit]
    if args.json:
        print(json.dumps([_with_spend(j) for j in jobs], indent=2))
    elif jobs:
        now = utc_now()
        print(render.job_list(jobs, spends={j.job_id: spend_of(j, now) for j in jobs}))
    else:
        of_team = f" of team {args.team}" if args.team else ""
        print(f"no jobs{of_team} in {', '.join(s.value for s in states)}")
    return EXIT_OK


def _status_page(job: Job) -> str:
    now = utc_now()
    return render.job_status(job, spend=spend_of(job, now), now=now)


def _with_spend(job: Job) -> dict[str, Any]:
    """The job record as JSON, plus `spend`: what it has cost so far (`gpujobs_cli.spend`)."""
    return {**job.model_dump(mode="json"), "spend": spend_of(job, utc_now()).as_json()}


def utc_now() -> datetime:
    """The CLI's one clock (ages, spend, `--since`): tests replace it rather than race the wall clock."""
    return datetime.now(UTC)


def parse_states(requested: Sequence[str] | None) -> list[JobState]:
    if not requested:
        return list(ACTIVE_STATES)
    names = [n.strip().upper() for item in requested for n in item.split(",") if n.strip()]
    if "ALL" in names:
        return list(JobState)
    unknown = sorted({n for n in names if n not in JobState.__members__})
    if unknown:
        choices = ", ".join([*(s.value for s in JobState), "all"])
        raise CommandError(f"unknown state {', '.join(unknown)} (choose from {choices})")
    return list(dict.fromkeys(JobState(n) for n in names))


# ---- cancel -------------------------------------------------------------------------------
def cmd_cancel(args: argparse.Namespace) -> int:
    resources = _discover(args, needs=(TABLE, QUEUE))
    job = _get(_store(resources), args.job_id)
    kept = job.kept is not None and job.kept.lasts(utc_now())  # its gang kept for inspection goes
    if job.state.is_terminal and not kept:
        if args.json:
            print(json.dumps({"job_id": job.job_id, "state": job.state.value, "cancel_requested": False}))
        else:
            print(f"{job.job_id} is already {job.state.value}; nothing to cancel")
        return EXIT_OK
    body = json.dumps({"cancel_job_id": job.job_id})
    resources.client("sqs").send_message(QueueUrl=resources.queue_url, MessageBody=body)
    if args.json:
        print(json.dumps({"job_id": job.job_id, "state": job.state.value, "cancel_requested": True}))
    else:
        print(
            f"release of {job.job_id}'s gang kept for inspection requested (stays {job.state.value})"
            if kept
            else f"cancellation requested for {job.job_id} (was {job.state.value})"
        )
        print(f"follow it with: gpujobs status {job.job_id} --watch", file=sys.stderr)
    return EXIT_OK


# ---- dashboard ----------------------------------------------------------------------------
# ---- helpers ------------------------------------------------------------------------------
def read_source(path: str) -> tuple[str, bytes]:
    """The file's label for messages and its bytes; `-` reads standard input."""
    if path == "-":
        return "<stdin>", sys.stdin.buffer.read()
    try:
        return path, Path(path).read_bytes()
    except OSError as exc:
        raise CommandError(f"cannot read {path}: {exc.strerror or exc}") from None


def wait_for(
    store: JobStore,
    job_id: str,
    *,
    done: Callable[[Job], bool],
    also_rejected_as: str | None = None,
    on_change: Callable[[Job], None] | None = None,
    first: Job | None = None,
) -> Job:
    """Poll until `done(job)`; report each change of state on stderr (or through `on_change`)."""
    seen: object = ()  # no marker yet: the first poll always reports
    job = first
    while True:
        if job is None:  # this message's rejection first: a conflict leaves another job under `job_id`
            job = _rejected(store, also_rejected_as) or _find(store, job_id)
        marker = (job.version, job.state) if job else None
        if marker != seen:
            seen = marker
            if job is None:
                print(f"[{_clock()}] {job_id}: waiting for the control plane to record the job", file=sys.stderr)
            elif on_change is not None:
                on_change(job)
            else:
                detail = printable(job.status_detail)
                print(f"[{_clock()}] {job.job_id}: {job.state.value} ({detail})", file=sys.stderr)
        if job is not None and done(job):
            return job
        sleep(POLL_SECONDS)
        job = None


def _rejected(store: JobStore, job_id: str | None) -> Job | None:
    job = None if job_id is None else _find(store, job_id)
    return job if job is not None and job.state is JobState.REJECTED else None


def _find(store: JobStore, job_id: str) -> Job | None:
    try:
        return store.get(job_id)
    except JobNotFoundError:
        return None


def _clock() -> str:
    return time.strftime("%H:%M:%S")


def _discover(args: argparse.Namespace, *, needs: Sequence[str]) -> Resources:
    return discover(stack=args.stack, region=args.region, needs=needs)


def _store(resources: Resources) -> JobStore:
    return DynamoJobStore(table_name=resources.table_name, client=resources.client("dynamodb"))


def _get(store: JobStore, job_id: str) -> Job:
    try:
        return store.get(job_id)
    except JobNotFoundError:
        raise CommandError(f"no job {job_id}", EXIT_NOT_FOUND) from None
