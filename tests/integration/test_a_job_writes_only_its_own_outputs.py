"""A job's credentials write its own `outputs/<team>/<job-id>/` and nothing else there; outputs never expire.

Proofs as in test_job_isolation_policies.py: the job role's statement is *enforced on moto* (IAM on,
the session tag substituted as IAM does), the session policy and the tag-scoped resource are
*asserted on the rendered documents* (moto ignores session policies and policy variables).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws
from moto.core import set_initial_no_auth_action_count

from gpujobs.contract import outputs_prefix
from gpujobs.domain.job_access import outputs_uri, session_policy
from gpujobs_local.template import policy_statements

pytestmark = pytest.mark.integration

BUCKET = "ckpt"


def _statement(sid: str) -> dict[str, Any]:
    (found,) = [s for s in policy_statements("JobRole") if isinstance(s, dict) and s.get("Sid") == sid]
    return found


def test_the_job_role_may_write_and_never_read_or_delete_its_own_outputs() -> None:
    outputs = _statement("WriteOwnJobOutputs")

    assert outputs["Resource"] == {
        "Fn::Sub": "${CheckpointBucket.Arn}/outputs/${!aws:PrincipalTag/gpujobs:team}/${!aws:PrincipalTag/gpujobs:job-id}/*"
    }
    assert set(outputs["Action"]) == {"s3:PutObject", "s3:AbortMultipartUpload"}


def test_a_session_policy_names_only_its_own_jobs_outputs() -> None:
    policy = session_policy(bucket=BUCKET, job_id="j-a", team="vision")
    (outputs,) = [s for s in policy["Statement"] if "outputs/" in json.dumps(s["Resource"])]

    assert outputs["Resource"] == f"arn:aws:s3:::{BUCKET}/outputs/vision/j-a/*"
    assert set(outputs["Action"]) == {"s3:PutObject", "s3:AbortMultipartUpload"}
    assert (
        outputs_uri(bucket=BUCKET, job_id="j-a", team="vision")
        == f"s3://{BUCKET}/{outputs_prefix('j-a', team='vision')}"
    )


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        yield


def _outputs_policy_for(job_id: str, team: str = "vision") -> dict[str, Any]:
    """The role's outputs statement as IAM applies it to a session tagged with `job_id` and `team`."""
    statement = dict(_statement("WriteOwnJobOutputs"))
    resource = statement["Resource"]["Fn::Sub"]
    statement["Resource"] = (
        resource.replace("${CheckpointBucket.Arn}", f"arn:aws:s3:::{BUCKET}")
        .replace("${!aws:PrincipalTag/gpujobs:job-id}", job_id)
        .replace("${!aws:PrincipalTag/gpujobs:team}", team)
    )
    return {"Version": "2012-10-17", "Statement": [statement]}


@set_initial_no_auth_action_count(8)
def test_on_moto_a_jobs_credentials_write_its_outputs_and_no_other_jobs(aws: None) -> None:
    # Given job B's outputs and job A's role, set up in the 8 calls moto leaves unchecked
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key="outputs/vision/j-b/model.safetensors", Body=b"b's weights")
    iam = boto3.client("iam")
    iam.create_user(UserName="instance")
    iam.put_user_policy(
        UserName="instance",
        PolicyName="assume",
        PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole", "Resource": "*"}]}
        ),
    )
    key = iam.create_access_key(UserName="instance")["AccessKey"]
    trust = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:AssumeRole"}],
    }
    role = iam.create_role(RoleName="job-j-a", AssumeRolePolicyDocument=json.dumps(trust))["Role"]
    iam.put_role_policy(RoleName="job-j-a", PolicyName="job", PolicyDocument=json.dumps(_outputs_policy_for("j-a")))

    # When job A's bootstrap uploads with its session
    sts = boto3.client("sts", aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"])
    creds = sts.assume_role(RoleArn=role["Arn"], RoleSessionName="gpujobs-j-a-a1")["Credentials"]
    job_a = boto3.client(
        "s3",
        aws_access_key_id=creds["AccessKeyId"],
        aws_secret_access_key=creds["SecretAccessKey"],
        aws_session_token=creds["SessionToken"],
    )

    # Then its own outputs are written ...
    job_a.put_object(Bucket=BUCKET, Key="outputs/vision/j-a/model.safetensors", Body=b"a's weights")
    # ... and job B's outputs can be neither overwritten nor read, its own not read back
    for attempt in (
        lambda: job_a.put_object(Bucket=BUCKET, Key="outputs/vision/j-b/model.safetensors", Body=b"poisoned"),
        lambda: job_a.get_object(Bucket=BUCKET, Key="outputs/vision/j-b/model.safetensors"),
        lambda: job_a.get_object(Bucket=BUCKET, Key="outputs/vision/j-a/model.safetensors"),
    ):
        with pytest.raises(ClientError) as denied:
            attempt()
        assert denied.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
