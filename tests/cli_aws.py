"""The environment a `gpujobs` CLI test on moto runs in: test credentials and region, no endpoint
or profile of the developer's own leaking in, every call answered by moto."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from moto import mock_aws


@contextmanager
def cli_on_moto(monkeypatch: pytest.MonkeyPatch, region: str) -> Iterator[None]:
    for key, value in {"AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t", "AWS_DEFAULT_REGION": region}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with mock_aws():
        yield
