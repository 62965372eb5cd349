"""The launcher stores the bootstrap once per content, and the user data it renders pins that object."""

from __future__ import annotations

import gzip
import hashlib
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from gpujobs.adapters.s3 import S3BlobStore
from gpujobs.domain.rundoc import RunDocument
from gpujobs.instance.userdata import bootstrap_bundle, bootstrap_key
from gpujobs.runtime.bootstrap import StoredBootstrapUserData

pytestmark = pytest.mark.integration

BUCKET = "gpujobs-checkpoints"
DOC = RunDocument(
    job_id="j-0123456789abcdef",
    attempt=1,
    name="demo",
    image="r/i:1",
    command=["python", "train.py"],
    checkpoint_uri=f"s3://{BUCKET}/jobs/j-0123456789abcdef/ckpt",
)


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        client.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
        yield client


def renderer(s3: Any) -> StoredBootstrapUserData:
    """What one Lambda container wires."""
    return StoredBootstrapUserData(S3BlobStore(client=s3, bucket=BUCKET), bucket=BUCKET, region="us-east-1")


def test_launches_from_many_containers_store_one_object_which_their_user_data_pins(s3: Any) -> None:
    first, second = renderer(s3), renderer(s3)

    user_data = [first(DOC), first(DOC), second(DOC)]

    versions = s3.list_object_versions(Bucket=BUCKET, Prefix="bootstrap/")["Versions"]
    assert [v["Key"] for v in versions] == [bootstrap_key()]
    stored = s3.get_object(Bucket=BUCKET, Key=bootstrap_key())["Body"].read()
    assert stored == bootstrap_bundle()
    digest = hashlib.sha256(stored).hexdigest()
    for raw in user_data:
        text = (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode()
        assert f'SHA256 = "{digest}"' in text
        assert f'KEY = "{bootstrap_key()}"' in text


def test_an_object_already_at_the_key_is_left_alone_for_the_loader_to_judge(s3: Any) -> None:
    s3.put_object(Bucket=BUCKET, Key=bootstrap_key(), Body=b"planted")

    renderer(s3)(DOC)

    assert s3.get_object(Bucket=BUCKET, Key=bootstrap_key())["Body"].read() == b"planted"
