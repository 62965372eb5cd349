"""Report keys derived from the stack's report secret in Secrets Manager (`domain.report_auth`).

The secret is read once per Lambda container, and only when a key is first needed: a function that
neither launches nor verifies reports never reads it (and its role may not). Keys are derived on
demand and never stored or logged.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Protocol

from gpujobs.domain.report_auth import checkpoint_key, report_key


class SecretsClient(Protocol):
    """The one Secrets Manager call used here (boto3's client satisfies it)."""

    def get_secret_value(self, *, SecretId: str) -> Mapping[str, Any]: ...  # noqa: N803 - boto3's name


class StackSecretReportKeys:
    def __init__(self, *, client: SecretsClient, secret_id: str) -> None:
        self._client = client
        self._secret_id = secret_id

    @functools.cached_property
    def _secret(self) -> bytes:
        return str(self._client.get_secret_value(SecretId=self._secret_id)["SecretString"]).encode()

    def key_for(self, *, job_id: str, attempt: int) -> bytes:
        return report_key(self._secret, job_id=job_id, attempt=attempt)

    def checkpoint_key_for(self, *, job_id: str) -> bytes:
        """The job's checkpoint key (`domain.report_auth.checkpoint_key`), for every attempt's run document."""
        return checkpoint_key(self._secret, job_id=job_id)
