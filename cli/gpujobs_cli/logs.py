"""A job's output, read back from CloudWatch Logs: `gpujobs logs` and the tail `gpujobs status` shows.

Every node of every attempt writes two streams in the stack's job log group: its workload's output
(`<team>/<job>/<attempt>/<node>`, docker's awslogs driver on EC2, the bootstrap's shipper on the
local cloud) and its bootstrap's log (the same name + `/bootstrap`), so a user reads the same thing
on AWS and on the local cloud. The team comes first so that IAM can limit a team's users to its
streams (docs/security.md). An attempt launched by a release before teams were in the names wrote
`<job>/<attempt>/<node>`: when the team's stream does not exist, that one is read. By default the newest attempt that got instances, node 0 (rank 0 of
torchrun's node ranks), as for `docker logs`.

GetLogEvents has no paginator, and pages may be partly full or empty before the end: the end of a
stream is the call that answers the same forward token it was given. `--follow` keeps polling from
that token until the attempt is over, then reads once more: a node ships its output before it
reports its exit, so the last lines are in by then.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from gpujobs.contract import BOOTSTRAP_LOG_STREAM_SUFFIX, job_log_stream
from gpujobs.domain.job import Attempt, Job
from gpujobs.domain.spec_errors import printable
from gpujobs.domain.states import JobState, Reason

TAIL_LINES = 10
"""How many lines of a failed attempt's output `status` shows."""
_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
_FAILED_ENDS = frozenset({Reason.CRASHED_RETRYING.value, Reason.CRASHED_TOO_OFTEN.value, Reason.SYNC_FAILED.value})


class NoLogError(LookupError):
    """What was asked for has no log: no such attempt or node, or nothing written yet."""


@dataclass(frozen=True)
class LogLine:
    timestamp: datetime
    message: str

    def text(self) -> str:
        """The line as a terminal may show it (control characters spelled out: whoever wrote it)."""
        return printable(self.message.expandtabs())

    def as_json(self, stream: str) -> dict[str, str]:
        return {"timestamp": self.timestamp.isoformat(), "stream": stream, "message": self.message}


def parse_since(text: str) -> timedelta:
    """`90s`, `10m`, `2h`, `1d` -> that duration (argparse type)."""
    match = _DURATION.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a duration such as 30s, 10m, 2h or 1d")
    return timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})


def choose_attempt(job: Job, number: int | None) -> Attempt:
    """Attempt `number`, or the newest one that got instances (the newest of all if none did)."""
    if not job.attempts:
        raise NoLogError(f"{job.job_id} has no attempt yet (it is {job.state.value}): no log to show")
    if number is None:
        launched = [a for a in job.attempts if a.instance_ids]
        return (launched or job.attempts)[-1]
    for attempt in job.attempts:
        if attempt.number == number:
            return attempt
    numbers = ", ".join(str(a.number) for a in job.attempts)
    raise NoLogError(f"{job.job_id} has no attempt {number} (its attempts: {numbers})")


def choose_streams(job: Job, attempt: Attempt, *, node: int, bootstrap: bool = False) -> tuple[str, ...]:
    """The node's streams, the first that exists to be read: node K of the attempt's newest generation
    (a regrouped gang's, `.../K/g<g>`), then as first launched, then as a release before teams were
    in the names named it. A survivor's bootstrap log stays in the stream it opened first."""
    nodes = job.spec.nodes if job.spec is not None else 1
    if not 0 <= node < nodes:
        raise NoLogError(f"{job.job_id} runs on {nodes} node(s): --node takes 0 to {nodes - 1}, not {node}")
    suffix = BOOTSTRAP_LOG_STREAM_SUFFIX if bootstrap else ""
    generations = dict.fromkeys((attempt.generation, 0))
    streams = [
        job_log_stream(job.job_id, attempt.number, node, team=job.team, generation=g) + suffix for g in generations
    ]
    return (*streams, job_log_stream(job.job_id, attempt.number, node, team=None) + suffix)


def failed_attempt(job: Job) -> tuple[Attempt, int] | None:
    """The newest attempt that failed, and the node to show (the first that exited non-zero, else 0)."""
    for attempt in reversed(job.attempts):
        ran = bool(attempt.instance_ids) and attempt.is_over
        if ran and (
            attempt.end_reason in _FAILED_ENDS or (job.state is JobState.FAILED and attempt is job.attempts[-1])
        ):
            codes = [attempt.exit_codes.get(instance_id, 0) for instance_id in attempt.instance_ids]
            return attempt, next((node for node, code in enumerate(codes) if code != 0), 0)
    return None


class JobLogs:
    """The stack's job log group, read through a CloudWatch Logs client."""

    def __init__(self, client: Any, group: str) -> None:
        self.client = client
        self.group = group

    def find(self, streams: tuple[str, ...]) -> str:
        """The first of `streams` that exists; NoLogError, naming the first, when none does (a node
        that has not started has none yet)."""
        for stream in streams:
            found = self.client.describe_log_streams(logGroupName=self.group, logStreamNamePrefix=stream)
            if any(s["logStreamName"] == stream for s in found.get("logStreams", [])):
                return stream
        raise NoLogError(f"no log yet in {self.group} for {streams[0]} (the node has not started, or wrote nothing)")

    def read(
        self, stream: str, *, since: datetime | None = None, token: str | None = None
    ) -> tuple[list[LogLine], str]:
        """Every event from `token` (or from `since`, or the start) to the end, and the token to go on from."""
        lines: list[LogLine] = []
        while True:
            ask: dict[str, Any] = {"logGroupName": self.group, "logStreamName": stream, "startFromHead": True}
            if since is not None:  # on every page: the token alone is read against it (moto)
                ask["startTime"] = int(since.timestamp() * 1000)
            if token is not None:
                ask["nextToken"] = token
            page = self.client.get_log_events(**ask)
            lines += [_line(event) for event in page["events"]]
            forward: str = page["nextForwardToken"]
            if forward == token:  # the end of the stream, for now
                return lines, forward
            token = forward

    def tail(self, streams: tuple[str, ...], count: int = TAIL_LINES) -> list[LogLine]:
        """The last `count` lines of the first of `streams` that exists; none when none does."""
        try:
            stream = self.find(streams)
        except NoLogError:
            return []
        page = self.client.get_log_events(
            logGroupName=self.group, logStreamName=stream, startFromHead=False, limit=count
        )
        return [_line(event) for event in page["events"]][-count:]

    def follow(
        self,
        stream: str,
        *,
        since: datetime | None,
        is_over: Callable[[], bool],
        sleep: Callable[[float], None],
        every: float = 2.0,
    ) -> Iterator[LogLine]:
        """The stream's lines as they come, until `is_over()` (checked before each read: one read follows it)."""
        token: str | None = None
        while True:
            over = is_over()
            lines, token = self.read(stream, since=since, token=token)
            yield from lines
            if over:
                return
            sleep(every)


def _line(event: dict[str, Any]) -> LogLine:
    return LogLine(datetime.fromtimestamp(event["timestamp"] / 1000, tz=UTC), event["message"])
