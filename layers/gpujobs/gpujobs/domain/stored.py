"""The validation-context flag of a record read back from the store (`domain.records`).

A rule that tightens what a submission may say (a new required field, a newly refused value) is a
rule for new submissions: a job the previous release accepted is still read, and its record still
written back. Such validators ask `is_stored_record(info.context)` and let a stored record pass.
"""

from __future__ import annotations

STORED_RECORD = "stored_record"


def is_stored_record(context: object) -> bool:
    """Whether a validator runs on a record read from the store rather than on a submission."""
    return isinstance(context, dict) and bool(context.get(STORED_RECORD))
