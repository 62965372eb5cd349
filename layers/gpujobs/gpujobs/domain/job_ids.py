"""Job ids: deterministic, so a redelivered message or a resubmitted token maps to one job."""

from __future__ import annotations

import hashlib
import re

JOB_ID = re.compile(r"j-[0-9a-f]{16}")
"""What `job_id_for` produces: anything else names no job of ours."""


def job_id_for(*, client_token: str | None, team: str | None, message_id: str | None) -> str:
    """A deterministic job id, so that a redelivered message or a resubmitted token maps to one job.

    With a client_token the id depends on (team, token); otherwise on the SQS message id, which
    SQS keeps across redeliveries of the same message.
    """
    if client_token:
        key = f"token:{team or 'default'}:{client_token}"
    elif message_id:
        key = f"message:{message_id}"
    else:
        raise ValueError("a job id needs a client_token or a message id")
    return "j-" + hashlib.sha256(key.encode()).hexdigest()[:16]
