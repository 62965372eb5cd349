"""How a job record is read and written across releases: older and newer records alike.

During an upgrade (or a rollback) two releases share one table for a while: the old release's
handlers keep running until their containers retire, a rollback puts them back. So every release
reads every record any neighbouring release writes:

- **Older records** lack the fields added since. Every field the record gained has a default, so
  they read as they are; a submission rule added since (say, `code_sha256` being required) is a
  rule for new submissions only: a stored spec is read with `STORED_RECORD` in the validation
  context, and those validators let it pass.
- **Newer records** carry fields this release does not know. They are read with
  `extra="allow"` (at every depth: the spec, the attempts, the history entries) and written back
  with them (`record_json`), so a read-modify-write by this release keeps what the newer one
  wrote. Submission still refuses unknown fields: only a stored record is read leniently.
- **`RECORD_SCHEMA_VERSION`** is stamped on the item by every write: the schema of the release
  that last wrote the record. A release that reads a lower number knows an older writer may have
  changed the fields both know while keeping the newer fields verbatim, and re-derives the newer
  ones from the shared fields rather than trusting them. Items written before the stamp existed
  read as version 1.

What still cannot be read is a value this release has no name for (a state or a reason a newer
release added): that record is unreadable here, and the store says so with its key
(`ports.UnreadableJobError`) instead of failing a whole listing.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from gpujobs.domain.job import Job
from gpujobs.domain.stored import STORED_RECORD

RECORD_SCHEMA_VERSION = 2
"""1: the records of releases before the stamp; 2: the stamp and lenient reads (this release)."""


def read_record(doc: str | bytes) -> Job:
    """A stored job document, whichever neighbouring release wrote it (pydantic's ValidationError
    when even that cannot be read)."""
    return Job.model_validate_json(doc, extra="allow", context={STORED_RECORD: True})


def record_json(job: Job, *, exclude: frozenset[str] = frozenset()) -> str:
    """The job as stored JSON, with every field a newer release added (and this one kept unread)."""
    data = job.model_dump(mode="json", exclude=set(exclude))
    return json.dumps(_with_extras(job, data), separators=(",", ":"), ensure_ascii=False)


def _with_extras(value: object, dumped: Any) -> Any:
    """`dumped` (the JSON form of `value`) with the unknown fields of every model inside it put back:
    pydantic keeps them on the model but leaves them out of its own dump."""
    if isinstance(value, BaseModel) and isinstance(dumped, dict):
        for name in type(value).model_fields:
            if name in dumped:
                dumped[name] = _with_extras(getattr(value, name), dumped[name])
        for name, extra in (value.model_extra or {}).items():
            dumped.setdefault(name, extra)
        return dumped
    if isinstance(value, list | tuple) and isinstance(dumped, list):
        return [_with_extras(item, out) for item, out in zip(value, dumped, strict=True)]
    if isinstance(value, dict) and isinstance(dumped, dict):
        return {key: _with_extras(value.get(key), out) for key, out in dumped.items()}
    return dumped
