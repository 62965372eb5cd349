"""A job's checkpoint key: derived per job from the stack secret, handed to every attempt's
container beside the report key (user data only), and the key the trainer signs checkpoints with.

The trainer side (signing and verifying markers and manifests with it) is tested in
tests/training; here: the derivation, and the way from the run document to the container.
"""

from __future__ import annotations

import hashlib
import io
import json
from typing import Any

from gpujobs.domain.report_auth import checkpoint_key, report_key
from gpujobs.domain.rundoc import RunDocument, RunDocumentPointer
from gpujobs.instance import rundoc
from gpujobs.instance.workload_env import container_env
from gpujobs_fakes.memory import FixedReportKeys
from gpujobs_trainer.signing import CHECKPOINT_KEY_ENV, checkpoint_key_from_env

SECRET = b"a stack secret"
JOB, OTHER = "j-0123456789abcdef", "j-fedcba9876543210"


def _document(**fields: Any) -> RunDocument:
    return RunDocument(
        job_id=JOB,
        attempt=3,
        name="n",
        image="train:1",
        command=["python", "train.py"],
        checkpoint_uri=f"s3://bucket/jobs/{JOB}/ckpt",
        **fields,
    )


def test_a_checkpoint_key_is_one_per_job_and_no_report_key() -> None:
    key = checkpoint_key(SECRET, job_id=JOB)
    assert key == checkpoint_key(SECRET, job_id=JOB)  # every attempt derives the same one
    assert key != checkpoint_key(SECRET, job_id=OTHER)
    assert key != checkpoint_key(b"another stack", job_id=JOB)
    assert all(key != report_key(SECRET, job_id=JOB, attempt=n) for n in range(5))
    assert FixedReportKeys(SECRET).checkpoint_key_for(job_id=JOB) == key


def test_the_container_gets_the_jobs_checkpoint_key_as_the_trainer_reads_it() -> None:
    key = checkpoint_key(SECRET, job_id=JOB)
    doc = rundoc.check_document(_document(checkpoint_key=key.hex(), report_key="00" * 32).model_dump(mode="json"))

    env = container_env(doc, rank=0, master_addr="10.0.0.1", instance_id="i-0123456789abcdef0", region="us-east-1")

    assert checkpoint_key_from_env(env) == key
    assert CHECKPOINT_KEY_ENV not in container_env(
        rundoc.check_document(_document().model_dump(mode="json")),
        rank=0,
        master_addr="10.0.0.1",
        instance_id="i-0123456789abcdef0",
        region="us-east-1",
    )
    assert "checkpoint_key" not in repr(_document(checkpoint_key=key.hex()))


class _S3:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def get_object(self, *, Bucket: str, Key: str) -> dict[str, Any]:  # noqa: N803 - boto3's names
        return {"Body": io.BytesIO(self.body)}


def test_an_offloaded_document_takes_its_keys_from_user_data_never_from_s3() -> None:
    key = checkpoint_key(SECRET, job_id=JOB).hex()
    doc = _document(checkpoint_key=key, report_key="00" * 32)
    body = doc.model_dump_json(exclude={"report_key", "checkpoint_key"}).encode()
    pointer = RunDocumentPointer.for_stored(f"s3://bucket/jobs/{JOB}/attempt-3/run.json", body, doc=doc)
    assert pointer.checkpoint_key == key
    # a document in S3 that names a key of its own (swapped, or written by another job) does not win
    swapped = json.dumps({**json.loads(body), "checkpoint_key": "ff" * 32}).encode()
    raw = pointer.model_dump_json().encode()

    loaded = rundoc.load_document(
        raw.replace(pointer.run_document_sha256.encode(), hashlib.sha256(swapped).hexdigest().encode()),
        lambda: _S3(swapped),
        {},
    )

    assert loaded["checkpoint_key"] == key
