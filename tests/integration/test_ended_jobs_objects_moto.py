"""The ended jobs' objects sweep's two adapters on moto (`domain.retention`, issue 19 item 12).

The job store lists ended jobs whose objects are kept through the template's sparse `ByEnd` index,
oldest end first, and a job drops out of it once its objects are noted deleted; the blob store
empties one job's prefix on a versioned bucket, 1,000 keys a call, and nothing beside it.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from moto import mock_aws

from gpujobs.adapters.dynamodb import DynamoJobStore
from gpujobs.adapters.s3 import S3BlobStore
from gpujobs.domain.job import Job
from gpujobs.domain.spec import validate_spec
from gpujobs.domain.states import JobState, Reason
from gpujobs_local.template import table_definition

pytestmark = pytest.mark.integration

T0 = datetime(2026, 10, 1, 12, 0, tzinfo=UTC)
SPEC = {
    "name": "x",
    "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/t:1",
    "command": ["python", "t.py"],
    "instance_types": ["g5.xlarge"],
}


@pytest.fixture
def aws(aws_credentials: None) -> Iterator[None]:
    with mock_aws():
        yield


def stored(store: DynamoJobStore, job_id: str, *, ended_after_days: int | None) -> Job:
    job = store.create(Job.submitted(job_id=job_id, spec=validate_spec(SPEC), now=T0, message_id=job_id))
    if ended_after_days is None:
        return job
    end = T0 + timedelta(days=ended_after_days)
    return store.save(job.transition(JobState.CANCELLED, Reason.USER_CANCELLED, now=end))


def test_ended_jobs_are_listed_oldest_end_first_and_leave_the_index_once_noted(aws: None) -> None:
    ddb = boto3.client("dynamodb", region_name="us-east-1")
    ddb.create_table(**table_definition(table_name="jobs"))
    store = DynamoJobStore(table_name="jobs", client=ddb)
    stored(store, "j-active0000000001", ended_after_days=None)
    late = stored(store, "j-late000000000001", ended_after_days=9)
    stored(store, "j-early00000000001", ended_after_days=2)
    stored(store, "j-recent0000000001", ended_after_days=40)

    listed = store.list_ended(before=T0 + timedelta(days=30), limit=10)
    assert [j.job_id for j in listed] == ["j-early00000000001", "j-late000000000001"]
    assert [j.job_id for j in store.list_ended(before=T0 + timedelta(days=30), limit=1)] == ["j-early00000000001"]

    store.save(late.model_copy(update={"objects_deleted_at": T0 + timedelta(days=39)}))
    assert [j.job_id for j in store.list_ended(before=T0 + timedelta(days=60), limit=10)] == [
        "j-early00000000001",
        "j-recent0000000001",
    ]


def put(s3: Any, key: str) -> None:
    s3.put_object(Bucket="ckpt", Key=key, Body=b"x")


def test_a_jobs_prefix_is_emptied_in_calls_of_a_thousand_and_nothing_beside_it_is_touched(aws: None) -> None:
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="ckpt")
    s3.put_bucket_versioning(Bucket="ckpt", VersioningConfiguration={"Status": "Enabled"})
    for n in range(2_300):
        put(s3, f"jobs/j-1/ckpt/blobs/{n:05d}")
    kept = ["jobs/j-10/code/a.tar.gz", "outputs/vision/j-1/model.safetensors", "bootstrap/b.py"]
    for key in kept:
        put(s3, key)
    blobs = S3BlobStore(client=s3, bucket="ckpt")

    assert blobs.delete_prefix("jobs/j-1/", max_keys=1_500) is False  # 1,500 deleted, 800 left
    left = s3.list_objects_v2(Bucket="ckpt", Prefix="jobs/j-1/")["KeyCount"]
    assert blobs.delete_prefix("jobs/j-1/", max_keys=10_000) is True
    assert blobs.delete_prefix("jobs/j-1/", max_keys=10_000) is True  # nothing left: a rerun is harmless

    assert left == 800
    assert sorted(o["Key"] for o in s3.list_objects_v2(Bucket="ckpt").get("Contents", [])) == sorted(kept)
    versions = s3.list_object_versions(Bucket="ckpt", Prefix="jobs/j-1/ckpt/blobs/00000")
    assert len(versions["Versions"]) == 1  # recoverable until the noncurrent-version rule removes it
    with pytest.raises(ValueError, match="ends with '/'"):
        blobs.delete_prefix("jobs/j-1", max_keys=10)  # would reach jobs/j-10/ too
