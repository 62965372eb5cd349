"""A job's session goes only to an instance the jobs table lists in that job's live attempt.

Two kinds of proof, said per test:
* **moto** (the real credentials handler, the real launcher's records, moto's STS): moto answers
  GetCallerIdentity for the keys it issued, so an instance-role session named after the instance
  proves that instance, and any other key proves someone else. moto does not verify signatures:
  a forged signature is STS's to refuse, and here only the unsigned and unbound proofs are shown.
* **rendered policies** (template.yaml through SAM's translator, IAM's evaluation rules in
  tests/iam): the job role's trust policy no longer lets the instance role in, with any tags, and
  the instance role's own policies no longer allow assuming it. On the previous template (main
  before this change) both were allowed: any code holding the instance role became any job.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from gpujobs.adapters.dynamodb import DynamoJobStore
from gpujobs.contract import job_session_purpose
from gpujobs.domain.job_access import session_policy_json, session_tags
from gpujobs.domain.states import JobState
from gpujobs.instance.credentials import instance_identity_signer
from gpujobs.runtime import bootstrap as runtime_bootstrap
from gpujobs_local.stack import REGION, STACK, LambdaContext, MotoStack, load_function
from tests.iam.evaluate import Request, evaluate
from tests.iam.recorder import RECORDER
from tests.iam.stack_policies import Resolver, principal_policies, rendered

pytestmark = pytest.mark.integration

SPEC: dict[str, Any] = {
    "name": "vend",
    "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/gpujobs-train:1",
    "command": ["python", "train.py"],
    "instance_types": ["g5.xlarge"],
    "team": "vision",
}


@pytest.fixture
def stack(monkeypatch: pytest.MonkeyPatch) -> Iterator[MotoStack]:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "POWERTOOLS_TRACE_DISABLED": "true",
        "POWERTOOLS_METRICS_NAMESPACE": "GpuJobs",
        "POWERTOOLS_SERVICE_NAME": "gpujobs",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    with mock_aws():
        stack = MotoStack()
        for key, value in stack.env.items():
            monkeypatch.setenv(key, value)
        runtime_bootstrap.reset()
        try:
            yield stack
        finally:
            runtime_bootstrap.reset()


def _submit(stack: MotoStack, **overrides: Any) -> Any:
    stack.send({**SPEC, **overrides})
    stack.deliver(load_function("submit").handler)
    store = DynamoJobStore(table_name=stack.table, client=stack.ddb)
    return max(store.list_by_state(JobState.RUNNING), key=lambda j: j.created_at)


def _ask(job_id: str, attempt: int, proof: dict[str, Any]) -> dict[str, Any]:
    answer: dict[str, Any] = load_function("credentials").handler(
        {"job_id": job_id, "attempt": attempt, **proof}, LambdaContext()
    )
    return answer


def _proof(credentials: dict[str, Any] | None, *, job_id: str, attempt: int) -> dict[str, Any]:
    return instance_identity_signer(REGION, credentials)(job_session_purpose(STACK, job_id, attempt))


# ---- moto ---------------------------------------------------------------------------------------
def test_the_instance_the_record_lists_gets_a_session_with_the_records_tags_and_policy(stack: MotoStack) -> None:
    job = _submit(stack)
    (instance,) = job.instance_ids
    proof = _proof(stack.instance_credentials(instance), job_id=job.job_id, attempt=1)

    with RECORDER.collecting() as calls:
        answer = _ask(job.job_id, 1, proof)

    creds = answer["credentials"]
    as_job = boto3.client(
        "sts",
        region_name=REGION,
        aws_access_key_id=creds["AccessKeyId"],
        aws_secret_access_key=creds["SecretAccessKey"],
        aws_session_token=creds["SessionToken"],
    )
    assert as_job.get_caller_identity()["Arn"].endswith(f":assumed-role/{STACK}-JobRole/gpujobs-{job.job_id}-a1")
    (assumed,) = [c for c in calls if c.operation == "AssumeRole"]
    assert assumed.principal == "CredentialsFunction"
    assert {t["Key"]: t["Value"] for t in assumed.params["Tags"]} == session_tags(
        job_id=job.job_id, team="vision", attempt=1
    )
    assert assumed.params["Policy"] == session_policy_json(bucket=stack.bucket, job_id=job.job_id, team="vision")


def test_an_instance_of_job_a_asking_for_job_b_is_refused(stack: MotoStack) -> None:
    job_a, job_b = _submit(stack), _submit(stack)
    (instance_a,) = job_a.instance_ids
    creds = stack.instance_credentials(instance_a)

    answer = _ask(job_b.job_id, 1, _proof(creds, job_id=job_b.job_id, attempt=1))

    assert answer["refused"] == "not-in-attempt"
    assert instance_a in answer["detail"]
    assert not answer["retryable"]
    assert "credentials" not in answer


def test_an_instance_of_a_replaced_attempt_is_refused(stack: MotoStack) -> None:
    job = _submit(stack)
    (first,) = job.instance_ids
    spot = stack.eventbridge(
        "aws.ec2", "EC2 Spot Instance Interruption Warning", {"instance-id": first, "instance-action": "terminate"}
    )
    load_function("spot").handler(spot, LambdaContext())
    creds = stack.instance_credentials(first)

    replaced = _ask(job.job_id, 1, _proof(creds, job_id=job.job_id, attempt=1))
    not_its_own = _ask(job.job_id, 2, _proof(creds, job_id=job.job_id, attempt=2))

    assert replaced["refused"] == "attempt-replaced"
    assert not_its_own["refused"] == "not-in-attempt"


def test_a_finished_job_gets_no_session(stack: MotoStack) -> None:
    job = _submit(stack)
    (instance,) = job.instance_ids
    stack.send({"action": "cancel", "job_id": job.job_id})
    stack.deliver(load_function("submit").handler)
    gone = stack.eventbridge(
        "aws.ec2", "EC2 Instance State-change Notification", {"instance-id": instance, "state": "terminated"}
    )
    load_function("instance_state").handler(gone, LambdaContext())

    answer = _ask(job.job_id, 1, _proof(stack.instance_credentials(instance), job_id=job.job_id, attempt=1))

    assert answer["refused"] in ("job-ended", "attempt-over", "instance-gone")
    assert not answer["retryable"]


def test_a_caller_that_is_not_the_instance_role_is_refused(stack: MotoStack) -> None:
    job = _submit(stack)
    (instance,) = job.instance_ids
    # the account's own user, and a job session (what a container holds) asking for a fresh one
    vended = _ask(job.job_id, 1, _proof(stack.instance_credentials(instance), job_id=job.job_id, attempt=1))
    for creds in (None, vended["credentials"]):
        answer = _ask(job.job_id, 1, _proof(creds, job_id=job.job_id, attempt=1))

        assert answer["refused"] == "not-the-instance-role", answer
        assert "credentials" not in answer


def test_an_unsigned_or_unbound_proof_is_refused_before_sts_sees_it(stack: MotoStack) -> None:
    job, other = _submit(stack), _submit(stack)
    (instance,) = job.instance_ids
    proof = _proof(stack.instance_credentials(instance), job_id=job.job_id, attempt=1)
    unsigned = {**proof, "headers": {k: v for k, v in proof["headers"].items() if k != "Authorization"}}
    not_identity = {**proof, "body": "Action=AssumeRole&Version=2011-06-15"}

    assert _ask(job.job_id, 1, unsigned)["refused"] == "malformed-request"
    assert _ask(job.job_id, 1, not_identity)["refused"] == "malformed-request"
    # a proof made for one job is good for no other, and a caller's own headers cannot be added
    assert _ask(other.job_id, 1, proof)["refused"] == "malformed-request"
    assert _ask(job.job_id, 1, {"headers": {}, "body": "", "policy": "{}"})["refused"] == "malformed-request"


# ---- rendered policies -------------------------------------------------------------------------
def _trust(principal_arn: str, tags: dict[str, str], template_path: str | None = None) -> bool:
    """IAM's answer for `principal_arn` under JobRole's rendered trust policy (AssumeRole and TagSession)."""
    template = rendered() if template_path is None else rendered("{}", template_path)
    trust = Resolver(template, {}, {}).resolve(template["Resources"]["JobRole"]["Properties"])[
        "AssumeRolePolicyDocument"
    ]["Statement"]
    named = [{**s, "Resource": "*"} for s in trust if principal_arn in _as_list(s.get("Principal", {}).get("AWS", []))]
    context = {f"aws:requesttag/{k}".lower(): [v] for k, v in tags.items()} | {"aws:tagkeys": list(tags)}
    keys = {"aws:requesttag/*", "aws:tagkeys"}
    return all(
        evaluate(named, Request(action, "arn:aws:iam::123456789012:role/gpujobs-JobRole", context, keys)).allowed
        for action in ("sts:AssumeRole", "sts:TagSession")
    )


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


INSTANCE_ROLE = "arn:aws:iam::123456789012:role/gpujobs-InstanceRole"
FUNCTION_ROLE = "arn:aws:iam::123456789012:role/gpujobs-CredentialsFunctionRole"
ANOTHER_JOBS_TAGS = {"gpujobs:job-id": "victim", "gpujobs:team": "finance", "gpujobs:attempt": "1"}


def test_the_job_role_trusts_the_credentials_function_and_not_the_instance_role() -> None:
    assert not _trust(INSTANCE_ROLE, ANOTHER_JOBS_TAGS)
    assert _trust(FUNCTION_ROLE, ANOTHER_JOBS_TAGS)
    assert not _trust(FUNCTION_ROLE, {"gpujobs:job-id": "j"})  # still only with all three job tags


def test_the_instance_role_may_ask_for_a_session_but_not_assume_the_job_role() -> None:
    instance = principal_policies("InstanceRole", {})
    function = principal_policies("CredentialsFunction", {})
    job_role = "arn:aws:iam::123456789012:role/gpujobs-JobRole"
    context = {f"aws:requesttag/{k}".lower(): [v] for k, v in ANOTHER_JOBS_TAGS.items()}
    assume = Request("sts:AssumeRole", job_role, context, {"aws:requesttag/*", "aws:tagkeys"})
    invoke = Request(
        "lambda:InvokeFunction", "arn:aws:lambda:us-east-1:123456789012:function:gpujobs-CredentialsFunction"
    )

    assert not evaluate(instance, assume).allowed
    assert evaluate(function, assume).allowed
    assert evaluate(instance, invoke).allowed
    assert json.dumps(function).count('"Action"') <= 4  # GetItem, AssumeRole + TagSession, the managed basics
