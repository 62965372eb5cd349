"""The jobs table's stream, as Lambda hands its records to the Publisher function.

Each record of a job item becomes a `StreamedWrite` (old and new image, read as the store reads an
item); a record of any other item (an instance's index item, the budget book) or a removal is
nothing to publish (None). A record whose images this release cannot read, or that lacks an image
the NEW_AND_OLD_IMAGES view always carries, is an `UnreadableWrite`: skipped with its reason,
because reading it again would not make it readable.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpujobs.adapters.dynamodb import JOB_SK, job_of_item
from gpujobs.service.outbox import StreamedWrite, StreamRecord, UnreadableWrite
from gpujobs.service.ports import UnreadableJobError

WRITES = frozenset({"INSERT", "MODIFY"})


def stream_record(record: Mapping[str, Any]) -> StreamRecord:
    """What one record of a DynamoDB stream event says of a job (see the module docstring)."""
    change = record.get("dynamodb") or {}
    keys = change.get("Keys") or {}
    if (keys.get("sk") or {}).get("S") != JOB_SK or record.get("eventName") not in WRITES:
        return None
    position = str(change.get("SequenceNumber", ""))
    key = str((keys.get("pk") or {}).get("S", "?"))
    new, old = change.get("NewImage"), change.get("OldImage")
    if new is None or (old is None and record.get("eventName") == "MODIFY"):
        return UnreadableWrite(position, key, "the record lacks an image: the stream's view must be NEW_AND_OLD_IMAGES")
    try:
        return StreamedWrite(position, job_of_item(old) if old is not None else None, job_of_item(new))
    except UnreadableJobError as exc:
        return UnreadableWrite(position, exc.job_id, exc.problem)
