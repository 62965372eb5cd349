"""The jobs table's stream in memory, and the event source mapping that reads it into the outbox.

`InMemoryStream` is what DynamoDB Streams (view type NEW_AND_OLD_IMAGES) keeps of the in-memory
store: one record per write of a job item, its old and new image, in the order of the writes. It
also plays the one consumer Lambda's event source mapping is: `read()` hands the records after its
checkpoint to the outbox in batches, moves the checkpoint past what was done, and on a batch item
failure stays at the failed record, so the next read starts there (Lambda retries from the lowest
failed sequence number).

By default the stream is read right after each write, as the mapping would moments later, so that
a test sees a write's events at once. A simulation that wants to choose when the stream is read
(the randomized proof: a publisher down for a while, a read that fails) turns `reads_on_write` off
and calls `read()` itself.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field

from gpujobs.domain.job import Job
from gpujobs.service.outbox import Outbox, Published, StreamedWrite

BATCH_SIZE = 25
"""As template.yaml's PublisherFunction `BatchSize`."""


@dataclass
class InMemoryStream:
    records: list[StreamedWrite] = field(default_factory=list)
    checkpoint: int = 0
    """How many records the consumer is done with (its place in the shard)."""
    outbox: Outbox | None = None
    """The consumer (`gpujobs_fakes.wiring.wire` sets it); None: nobody reads the stream."""
    reads_on_write: bool = True
    _numbers: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _lock: threading.RLock = field(default_factory=threading.RLock)

    def append(self, before: Job | None, after: Job) -> None:
        """A write of a job item (called by the store, in the order of its writes)."""
        with self._lock:
            self.records.append(StreamedWrite(f"{next(self._numbers):021d}", before, after))

    def written(self) -> None:
        """The store's write is done: the mapping reads the stream now, unless told not to."""
        if self.reads_on_write:
            self.read()

    @property
    def unread(self) -> int:
        return len(self.records) - self.checkpoint

    def read(self, *, batch_size: int = BATCH_SIZE) -> Published:
        """Hand every record after the checkpoint to the outbox, batch after batch, until done or a
        batch reports a failure (the checkpoint then stays at the failed record)."""
        events = unreadable = 0
        with self._lock:
            while self.outbox is not None and self.checkpoint < len(self.records):
                batch = self.records[self.checkpoint : self.checkpoint + batch_size]
                done = self.outbox.publish(batch)
                events, unreadable = events + done.events, unreadable + done.unreadable
                if done.failed_at is not None:
                    self.checkpoint += next(i for i, r in enumerate(batch) if r.position == done.failed_at)
                    return Published(events, unreadable, failed_at=done.failed_at)
                self.checkpoint += len(batch)
        return Published(events, unreadable)

    def replay(self, *, since: int = 0) -> None:
        """Move the checkpoint back (a consumer that read the same records again)."""
        with self._lock:
            self.checkpoint = min(self.checkpoint, since)
