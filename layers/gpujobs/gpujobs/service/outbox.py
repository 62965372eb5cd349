"""State changes are published from the record itself: the jobs table's stream is the outbox.

A handler writes a job and nothing more; DynamoDB Streams keeps every write of the job item (its
old and new image) for 24 h, in the order of the writes, and the Publisher function reads it. For
each write it publishes the transitions the new image has that the old one had not
(`state_changes`), numbered by their place in the job's history, so the event id
`<job_id>:<sequence>` is the same however often a write is read. A writer that dies after its write,
or a PutEvents that fails, therefore loses nothing: the record is read again until its events are
on the bus (at least once, in the job's order; consumers de-duplicate on the event id).

`Outbox.publish` takes the records of one batch in stream order and stops at the first whose events
could not be put: the Lambda event source mapping starts again from that record (a partial batch
response), so a later transition of a job never goes out before an earlier one. A record that
cannot be read (an item this release does not understand) is skipped and counted, never retried
forever: its transitions remain in the record's history for `gpujobs status` to show.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from gpujobs.domain.job import Job
from gpujobs.domain.states import JobState
from gpujobs.service.ports import EventPublisher, StateChanged

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamedWrite:
    """One write of a job item as the stream carries it."""

    position: str
    """Where the record stands in its shard (DynamoDB's SequenceNumber): what a retry resumes from."""
    before: Job | None
    """The old image (None for the write that created the job)."""
    after: Job
    """The new image."""


@dataclass(frozen=True)
class UnreadableWrite:
    """A stream record of a job item this release cannot read: skipped, with why."""

    position: str
    key: str
    problem: str


StreamRecord = StreamedWrite | UnreadableWrite | None
"""What a stream record is to the publisher: a job's write, one it cannot read, or (None) not a job's."""


@dataclass(frozen=True)
class Published:
    """What one batch came to."""

    events: int = 0
    """State changes put on the bus."""
    unreadable: int = 0
    """Records skipped because their images could not be read."""
    failed_at: str | None = None
    """The position of the first record whose events could not be put (the batch item failure):
    every record from it on is read again; None when the whole batch is done."""


@dataclass(frozen=True)
class Outbox:
    publisher: EventPublisher

    def publish(self, records: Sequence[StreamRecord]) -> Published:
        """Publish each record's state changes in stream order; stop at the first that fails."""
        events = unreadable = 0
        for record in records:
            if record is None:
                continue
            if isinstance(record, UnreadableWrite):
                unreadable += 1
                log.error("state changes of an unreadable record not published: %s (%s)", record.key, record.problem)
                continue
            changes = state_changes(record.before, record.after)
            if not changes:
                continue
            try:
                self.publisher.publish(changes)
            except Exception:
                log.warning(
                    "could not publish %d state changes of %s; the stream hands them over again",
                    len(changes),
                    record.after.job_id,
                    exc_info=True,
                )
                return Published(events, unreadable, failed_at=record.position)
            events += len(changes)
        return Published(events, unreadable)


def state_changes(before: Job | None, after: Job) -> list[StateChanged]:
    """The transitions `after` has that `before` had not, each numbered by its place in the job's
    history (its event id)."""
    new = after.history_since(before)
    first = after.history_count - len(new) + 1
    return [
        StateChanged(
            job_id=after.job_id,
            name=after.name,
            team=after.team,
            source=entry.source,
            target=entry.target,
            reason=entry.reason.value,
            attempt=entry.attempt,
            detail=entry.detail,
            at=entry.at,
            extra=_event_extra(after, entry.target),
            sequence=first + index,
        )
        for index, entry in enumerate(new)
    ]


def _event_extra(job: Job, target: JobState) -> dict[str, object]:
    attempt = job.current_attempt
    if target is JobState.REJECTED:
        return {"problems": list(job.problems)}
    if target is JobState.RUNNING and attempt:
        return {
            "instance_ids": list(attempt.instance_ids),
            "instance_type": attempt.instance_type,
            "zone": attempt.zone,
            "market": attempt.market.value if attempt.market else None,
        }
    return {}
