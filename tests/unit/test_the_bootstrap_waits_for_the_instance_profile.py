"""The bootstrap's own AWS calls wait for the instance profile's credentials.

Right after a launch IMDS may answer slowly, or not serve the instance profile yet. botocore's
defaults give IMDS one try of one second, and a replacement gang's node 0 failed its first call (the
rendezvous' DescribeInstances) with NoCredentialsError on a loaded host: its gang exited and the
job took a third attempt for nothing (the local cloud's two-node story in CI).
"""

from __future__ import annotations

from collections.abc import Iterator

import boto3
import pytest

from gpujobs.instance import aws
from gpujobs.instance.credentials import instance_identity_signer
from gpujobs_local.imds import FakeImds, instance_role_metadata

ROLE = "gpujobs-instance-role"
KEYS = {"AccessKeyId": "ASIAINSTANCEROLE", "SecretAccessKey": "secret", "SessionToken": "token"}


@pytest.fixture
def imds(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeImds]:
    """An IMDS serving the instance profile's session, and an environment with no other credentials
    (and a fresh default boto3 session, which the bootstrap's calls use: put back after)."""
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    for name in ("AWS_METADATA_SERVICE_TIMEOUT", "AWS_METADATA_SERVICE_NUM_ATTEMPTS", "AWS_EC2_METADATA_DISABLED"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    server = FakeImds(metadata=instance_role_metadata(ROLE, {**KEYS, "Expiration": "2099-01-01T00:00:00Z"})).start()
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", server.endpoint)
    yield server
    server.close()


def test_credentials_that_imds_serves_only_on_a_later_try_are_found(imds: FakeImds) -> None:
    imds.credentials_missing_for = 3
    credentials = aws.instance_session().get_credentials()
    assert credentials is not None
    assert credentials.get_frozen_credentials().access_key == KEYS["AccessKeyId"]
    assert aws.client("ec2", "us-east-1")._request_signer._credentials.access_key == KEYS["AccessKeyId"]


def test_botocores_defaults_alone_give_up_on_them(imds: FakeImds) -> None:
    """What the bootstrap did before: one try, and no credentials."""
    imds.credentials_missing_for = 3
    assert boto3.Session(region_name="us-east-1").get_credentials() is None


def test_the_identity_proof_is_signed_with_credentials_served_late(imds: FakeImds) -> None:
    imds.credentials_missing_for = 2
    proof = instance_identity_signer("us-east-1")("job-session")
    assert f"Credential={KEYS['AccessKeyId']}/" in proof["headers"]["Authorization"]


def test_the_environment_may_ask_for_more_patience_never_less(imds: FakeImds, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_METADATA_SERVICE_NUM_ATTEMPTS", "1")
    monkeypatch.setenv("AWS_METADATA_SERVICE_TIMEOUT", "30")
    core = aws.instance_session()._session
    assert core.get_config_variable("metadata_service_num_attempts") == aws.METADATA_SERVICE_ATTEMPTS
    assert core.get_config_variable("metadata_service_timeout") == 30
