"""IAM in template.yaml: the launch policy enforces the launch template's promises, and each
function may do only what its reactions do.

Before, every function shared one LauncherPolicy: the budget parser could launch instances and read
anything a launcher can, and RunInstances was allowed with any instance type, image, network
interface or volume settings, from any launch template. These checks read the rendered template
(moto does not evaluate IAM conditions, aws-round2.md section 1d): the policy documents are asserted
as data here; that real IAM honours each condition key on RunInstances is for the deployed stack
(docs/security.md).
"""

from __future__ import annotations

from typing import Any

import pytest

from gpujobs_local.template import as_list, function_properties, properties, resources_of_type

LAUNCHERS = {"SubmitFunction", "SpotFunction", "InstanceStateFunction", "ReportsFunction", "ReconcilerFunction"}
NOT_LAUNCHERS = {"IdleFunction", "BudgetFunction"}
ACCOUNT_ARN = "arn:${AWS::Partition}:ec2:${AWS::Region}:${AWS::AccountId}"


def _statements_of_policy(logical_id: str) -> list[dict[str, Any]]:
    """The policy's statements; one behind a condition (`Fn::If` with `AWS::NoValue`) as if it held."""
    found = properties(logical_id)["PolicyDocument"]["Statement"]
    statements = [found] if isinstance(found, dict) else list(found)
    return [s["Fn::If"][1] if "Fn::If" in s else s for s in statements]


def _statements_of_function(logical_id: str) -> list[dict[str, Any]]:
    managed = resources_of_type("AWS::IAM::ManagedPolicy")
    statements: list[dict[str, Any]] = []
    for policy in properties(logical_id).get("Policies", []):
        if isinstance(policy, dict) and policy.get("Ref") in managed:
            statements += _statements_of_policy(policy["Ref"])
        elif isinstance(policy, dict) and "Statement" in policy:
            statements += as_list(policy["Statement"])
    return statements


def _allows(statements: list[dict[str, Any]], action: str) -> list[dict[str, Any]]:
    return [s for s in statements if s["Effect"] == "Allow" and action in as_list(s["Action"])]


def _run_instances_on(resource_type: str) -> dict[str, Any]:
    """The one RunInstances statement of LaunchPolicy whose resource is `resource_type`."""
    (statement,) = [
        s
        for s in _allows(_statements_of_policy("LaunchPolicy"), "ec2:RunInstances")
        if any(f":{resource_type}/" in str(r) for r in as_list(s["Resource"]))
    ]
    return statement


def test_instances_launch_only_from_the_stacks_template_with_imdsv2_and_an_allowed_type() -> None:
    condition = _run_instances_on("instance")["Condition"]

    assert condition["ArnEquals"]["ec2:LaunchTemplate"] == {
        "Fn::Sub": f"{ACCOUNT_ARN}:launch-template/${{InstanceLaunchTemplate}}"
    }
    assert condition["StringEquals"]["ec2:MetadataHttpTokens"] == "required"
    assert condition["StringEquals"]["ec2:InstanceType"] == {"Ref": "AllowedInstanceTypes"}
    assert condition["StringEquals"]["aws:RequestTag/gpujobs:stack"] == {"Ref": "AWS::StackName"}


def test_volumes_are_created_only_encrypted_and_tagged() -> None:
    condition = _run_instances_on("volume")["Condition"]

    assert condition["Bool"] == {"ec2:Encrypted": "true"}
    assert condition["StringEquals"]["aws:RequestTag/gpujobs:stack"] == {"Ref": "AWS::StackName"}


def test_network_interfaces_never_get_a_public_ip_and_a_gang_of_several_may_omit_the_key() -> None:
    """Several interfaces (EFA) cannot carry AssociatePublicIpAddress at all, so the key is absent and
    a plain Bool refused every multi-node EFA launch; IfExists admits it and still refuses "true"."""
    assert _run_instances_on("network-interface")["Condition"] == {
        "BoolIfExists": {"ec2:AssociatePublicIpAddress": "false"}
    }


def test_images_launch_only_from_the_allowed_owners() -> None:
    assert _run_instances_on("image")["Condition"] == {"StringEquals": {"ec2:Owner": {"Ref": "AllowedAmiOwners"}}}
    assert properties("InstanceLaunchTemplate")["LaunchTemplateData"]["ImageId"] == {
        "Fn::Sub": "resolve:ssm:${AmiParameter}"
    }


def test_every_resource_a_launch_creates_or_chooses_is_conditioned() -> None:
    unconditioned = [
        r
        for s in _allows(_statements_of_policy("LaunchPolicy"), "ec2:RunInstances")
        if "Condition" not in s
        for r in as_list(s["Resource"])
    ]

    for kind in ("instance/", "volume/", "image/", "network-interface/"):
        assert not [r for r in unconditioned if kind in str(r)], kind


@pytest.mark.parametrize("function", sorted(NOT_LAUNCHERS))
def test_the_budget_and_idle_functions_cannot_launch_or_read_the_report_secret(function: str) -> None:
    statements = _statements_of_function(function)

    for action in ("ec2:RunInstances", "iam:PassRole", "ec2:CreatePlacementGroup", "secretsmanager:GetSecretValue"):
        assert not _allows(statements, action), (function, action)
    assert "REPORT_SECRET_ARN" not in function_properties(function)["Environment"]["Variables"]


def test_the_budget_function_cannot_manage_alarms_or_write_to_the_bucket_and_stops_only_the_stacks_instances() -> None:
    """It stops jobs on a breach: a checkpoint first (SendCommand), or, for a job that saves its own
    files, the instances at once; that stop was refused in an account before StopPolicy (the call
    ledger, tests/integration/test_every_call_is_allowed.py, found it)."""
    statements = _statements_of_function("BudgetFunction")

    for action in ("cloudwatch:PutMetricAlarm", "s3:PutObject", "ec2:DeletePlacementGroup", "ec2:DeleteSecurityGroup"):
        assert not _allows(statements, action), action
    assert _allows(statements, "ssm:SendCommand")  # it asks for a checkpoint before a budget stop
    for action in ("ec2:TerminateInstances", "ec2:StopInstances"):
        (stop,) = _allows(statements, action)
        assert stop["Condition"] == {"StringEquals": {"aws:ResourceTag/gpujobs:stack": {"Ref": "AWS::StackName"}}}


def test_only_functions_that_launch_or_verify_reports_read_the_report_secret() -> None:
    readers = {
        logical_id
        for logical_id in resources_of_type("AWS::Serverless::Function")
        if _allows(_statements_of_function(logical_id), "secretsmanager:GetSecretValue")
    }

    assert readers == LAUNCHERS
    for logical_id in readers:
        (read,) = _allows(_statements_of_function(logical_id), "secretsmanager:GetSecretValue")
        assert read["Resource"] == {"Ref": "ReportSecret"}
        assert function_properties(logical_id)["Environment"]["Variables"]["REPORT_SECRET_ARN"] == {
            "Ref": "ReportSecret"
        }


def test_the_report_secret_is_generated_by_the_stack_and_no_instance_may_read_it() -> None:
    secret = properties("ReportSecret")
    instance_statements = _statements_of_function_or_role("InstanceRole")

    assert secret["GenerateSecretString"]["PasswordLength"] >= 32
    assert "SecretString" not in secret
    assert not _allows(instance_statements, "secretsmanager:GetSecretValue")
    assert not _allows(instance_statements, "ec2:DescribeInstanceAttribute")  # user data holds the keys


def _statements_of_function_or_role(logical_id: str) -> list[dict[str, Any]]:
    statements: list[dict[str, Any]] = []
    for policy in properties(logical_id).get("Policies", []):
        statements += as_list(policy["PolicyDocument"]["Statement"])
    return statements


def test_job_security_groups_are_created_tagged_and_changed_or_deleted_only_when_ours() -> None:
    launch, end = _statements_of_policy("LaunchPolicy"), _statements_of_policy("EndPolicy")
    stack_tag = {"Ref": "AWS::StackName"}

    created = [s for s in _allows(launch, "ec2:CreateSecurityGroup") if ":security-group/" in str(s["Resource"])]
    (authorize,) = _allows(launch, "ec2:AuthorizeSecurityGroupIngress")
    (delete,) = _allows(end, "ec2:DeleteSecurityGroup")

    assert [s["Condition"]["StringEquals"]["aws:RequestTag/gpujobs:stack"] for s in created] == [stack_tag]
    assert authorize["Condition"]["StringEquals"]["aws:ResourceTag/gpujobs:stack"] == stack_tag
    assert delete["Condition"]["StringEquals"]["aws:ResourceTag/gpujobs:stack"] == stack_tag
    assert not _allows(launch + end, "ec2:AuthorizeSecurityGroupEgress")  # egress stays as the stack's group has it


def test_the_spot_drill_role_is_fis_s_in_this_account_and_interrupts_only_the_stacks_instances() -> None:
    """`gpujobs interrupt` starts an AWS FIS experiment that runs as SpotDrillRole (docs/deploy.md
    "Drills"): it may send spot interruptions to this stack's instances only, and do nothing else
    but list instances (FIS resolves targets with DescribeInstances, which takes no resource)."""
    role = properties("SpotDrillRole")
    (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "fis.amazonaws.com"}
    assert trust["Action"] == "sts:AssumeRole"
    assert trust["Condition"] == {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}}
    statements = [s for policy in role["Policies"] for s in as_list(policy["PolicyDocument"]["Statement"])]
    assert {a for s in statements for a in as_list(s["Action"])} == {
        "ec2:SendSpotInstanceInterruptions",
        "ec2:DescribeInstances",
    }
    (interrupt,) = _allows(statements, "ec2:SendSpotInstanceInterruptions")
    assert interrupt["Resource"] == {"Fn::Sub": f"{ACCOUNT_ARN}:instance/*"}
    assert interrupt["Condition"] == {"StringEquals": {"aws:ResourceTag/gpujobs:stack": {"Ref": "AWS::StackName"}}}
    assert all(s["Effect"] == "Allow" for s in statements)
