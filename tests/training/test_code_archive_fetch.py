"""Fetching the spec's `code:` archive: S3 failing for a moment is not the user's configuration.

A real boto3 S3 client whose responses come from botocore's Stubber, so the download runs through
boto3's transfer manager and botocore's error parsing as on an instance. (A stubbed response skips
botocore's own retries: what is left to see is the fetch's own bounded retry.)
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.response import StreamingBody
from botocore.stub import Stubber

from gpujobs_trainer.code_archive import CodeArchiveError, CodeFetchUnavailableError, fetch
from gpujobs_trainer.errors import ConfigError

URI = "s3://team-bucket/code/train.tar.gz"
BODY = b"the job's code archive"
DIGEST = hashlib.sha256(BODY).hexdigest()


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Stubber]]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    client = boto3.client("s3", region_name="us-east-1")
    with Stubber(client) as stubber:
        yield client, stubber


def _fails(stubber: Stubber, code: str, status: int) -> None:
    stubber.add_client_error("head_object", service_error_code=code, http_status_code=status)


def _serves(stubber: Stubber) -> None:
    stubber.add_response("head_object", {"ContentLength": len(BODY), "ETag": '"e"'})
    body = StreamingBody(io.BytesIO(BODY), len(BODY))
    stubber.add_response("get_object", {"Body": body, "ContentLength": len(BODY), "ETag": '"e"'})


@pytest.mark.parametrize(("code", "status"), [("SlowDown", 503), ("InternalError", 500), ("RequestTimeout", 400)])
def test_a_transient_s3_error_is_retried_and_the_archive_fetched(
    tmp_path: Path, s3: tuple[Any, Stubber], code: str, status: int
) -> None:
    client, stubber = s3
    _fails(stubber, code, status)
    _fails(stubber, code, status)
    _serves(stubber)
    pauses: list[float] = []

    archive = fetch(URI, DIGEST, tmp_path, s3=client, sleep=pauses.append)

    assert archive.read_bytes() == BODY
    assert pauses == [2.0, 4.0]
    stubber.assert_no_pending_responses()


def test_s3_failing_on_every_try_is_not_a_configuration_error(tmp_path: Path, s3: tuple[Any, Stubber]) -> None:
    client, stubber = s3
    for _ in range(3):
        _fails(stubber, "SlowDown", 503)

    with pytest.raises(CodeFetchUnavailableError, match="3 tries") as raised:
        fetch(URI, DIGEST, tmp_path, s3=client, attempts=3, sleep=lambda _: None)

    assert not isinstance(raised.value, ConfigError)  # the launcher exits 1 (retried), not 78


@pytest.mark.parametrize(("code", "status"), [("NoSuchKey", 404), ("404", 404), ("AccessDenied", 403)])
def test_an_archive_that_is_not_there_or_not_readable_is_the_users_configuration(
    tmp_path: Path, s3: tuple[Any, Stubber], code: str, status: int
) -> None:
    client, stubber = s3
    _fails(stubber, code, status)
    pauses: list[float] = []

    with pytest.raises(CodeArchiveError, match="cannot read the code archive"):
        fetch(URI, DIGEST, tmp_path, s3=client, sleep=pauses.append)

    assert pauses == []  # one try: another would fail the same way


def test_bytes_of_another_digest_are_the_users_configuration(tmp_path: Path, s3: tuple[Any, Stubber]) -> None:
    client, stubber = s3
    _serves(stubber)
    with pytest.raises(CodeArchiveError, match="has SHA-256"):
        fetch(URI, "0" * 64, tmp_path, s3=client, sleep=lambda _: None)


class FlakyNetwork:
    """An S3 client whose connection fails ``failures`` times before the download goes through."""

    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures

    def download_file(self, bucket: str, key: str, filename: str) -> None:
        if self.failures:
            raise self.failures.pop(0)
        Path(filename).write_bytes(BODY)


def _client_error(code: str, status: int) -> Exception:
    from botocore.exceptions import ClientError

    response: Any = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return ClientError(response, "HeadObject")


def test_connection_errors_and_the_instances_own_expired_credentials_are_retried(tmp_path: Path) -> None:
    from botocore.exceptions import EndpointConnectionError, ReadTimeoutError

    failures: list[Exception] = [
        EndpointConnectionError(endpoint_url="https://team-bucket.s3.amazonaws.com"),
        ReadTimeoutError(endpoint_url="https://team-bucket.s3.amazonaws.com"),
        ConnectionResetError("reset by peer"),
        _client_error("ExpiredToken", 400),  # the instance role's session, refreshed on the next try
    ]
    pauses: list[float] = []

    archive = fetch(URI, DIGEST, tmp_path, s3=FlakyNetwork(failures), sleep=pauses.append)

    assert archive.read_bytes() == BODY
    assert pauses == [2.0, 4.0, 8.0, 16.0]
