"""template.yaml for job logs and the stored bootstrap: one log group of the stack, written only by
its instances and only there; the bootstrap written by launchers, read (never written) by instances.

moto does not evaluate these policies (aws-round2.md section 1d): they are asserted as data.
"""

from __future__ import annotations

from typing import Any

from gpujobs import contract
from gpujobs_local.template import as_list, function_properties, load_template, properties

CLOUDWATCH_RETENTION_DAYS = [1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557]
CLOUDWATCH_RETENTION_DAYS += [2922, 3288, 3653]
"""What PutRetentionPolicy accepts (botocore's `Days` shape)."""
GROUP_ARN = "arn:${AWS::Partition}:logs:${AWS::Region}:${AWS::AccountId}:log-group:${JobLogGroup}"


def _instance_statements() -> list[dict[str, Any]]:
    (policy,) = properties("InstanceRole")["Policies"]
    return list(policy["PolicyDocument"]["Statement"])


def _granting(statements: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    plain = [s for s in statements if "Fn::If" not in s]  # conditional statements (the EBS key's) grant no S3
    return [s for s in plain if s["Effect"] == "Allow" and any(a.startswith(prefix) for a in as_list(s["Action"]))]


def test_the_job_log_group_is_named_for_the_stack_and_kept_as_long_as_the_parameter_says() -> None:
    group = properties("JobLogGroup")
    parameter = load_template()["Parameters"]["JobLogRetentionDays"]

    assert group["LogGroupName"] == {"Fn::Sub": contract.job_log_group("${AWS::StackName}")}
    assert group["RetentionInDays"] == {"Ref": "JobLogRetentionDays"}
    assert parameter["AllowedValues"] == CLOUDWATCH_RETENTION_DAYS
    assert parameter["Default"] == 30


def test_the_launch_function_and_the_cli_are_told_the_group() -> None:
    outputs = load_template()["Outputs"]

    assert function_properties("SubmitFunction")["Environment"]["Variables"]["JOB_LOG_GROUP"] == {"Ref": "JobLogGroup"}
    assert outputs["JobLogGroupName"]["Value"] == {"Ref": "JobLogGroup"}


def test_instances_may_only_create_streams_and_put_events_in_the_job_log_group() -> None:
    (statement,) = _granting(_instance_statements(), "logs:")

    assert sorted(as_list(statement["Action"])) == ["logs:CreateLogStream", "logs:PutLogEvents"]
    assert as_list(statement["Resource"]) == [{"Fn::Sub": GROUP_ARN}, {"Fn::Sub": f"{GROUP_ARN}:log-stream:*"}]


def test_instances_read_the_stored_bootstrap_and_only_launchers_write_it() -> None:
    bootstrap_objects = f"${{CheckpointBucket.Arn}}/{contract.BOOTSTRAP_OBJECT_PREFIX}*"
    reads = [
        s for s in _granting(_instance_statements(), "s3:") if {"Fn::Sub": bootstrap_objects} in as_list(s["Resource"])
    ]
    launch = properties("LaunchPolicy")["PolicyDocument"]["Statement"]
    writes = [s for s in _granting(launch, "s3:") if {"Fn::Sub": bootstrap_objects} in as_list(s["Resource"])]
    (job_policy,) = properties("JobRole")["Policies"]

    assert [as_list(s["Action"]) for s in reads] == [["s3:GetObject"]]
    assert [as_list(s["Action"]) for s in writes] == [["s3:PutObject"]]
    assert contract.BOOTSTRAP_OBJECT_PREFIX not in str(job_policy)  # the job's own prefix is jobs/<id>/ only
