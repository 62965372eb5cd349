"""The instance role holds what runs on the host, and no team's parameters or another namespace.

Before, InstanceRole attached AmazonSSMManagedInstanceCore (ssm:GetParameter(s) on every parameter,
each team's `gpujobs/<team>/...` included) and CloudWatchAgentServerPolicy (PutMetricData in any
namespace, the logs actions on every group). Whoever held the host's credentials could read every
team's parameters and post readings in any namespace.

Judged on the rendered template (SAM's translator, the stack's names) by the call ledger's own
evaluator (tests/iam): each call below is what the SSM agent, the CloudWatch agent or an attacker
on the host would send, turned into IAM requests by tests/iam/requests.py. moto does not evaluate
IAM conditions (aws-round2.md section 1d), so this is the proof; real IAM's honouring of
cloudwatch:namespace is for the deployed stack.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpujobs.instance.cloudwatch_agent import cloudwatch_agent_config
from tests.iam.check import judged
from tests.iam.evaluate import Request, evaluate
from tests.iam.recorder import Call
from tests.iam.requests import action_exists
from tests.iam.stack_policies import principal_policies, rendered

pytestmark = pytest.mark.integration

REGION = "us-east-1"
AGENT_NAMESPACE = cloudwatch_agent_config()["metrics"]["namespace"]
RUN_COMMAND = [
    "ssm:UpdateInstanceInformation",
    "ec2messages:GetEndpoint",
    "ec2messages:GetMessages",
    "ec2messages:AcknowledgeMessage",
    "ec2messages:SendReply",
    "ec2messages:DeleteMessage",
    "ec2messages:FailMessage",
    "ssmmessages:CreateControlChannel",
    "ssmmessages:OpenControlChannel",
    "ssmmessages:CreateDataChannel",
    "ssmmessages:OpenDataChannel",
]
"""What the SSM agent calls to register and to receive and answer a Run Command (checkpoint-now's
SendCommand) over either channel."""


def _host_call(service: str, operation: str, **params: Any) -> list[tuple[Request, bool, str]]:
    """IAM's answers for one call made with the instance role's credentials."""
    call = Call(
        principal="InstanceRole", service=service, operation=operation, region=REGION, params=params, binding={}
    )
    return judged(call)


def _statements() -> list[dict[str, Any]]:
    return principal_policies("InstanceRole", {"REGION": REGION})


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def test_the_instance_role_attaches_no_aws_managed_policy() -> None:
    role = rendered()["Resources"]["InstanceRole"]["Properties"]

    assert "ManagedPolicyArns" not in role
    every_action = [a for s in _statements() for a in _as_list(s["Action"])]
    unknown = [a for a in every_action if "*" not in a and not action_exists(a)]
    assert unknown == []


def test_gpu_metrics_are_published_only_in_the_agents_namespace() -> None:
    """Given the agent's config, when it publishes, then CWAgent is allowed and any other namespace refused."""
    (publish,) = [s for s in _statements() if "cloudwatch:PutMetricData" in _as_list(s["Action"])]
    assert publish["Condition"] == {"StringEquals": {"cloudwatch:namespace": AGENT_NAMESPACE}}

    datum = [{"MetricName": "nvidia_smi_utilization_gpu", "Dimensions": [{"Name": "InstanceId", "Value": "i-1"}]}]
    [(_, allowed, _)] = _host_call("cloudwatch", "PutMetricData", Namespace=AGENT_NAMESPACE, MetricData=datum)
    assert allowed
    for elsewhere in ("GpuJobs", "AWS/EC2", "CWAgent2"):
        [(_, allowed, why)] = _host_call("cloudwatch", "PutMetricData", Namespace=elsewhere, MetricData=datum)
        assert not allowed, elsewhere
        assert "no statement allows it" in why


def test_the_host_reads_no_parameter_and_never_a_teams() -> None:
    """When the host asks for a team's parameter (or any), IAM refuses; the teams' ones by an explicit Deny."""
    allows_get = [
        s
        for s in _statements()
        if s["Effect"] == "Allow" and any(a.lower().startswith("ssm:getparameter") for a in _as_list(s["Action"]))
    ]
    assert allows_get == []

    [(_, allowed, why)] = _host_call("ssm", "GetParameter", Name="/gpujobs/vision/hf-token")
    assert not allowed
    assert why == "explicitly denied by NeverReadTeamParameters"
    answers = _host_call("ssm", "GetParameters", Names=["/gpujobs/nlp/wandb", "/operator/setting"])
    assert [allowed for _, allowed, _ in answers] == [False, False]


def test_the_teams_parameters_stay_denied_even_if_someone_allows_every_parameter() -> None:
    """Given a later statement allowing ssm:GetParameter* on `*`, the Deny still wins for gpujobs/*."""
    widened = [*_statements(), {"Effect": "Allow", "Action": "ssm:GetParameter*", "Resource": "*"}]
    team = f"arn:aws:ssm:{REGION}:123456789012:parameter/gpujobs/vision/hf-token"

    for action in ("ssm:GetParameter", "ssm:GetParameters", "ssm:GetParametersByPath"):
        verdict = evaluate(widened, Request(action, team))
        assert (verdict.allowed, verdict.reason) == (False, "explicitly denied by NeverReadTeamParameters")
    assert evaluate(widened, Request("ssm:GetParameter", team.replace("/gpujobs/", "/operator/"))).allowed


def test_the_ssm_agent_still_receives_run_command_so_checkpoint_now_works() -> None:
    for action in RUN_COMMAND:
        verdict = evaluate(_statements(), Request(action, "*"))
        assert verdict.allowed, f"{action}: {verdict.reason}"


def test_the_host_writes_logs_only_to_the_stacks_job_log_group() -> None:
    logs = [s for s in _statements() if any(str(a).startswith("logs:") for a in _as_list(s["Action"]))]
    assert [s["Sid"] for s in logs] == ["ShipJobLogs"]
    assert all(":log-group:/gpujobs/gpujobs/jobs" in r for r in _as_list(logs[0]["Resource"]))

    [(_, allowed, _)] = _host_call(
        "logs", "PutLogEvents", logGroupName="/gpujobs/gpujobs/jobs", logStreamName="j-1/1/0", logEvents=[]
    )
    assert allowed
    [(_, allowed, _)] = _host_call(
        "logs", "PutLogEvents", logGroupName="/aws/lambda/other", logStreamName="s", logEvents=[]
    )
    assert not allowed
