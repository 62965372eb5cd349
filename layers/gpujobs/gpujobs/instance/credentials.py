"""Per-job credentials: the job role, assumed for this attempt with the document's session policy and tags.

The control plane renders the session policy and tags (`gpujobs.domain.job_access` says what they
allow); the bootstrap passes them to STS with the instance role, which may assume the job role and
nothing the job could use. Sessions last an hour and are renewed when less than `REFRESH_MARGIN` is
left as they are asked for, so the container (whose SDK refreshes with 15 minutes left) is never
handed credentials botocore would refetch on every call. The host agent (`hostagent.py`) serves them.
"""

from __future__ import annotations

import datetime as dt
import re
import threading
from typing import Any

from gpujobs.instance.aws import Clients, client
from gpujobs.instance.errors import BootstrapError

REFRESH_MARGIN = dt.timedelta(minutes=20)
UTC = dt.timezone.utc  # not `dt.UTC`: that is Python 3.11+, and an AMI's python3 may be 3.9


def assume_role_request(doc: dict[str, Any]) -> dict[str, Any]:
    """The `sts.assume_role` arguments for this attempt."""
    return {
        "RoleArn": doc["job_role_arn"],
        "RoleSessionName": re.sub(r"[^\w+=,.@-]", "-", f"gpujobs-{doc['job_id']}-a{doc['attempt']}")[:64],
        "DurationSeconds": 3600,
        "Policy": doc["session_policy"],
        "Tags": [{"Key": k, "Value": v} for k, v in sorted(doc["session_tags"].items())],
    }


class JobCredentials:
    """The attempt's job-role session, renewed on demand once less than `REFRESH_MARGIN` is left."""

    def __init__(self, sts: Any, doc: dict[str, Any], *, now: Any = None) -> None:
        self._sts, self._request = sts, assume_role_request(doc)
        self._now = now or (lambda: dt.datetime.now(UTC))
        self._lock = threading.Lock()
        self._current: dict[str, Any] | None = None

    def current(self) -> dict[str, Any]:
        """`{AccessKeyId, SecretAccessKey, SessionToken, Expiration}` with at least the margin left."""
        with self._lock:
            if self._current is None or self._current["Expiration"] - self._now() < REFRESH_MARGIN:
                try:
                    self._current = self._sts.assume_role(**self._request)["Credentials"]
                except Exception as exc:
                    raise BootstrapError(f"cannot assume the job role: {exc}") from exc
            return dict(self._current)

    def served(self) -> dict[str, str]:
        """The container-credentials endpoint's body (Expiration in UTC, ending in Z)."""
        creds = self.current()
        return {
            "AccessKeyId": creds["AccessKeyId"],
            "SecretAccessKey": creds["SecretAccessKey"],
            "Token": creds["SessionToken"],
            "Expiration": creds["Expiration"].astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }

    def clients(self, region: str) -> Clients:
        """Clients acting as the job: the bootstrap's reads of its checkpoints and secrets."""
        return lambda service: client(service, region, credentials=self.current())
