"""Report keys derived from the stack's report secret in Secrets Manager (`domain.report_auth`).

The secret is read only when a key is first needed: a function that neither launches nor verifies
reports never reads it (and its role may not). Keys are derived on demand and never stored or logged.

**Rotation.** The secret has two versions that matter, by Secrets Manager's staging labels:
`AWSCURRENT`, under which every launch derives its attempt's key, and `AWSPREVIOUS`, the version it
replaced. An attempt keeps the key its user data was given for its whole life, so an attempt
launched before a rotation signs with a key of the previous version: a report is accepted under
either version's key while the previous version's grace lasts (`grace` after the current version
was created, its `CreatedDate`), then only under the current one.

A Lambda container caches what it read. It reads again when its copy is older than
`SECRET_MAX_AGE` (so a launch derives from the new version within minutes of a rotation), and at
once when a report's signature matches no key it holds (`refresh`): the report may come from an
attempt that a fresher container launched under the new version. That re-read happens at most once
per `REFRESH_AT_MOST_EVERY`, so a flood of forged reports costs at most one call a minute.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from botocore.exceptions import ClientError

from gpujobs.domain.report_auth import checkpoint_key, report_key

CURRENT, PREVIOUS = "AWSCURRENT", "AWSPREVIOUS"
DEFAULT_GRACE = timedelta(days=7)
"""How long after a rotation the previous version's keys still verify (`ReportSecretGraceHours`)."""
SECRET_MAX_AGE = timedelta(minutes=10)
REFRESH_AT_MOST_EVERY = timedelta(minutes=1)


class SecretsClient(Protocol):
    """The one Secrets Manager call used here (boto3's client satisfies it)."""

    def get_secret_value(self, *, SecretId: str, VersionStage: str) -> Mapping[str, Any]: ...  # noqa: N803 - boto3's


@dataclass(frozen=True)
class SecretVersions:
    current: bytes
    current_since: datetime
    """When the current version was created: the previous version's grace runs from here."""
    previous: bytes | None
    """None until the secret was first rotated."""


class StackSecretReportKeys:
    def __init__(
        self,
        *,
        client: SecretsClient,
        secret_id: str,
        grace: timedelta = DEFAULT_GRACE,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._secret_id = secret_id
        self._grace = grace
        self._monotonic = monotonic
        self._versions: SecretVersions | None = None
        self._read_at = 0.0

    def key_for(self, *, job_id: str, attempt: int) -> bytes:
        """The attempt's key under the current version: what a launch puts in its user data."""
        return report_key(self._fresh().current, job_id=job_id, attempt=attempt)

    def checkpoint_key_for(self, *, job_id: str) -> bytes:
        """The job's checkpoint key (`domain.report_auth.checkpoint_key`), for every attempt's run document."""
        return checkpoint_key(self._fresh().current, job_id=job_id)

    def verifying_keys(self, *, job_id: str, attempt: int, now: datetime) -> Sequence[bytes]:
        """The current version's key, and the previous version's while its grace lasts."""
        versions = self._fresh()
        secrets = [versions.current]
        if versions.previous is not None and now < versions.current_since + self._grace:
            secrets.append(versions.previous)
        return [report_key(secret, job_id=job_id, attempt=attempt) for secret in secrets]

    def refresh(self) -> bool:
        """Read the secret again (unless it was read moments ago); True when a version changed."""
        if self._versions is not None and self._age() < REFRESH_AT_MOST_EVERY.total_seconds():
            return False
        before = self._versions
        return self._read() != before

    def _fresh(self) -> SecretVersions:
        if self._versions is None or self._age() >= SECRET_MAX_AGE.total_seconds():
            return self._read()
        return self._versions

    def _age(self) -> float:
        return self._monotonic() - self._read_at

    def _read(self) -> SecretVersions:
        current = self._client.get_secret_value(SecretId=self._secret_id, VersionStage=CURRENT)
        try:
            previous: bytes | None = self._value(
                self._client.get_secret_value(SecretId=self._secret_id, VersionStage=PREVIOUS)
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
                raise
            previous = None  # never rotated: no version holds the label
        created = current.get("CreatedDate")
        self._versions = SecretVersions(
            current=self._value(current),
            current_since=created if isinstance(created, datetime) else datetime.fromtimestamp(0, UTC),
            previous=previous,
        )
        self._read_at = self._monotonic()
        return self._versions

    @staticmethod
    def _value(response: Mapping[str, Any]) -> bytes:
        return str(response["SecretString"]).encode()
