"""What a job's container can touch, read from template.yaml and the session policy the control plane renders.

Two kinds of proof, said per test:
* **enforced on moto** (its IAM access control switched on): moto evaluates identity policies with
  real resource matching for S3, so a session whose policy names job A's prefix is refused job B's.
  moto ignores session policies, session tags and policy variables (`${aws:PrincipalTag/...}`) and
  matches other services' resources as `*` (../shared/reference/aws-round2.md §1d), so those tests
  render the role policy for one job, as IAM does when it substitutes the session tag;
* **asserted on the rendered documents**: the trust policy, the tag-scoped statements, secrets,
  events and the run-document grants, which moto cannot evaluate.
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

from gpujobs.contract import SECRET_NAME_PREFIX, TRAINER_SOURCE
from gpujobs.domain.job_access import (
    SessionPolicyTooLargeError,
    session_policy,
    session_policy_json,
    session_tags,
)
from gpujobs_local.template import as_list, policy_statements, properties

BUCKET = "ckpt"
JOB_PREFIX_VARIABLE = "${!aws:PrincipalTag/gpujobs:job-id}"


def _statement(logical_id: str, sid: str) -> dict[str, Any]:
    (found,) = [s for s in policy_statements(logical_id) if isinstance(s, dict) and s.get("Sid") == sid]
    return found


def _actions(statements: list[dict[str, Any]], effect: str = "Allow") -> set[str]:
    return {a for s in statements if isinstance(s, dict) and s.get("Effect") == effect for a in as_list(s["Action"])}


# ---- asserted on the rendered documents --------------------------------------------------------
def test_only_the_credentials_function_may_assume_the_job_role_and_only_with_the_job_tags() -> None:
    """Rendered: moto checks the principal of a trust policy but not sts:TagSession nor tag conditions.
    (tests/integration/test_job_sessions_are_vended_only_to_their_attempt.py evaluates it.)"""
    (trust,) = properties("JobRole")["AssumeRolePolicyDocument"]["Statement"]

    assert trust["Principal"] == {"AWS": {"Fn::GetAtt": ["CredentialsFunctionRole", "Arn"]}}
    assert set(trust["Action"]) == {"sts:AssumeRole", "sts:TagSession"}
    assert trust["Condition"]["ForAllValues:StringEquals"]["aws:TagKeys"] == [
        "gpujobs:job-id",
        "gpujobs:team",
        "gpujobs:attempt",
    ]
    assert set(trust["Condition"]["StringLike"]) == {
        f"aws:RequestTag/{k}" for k in session_tags(job_id="j", team="t", attempt=1)
    }


def test_the_job_role_reaches_only_its_own_prefix_its_teams_secrets_and_trainer_events() -> None:
    """Rendered: every grant of the job role is scoped by a session tag, the bus or the data buckets."""
    own = _statement("JobRole", "OwnJobPrefix")
    assert own["Resource"] == {"Fn::Sub": f"${{CheckpointBucket.Arn}}/jobs/{JOB_PREFIX_VARIABLE}/*"}
    listing = _statement("JobRole", "ListOwnJobPrefix")
    assert listing["Condition"] == {"StringLike": {"s3:prefix": ["jobs/${aws:PrincipalTag/gpujobs:job-id}/*"]}}
    events = _statement("JobRole", "TrainerEvents")
    assert events["Condition"] == {"StringEquals": {"events:source": TRAINER_SOURCE}}
    assert events["Resource"] == {"Fn::GetAtt": ["JobsEventBus", "Arn"]}
    for sid in ("TeamSecrets", "TeamParameters"):
        resource = _statement("JobRole", sid)["Resource"]["Fn::Sub"]
        assert resource.endswith(f"{SECRET_NAME_PREFIX}${{!aws:PrincipalTag/gpujobs:team}}/*"), resource

    allowed = _actions(policy_statements("JobRole")) | _actions(
        [s["Fn::If"][1] for s in policy_statements("JobRole") if "Fn::If" in s]
    )
    assert allowed == {
        "s3:GetObject",
        "s3:PutObject",
        "s3:DeleteObject",
        "s3:AbortMultipartUpload",
        "s3:ListBucket",
        "events:PutEvents",
        "secretsmanager:GetSecretValue",
        "ssm:GetParameter",
    }
    assert "ManagedPolicyArns" not in properties("JobRole")


def test_no_job_may_write_a_run_document_and_instances_may_only_read_them() -> None:
    """Rendered: the instance role's only bucket grant is GetObject on run documents; the job role denies writing them."""
    deny = _statement("JobRole", "NeverWriteRunDocuments")
    assert deny["Effect"] == "Deny"
    assert set(deny["Action"]) == {"s3:PutObject", "s3:DeleteObject"}
    assert deny["Resource"] == {"Fn::Sub": "${CheckpointBucket.Arn}/jobs/*/attempt-*/run.json"}

    instance = policy_statements("InstanceRole")
    s3_actions = {a for a in _actions(instance) if a.startswith("s3:")}
    assert s3_actions == {"s3:GetObject"}
    assert _statement("InstanceRole", "ReadRunDocuments")["Resource"] == deny["Resource"]


def test_the_instance_role_publishes_only_exit_events() -> None:
    """Rendered: no AWS-managed policy (test_instance_role_least_privilege.py); PutEvents is bound to the bootstrap's source."""
    assert "ManagedPolicyArns" not in properties("InstanceRole")
    exits = _statement("InstanceRole", "PublishExitEvents")
    assert exits["Condition"] == {"StringEquals": {"events:source": "gpujobs.instance"}}
    (ask,) = properties("InstanceAsksForJobSessions")["PolicyDocument"]["Statement"]
    assert (ask["Action"], ask["Resource"]) == ("lambda:InvokeFunction", {"Fn::GetAtt": ["CredentialsFunction", "Arn"]})


def test_a_session_policy_names_only_its_job_its_team_and_its_teams_data_buckets() -> None:
    """Rendered: moto ignores session policies, so what they say is checked here."""
    policy = session_policy(bucket=BUCKET, job_id="j-a", team="vision", data_buckets=["vision-data"])
    resources = json.dumps([s["Resource"] for s in policy["Statement"]])

    assert "arn:aws:s3:::ckpt/jobs/j-a/*" in resources
    assert "jobs/*" not in resources
    assert "j-b" not in resources
    assert "gpujobs/vision/*" in resources
    assert "arn:aws:s3:::vision-data/*" in resources
    assert all(s["Effect"] == "Allow" for s in policy["Statement"])


def test_a_session_policy_over_the_sts_limit_is_refused_before_launch() -> None:
    with pytest.raises(SessionPolicyTooLargeError):
        session_policy_json(bucket=BUCKET, job_id="j-a", team="t", data_buckets=[f"b-{i:040d}" for i in range(40)])


# ---- enforced on moto ---------------------------------------------------------------------------
@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        yield


def _role_policy_for(job_id: str) -> dict[str, Any]:
    """The job role's S3 statements as IAM applies them to a session tagged with `job_id`."""
    text = json.dumps([_statement("JobRole", sid) for sid in ("OwnJobPrefix", "ListOwnJobPrefix")])
    text = text.replace(JOB_PREFIX_VARIABLE, job_id).replace("${aws:PrincipalTag/gpujobs:job-id}", job_id)
    text = text.replace("${CheckpointBucket.Arn}", f"arn:aws:s3:::{BUCKET}")
    statements = json.loads(text)
    for statement in statements:
        if isinstance(statement["Resource"], dict):
            statement["Resource"] = statement["Resource"].get("Fn::Sub", f"arn:aws:s3:::{BUCKET}")
    return {"Version": "2012-10-17", "Statement": statements}


@set_initial_no_auth_action_count(8)
def test_on_moto_a_jobs_credentials_cannot_read_or_plant_in_another_jobs_checkpoints(aws: None) -> None:
    """Enforced on moto: with IAM on, job A's session reads its own prefix and is refused job B's."""
    # Given two jobs' checkpoints and job A's role, set up in the 8 calls moto leaves unchecked
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key="jobs/j-a/ckpt/step-00000001/COMMIT.json", Body=b"{}")
    s3.put_object(Bucket=BUCKET, Key="jobs/j-b/ckpt/step-00000001/COMMIT.json", Body=b"{}")
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
    iam.put_role_policy(RoleName="job-j-a", PolicyName="job", PolicyDocument=json.dumps(_role_policy_for("j-a")))

    # When job A's container acts with its session
    sts = boto3.client("sts", aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"])
    creds = sts.assume_role(RoleArn=role["Arn"], RoleSessionName="gpujobs-j-a-a1", **_tags("j-a"))["Credentials"]
    job_a = boto3.client(
        "s3",
        aws_access_key_id=creds["AccessKeyId"],
        aws_secret_access_key=creds["SecretAccessKey"],
        aws_session_token=creds["SessionToken"],
    )

    # Then its own prefix is readable and writable ...
    assert job_a.get_object(Bucket=BUCKET, Key="jobs/j-a/ckpt/step-00000001/COMMIT.json")["Body"].read() == b"{}"
    job_a.put_object(Bucket=BUCKET, Key="jobs/j-a/ckpt/step-00000002/COMMIT.json", Body=b"{}")
    # ... and job B's is neither readable nor writable (no planted step-N/ in the victim's prefix)
    for attempt in (
        lambda: job_a.get_object(Bucket=BUCKET, Key="jobs/j-b/ckpt/step-00000001/COMMIT.json"),
        lambda: job_a.put_object(Bucket=BUCKET, Key="jobs/j-b/ckpt/step-00000009/.metadata", Body=b"x"),
    ):  # listing is scoped by an s3:prefix condition, which moto does not evaluate: asserted above
        with pytest.raises(ClientError) as denied:
            attempt()
        assert denied.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


def _tags(job_id: str) -> dict[str, Any]:
    return {"Tags": [{"Key": k, "Value": v} for k, v in session_tags(job_id=job_id, team="vision", attempt=1).items()]}
