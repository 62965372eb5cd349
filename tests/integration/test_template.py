"""What template.yaml promises: a lint-clean stack whose defaults are the secure ones.

The first group reads the template as data and checks the properties an operator relies on (IMDSv2,
encryption, no public IPs, tag-scoped IAM, every event-driven function retried and dead-lettered). The second group, marked ``integration``, builds moto
resources from the template's own definitions, so the fakes other tests use cannot drift from the
stack. What moto cannot check (IAM conditions are not evaluated) is covered by the first group only
as a shape check; docs/deploy.md says how to verify it against real IAM.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from gpujobs.domain.launching import LAUNCH_LEASE
from gpujobs.runtime.observability import RECORD_TOO_LARGE_METRIC
from gpujobs_local.template import (
    TEMPLATE_PATH,
    as_list,
    function_properties,
    launch_template_data,
    load_template,
    parameter_default,
    policy_statements,
    properties,
    queue_attributes,
    queue_dead_letter_logical_id,
    queue_redrive_max_receive_count,
    queue_visibility_timeout,
    resource,
    resources_of_type,
    table_definition,
    table_index_names,
)

STACK = "gpujobs-test"
DOCS_EVENTS = TEMPLATE_PATH.parent / "docs" / "events.md"
EVENT_FUNCTIONS = {
    "SpotFunction": "functions/spot/",
    "InstanceStateFunction": "functions/instance_state/",
    "ReportsFunction": "functions/reports/",
    "IdleFunction": "functions/idle/",
    "BudgetFunction": "functions/budget/",
    "ReconcilerFunction": "functions/reconciler/",
}
"""Functions driven by the cloud's events (and the clock); each may launch, stop or signal instances."""
LAUNCHERS = ("SubmitFunction", "SpotFunction", "InstanceStateFunction", "ReportsFunction", "ReconcilerFunction")
"""Functions whose reactions may launch an attempt (and so also end one, and manage its alarms)."""
SIGNALLERS = ("SpotFunction", "IdleFunction", "BudgetFunction", "ReconcilerFunction")
"""Functions whose reactions may ask a container to checkpoint now."""
TAG_KEYS_THE_LAUNCHER_WRITES = {
    "gpujobs:stack",
    "gpujobs:job-id",
    "gpujobs:attempt",
    "gpujobs:generation",
    "gpujobs:team",
    "Name",
}
ENV_THE_SETTINGS_READ = {
    "JOBS_TABLE",
    "EVENT_BUS_NAME",
    "CHECKPOINT_BUCKET",
    "JOBS_QUEUE_URL",
    "LAUNCH_TEMPLATE_ID",
    "SECURITY_GROUP_ID",
    "SUBNET_IDS",
    "ALLOWED_INSTANCE_TYPES",
    "GPUJOBS_STACK_NAME",
    "CHECKPOINT_DOCUMENT",
}
OUTPUTS_THE_CLI_READS = {
    "JobsQueueUrl",
    "JobsDeadLetterQueueUrl",
    "JobsTableName",
    "EventBusName",
    "CheckpointBucketName",
    "LaunchTemplateId",
    "InstanceRoleArn",
    "SubmitFunctionName",
    "BudgetAlertsTopicArn",
    "CheckpointNowDocumentName",
    "ShellDocumentName",
    "ExecDocumentName",
    "SpotDrillRoleArn",
}


def _walk(value: Any) -> Iterator[tuple[str, Any]]:
    """Every (key, value) pair anywhere in a nested structure."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield key, item
            yield from _walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item)


def _managed_policy_statements(logical_id: str) -> list[dict[str, Any]]:
    """The policy's statements; one behind a condition (`Fn::If` with `AWS::NoValue`) as if it held."""
    found = properties(logical_id)["PolicyDocument"]["Statement"]
    statements = [found] if isinstance(found, dict) else list(found)
    return [s["Fn::If"][1] if "Fn::If" in s else s for s in statements]


def _managed_policies_of(function: str) -> list[str]:
    """The stack's own managed policies a function attaches with `Policies: [!Ref X]`."""
    managed = resources_of_type("AWS::IAM::ManagedPolicy")
    return [
        p["Ref"] for p in properties(function).get("Policies", []) if isinstance(p, dict) and p.get("Ref") in managed
    ]


def _function_statements(function: str) -> list[dict[str, Any]]:
    """What a function's role may do: its inline statements plus those of the stack's managed policies it uses."""
    inline = policy_statements(function)
    return inline + [s for policy in _managed_policies_of(function) for s in _managed_policy_statements(policy)]


def _all_statements() -> list[tuple[str, dict[str, Any]]]:
    owners = {**resources_of_type("AWS::Serverless::Function"), **resources_of_type("AWS::IAM::Role")}
    inline = [(logical_id, s) for logical_id in owners for s in policy_statements(logical_id)]
    managed = [
        (logical_id, s)
        for logical_id in resources_of_type("AWS::IAM::ManagedPolicy")
        for s in _managed_policy_statements(logical_id)
    ]
    return inline + managed


def _allowing(statements: list[dict[str, Any]], action: str) -> list[dict[str, Any]]:
    return [s for s in statements if s["Effect"] == "Allow" and action in as_list(s.get("Action", []))]


def _event_sources(function: str, event_type: str) -> dict[str, dict[str, Any]]:
    return {
        name: event["Properties"]
        for name, event in properties(function).get("Events", {}).items()
        if event["Type"] == event_type
    }


def _resources_text(statement: dict[str, Any]) -> str:
    return repr(as_list(statement.get("Resource", [])))


# --------------------------------------------------------------------------------------- lint
def test_cfn_lint_reports_no_errors_and_no_warnings() -> None:
    cfn_lint = Path(sys.executable).parent / "cfn-lint"
    result = subprocess.run(
        [str(cfn_lint), str(TEMPLATE_PATH)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------------------- instances
def test_launch_template_requires_imdsv2_with_a_hop_limit_of_2_for_containers() -> None:
    metadata = properties("InstanceLaunchTemplate")["LaunchTemplateData"]["MetadataOptions"]

    assert metadata["HttpTokens"] == "required"
    assert metadata["HttpEndpoint"] == "enabled"
    assert metadata["HttpPutResponseHopLimit"] == 2


def test_root_volume_is_encrypted_gp3_and_goes_away_with_the_instance() -> None:
    data = properties("InstanceLaunchTemplate")["LaunchTemplateData"]
    (root,) = data["BlockDeviceMappings"]

    assert root["DeviceName"] == "/dev/sda1"
    assert root["Ebs"] == {
        "VolumeType": "gp3",
        "VolumeSize": {"Ref": "RootVolumeGiB"},
        "Iops": {"Ref": "RootVolumeIops"},
        "Throughput": {"Ref": "RootVolumeThroughputMiBps"},
        "Encrypted": True,
        "KmsKeyId": {"Fn::If": ["HasEbsKmsKey", {"Ref": "EbsKmsKeyArn"}, {"Ref": "AWS::NoValue"}]},
        "DeleteOnTermination": True,
    }
    assert data["InstanceInitiatedShutdownBehavior"] == "terminate"


def test_the_root_volume_where_checkpoints_stage_without_an_instance_store_is_raised_to_gp3s_maximum() -> None:
    parameters = load_template()["Parameters"]

    assert parameters["RootVolumeIops"]["Default"] == 16000
    assert parameters["RootVolumeThroughputMiBps"]["Default"] == 1000
    assert parameters["RootVolumeThroughputMiBps"]["Default"] * 4 <= parameters["RootVolumeIops"]["Default"]


def test_instances_get_no_ssh_key_and_no_public_ip_anywhere_in_the_stack() -> None:
    template = load_template()
    pairs = list(_walk(template["Resources"]))

    assert not [v for k, v in pairs if k == "KeyName"]
    assert not [v for k, v in pairs if k in {"AssociatePublicIpAddress", "MapPublicIpOnLaunch"} and v is not False]
    assert "NetworkInterfaces" not in properties("InstanceLaunchTemplate")["LaunchTemplateData"]


def test_launch_template_tags_everything_a_launch_creates_with_the_stack() -> None:
    """Instances, volumes, network interfaces and spot requests: each is billed, so each carries the
    stack's cost-allocation tag; the template itself too."""
    props = properties("InstanceLaunchTemplate")
    specs = props["LaunchTemplateData"]["TagSpecifications"]

    tagged = {s["ResourceType"]: {t["Key"]: t["Value"] for t in s["Tags"]} for s in specs}
    stack_tag = {"gpujobs:stack": {"Ref": "AWS::StackName"}}
    assert tagged == {
        "instance": stack_tag,
        "volume": stack_tag,
        "network-interface": stack_tag,
        "spot-instances-request": stack_tag,
    }
    assert props["TagSpecifications"] == [
        {"ResourceType": "launch-template", "Tags": [{"Key": "gpujobs:stack", "Value": {"Ref": "AWS::StackName"}}]}
    ]


def test_image_is_resolved_from_an_ssm_parameter_at_launch() -> None:
    data = properties("InstanceLaunchTemplate")["LaunchTemplateData"]

    assert data["ImageId"] == {"Fn::Sub": "resolve:ssm:${AmiParameter}"}


def test_security_group_admits_only_its_own_members() -> None:
    """The stack's group admits nothing: peers are admitted by each job's own group, which the
    launcher creates (tests/service/test_gangs_of_different_jobs_cannot_reach_each_other.py), so a
    stack-wide self-ingress no longer lets every job reach every other job's instances."""
    group = properties("InstanceSecurityGroup")
    ingress = resources_of_type("AWS::EC2::SecurityGroupIngress")

    assert "SecurityGroupIngress" not in group
    assert list(ingress) == []


# ---------------------------------------------------------------------------- functions
def test_every_function_runs_python312_on_arm64_with_the_shared_layer() -> None:
    functions = resources_of_type("AWS::Serverless::Function")

    assert functions, "template.yaml has no functions"
    for logical_id in functions:
        props = function_properties(logical_id)
        assert props["Runtime"] == "python3.12", logical_id
        assert props["Architectures"] == ["arm64"], logical_id
        assert {"Ref": "GpujobsLayer"} in props["Layers"], logical_id
        assert props["Tracing"] == "Active", logical_id


def test_every_function_gets_the_settings_and_powertools_environment() -> None:
    for logical_id in resources_of_type("AWS::Serverless::Function"):
        variables = function_properties(logical_id)["Environment"]["Variables"]

        assert set(variables) >= ENV_THE_SETTINGS_READ, logical_id
        assert variables["POWERTOOLS_SERVICE_NAME"] == "gpujobs"
        assert variables["POWERTOOLS_METRICS_NAMESPACE"] == "GpuJobs"


def test_layer_is_built_for_python312_on_arm64() -> None:
    layer = resource("GpujobsLayer")

    assert layer["Type"] == "AWS::Serverless::LayerVersion"
    assert layer["Properties"]["ContentUri"] == "layers/gpujobs/"
    assert layer["Properties"]["CompatibleRuntimes"] == ["python3.12"]
    assert layer["Properties"]["CompatibleArchitectures"] == ["arm64"]
    # layers/gpujobs/Makefile: SAM's python3.12 install of requirements.txt, then the bytecode
    assert layer["Metadata"] == {"BuildMethod": "makefile", "BuildArchitecture": "arm64"}


def test_submit_function_reports_partial_batch_failures_in_batches_of_10() -> None:
    props = function_properties("SubmitFunction")
    (event,) = props["Events"].values()

    assert (props["CodeUri"], props["Handler"]) == ("functions/submit/", "app.handler")
    assert event["Type"] == "SQS"
    assert event["Properties"]["Queue"] == {"Fn::GetAtt": ["JobsQueue", "Arn"]}
    assert event["Properties"]["BatchSize"] == 10
    assert event["Properties"]["FunctionResponseTypes"] == ["ReportBatchItemFailures"]


# ------------------------------------------------------------------------------- queue
def test_queue_hides_a_message_for_at_least_six_function_timeouts() -> None:
    timeout = function_properties("SubmitFunction")["Timeout"]

    assert queue_visibility_timeout("JobsQueue") >= 6 * timeout
    assert "FifoQueue" not in properties("JobsQueue")


# How long a batch of submissions may take, written down (template.yaml says the same above SubmitFunction).
SUBNETS_ASSUMED = 3
MARKETS = 2
SECONDS_PER_REFUSED_RUNG = 1.0
"""A refused RunInstances (InsufficientInstanceCapacity and kin) answers in well under a second."""
SECONDS_FOR_THE_LAUNCH = 5.0
"""A gang's RunInstances returns once its instances are pending: a few seconds at most."""
SECONDS_OF_BOOKKEEPING = 4.0
"""Per message: the job's conditional writes, the run document in S3, the state events."""


def test_submit_outlasts_a_full_ladder_walk_for_every_message_of_a_batch() -> None:
    props = function_properties("SubmitFunction")
    (event,) = props["Events"].values()
    types = len(parameter_default("AllowedInstanceTypes").split(","))
    rungs = types * SUBNETS_ASSUMED * MARKETS
    per_message = (rungs - 1) * SECONDS_PER_REFUSED_RUNG + SECONDS_FOR_THE_LAUNCH + SECONDS_OF_BOOKKEEPING

    assert props["Timeout"] >= event["Properties"]["BatchSize"] * per_message
    assert props["Timeout"] <= 900  # Lambda's documented maximum


def test_queue_hides_a_message_for_six_submit_timeouts_as_aws_advises() -> None:
    assert queue_visibility_timeout("JobsQueue") == 6 * function_properties("SubmitFunction")["Timeout"]
    assert queue_visibility_timeout("JobsQueue") <= 43_200  # SQS's maximum


def test_the_launch_lease_outlasts_every_launching_function_and_expires_before_a_redelivery() -> None:
    launching = [
        logical_id
        for logical_id, _ in resources_of_type("AWS::Serverless::Function").items()
        if "LaunchPolicy" in _managed_policies_of(logical_id)
    ]

    assert "SubmitFunction" in launching
    for logical_id in launching:
        assert LAUNCH_LEASE.total_seconds() > function_properties(logical_id)["Timeout"], logical_id
    assert LAUNCH_LEASE.total_seconds() < queue_visibility_timeout("JobsQueue")


def test_a_job_record_refused_for_its_size_raises_an_alarm_on_the_metric_the_handlers_emit() -> None:
    alarm = properties("JobRecordTooLargeAlarm")
    globals_env = load_template()["Globals"]["Function"]["Environment"]["Variables"]

    assert alarm["MetricName"] == RECORD_TOO_LARGE_METRIC
    assert alarm["Namespace"] == globals_env["POWERTOOLS_METRICS_NAMESPACE"]
    assert alarm["Dimensions"] == [{"Name": "service", "Value": globals_env["POWERTOOLS_SERVICE_NAME"]}]
    assert (alarm["Statistic"], alarm["Threshold"], alarm["ComparisonOperator"]) == ("Sum", 0, "GreaterThanThreshold")
    assert alarm["TreatMissingData"] == "notBreaching"
    assert alarm["AlarmActions"] == [{"Fn::If": ["HasAlarmTopic", {"Ref": "AlarmTopicArn"}, {"Ref": "AlarmTopic"}]}]


def test_a_message_failing_5_times_lands_in_an_encrypted_dlq_that_raises_an_alarm() -> None:
    dlq = queue_dead_letter_logical_id("JobsQueue")
    alarm = properties("JobsDeadLetterAlarm")

    assert queue_redrive_max_receive_count("JobsQueue") == 5
    assert dlq == "JobsDeadLetterQueue"
    assert properties(dlq)["MessageRetentionPeriod"] == 14 * 24 * 3600
    assert properties("JobsQueue")["SqsManagedSseEnabled"] is True
    assert properties(dlq)["SqsManagedSseEnabled"] is True
    assert alarm["MetricName"] == "ApproximateNumberOfMessagesVisible"
    assert alarm["Dimensions"] == [{"Name": "QueueName", "Value": {"Fn::GetAtt": [dlq, "QueueName"]}}]
    assert (alarm["ComparisonOperator"], alarm["Threshold"]) == ("GreaterThanThreshold", 0)


# ------------------------------------------------------------------------------- state
def test_table_has_point_in_time_recovery_encryption_and_its_three_indexes() -> None:
    table = resource("JobsTable")

    assert table["Type"] == "AWS::DynamoDB::Table"
    assert table["Properties"]["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    assert table["Properties"]["SSESpecification"] == {"SSEEnabled": True}
    assert table["Properties"]["BillingMode"] == "PAY_PER_REQUEST"
    assert table_index_names() == ["ByState", "ByInstance", "ByEnd"]


def test_checkpoint_bucket_is_private_encrypted_and_tls_only() -> None:
    bucket = properties("CheckpointBucket")
    (policy,) = resources_of_type("AWS::S3::BucketPolicy").values()
    statements = policy["Properties"]["PolicyDocument"]["Statement"]

    assert set(bucket["PublicAccessBlockConfiguration"].values()) == {True}
    assert len(bucket["PublicAccessBlockConfiguration"]) == 4
    assert bucket["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert policy["Properties"]["Bucket"] == {"Ref": "CheckpointBucket"}
    assert any(
        s["Effect"] == "Deny" and s["Principal"] == "*" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
        for s in statements
    )


def test_no_rule_expires_current_objects_the_reconciler_deletes_ended_jobs_after_the_retention_parameter() -> None:
    """A rule counts from each object's creation: it expired a running job's unchanged blobs and its
    code archive (issue 19, item 12). An ended job's prefix goes by the reconciler, from its end."""
    rules = properties("CheckpointBucket")["LifecycleConfiguration"]["Rules"]
    reconciler = properties("ReconcilerFunction")
    indexes = {i["IndexName"]: i for i in properties("JobsTable")["GlobalSecondaryIndexes"]}

    assert not [r for r in rules if "ExpirationInDays" in r or "ExpirationDate" in r]
    assert reconciler["Environment"]["Variables"]["CHECKPOINT_RETENTION_DAYS"] == {"Ref": "CheckpointRetentionDays"}
    assert parameter_default("CheckpointRetentionDays") == 30
    assert [k["AttributeName"] for k in indexes["ByEnd"]["KeySchema"]] == ["objects_kept", "ended_at"]
    statements = {s["Sid"]: s for p in reconciler["Policies"] if isinstance(p, dict) for s in p.get("Statement", [])}
    assert statements["DeleteEndedJobsObjects"]["Resource"] == {"Fn::Sub": "${CheckpointBucket.Arn}/jobs/*"}
    assert statements["ListEndedJobsObjects"]["Condition"] == {"StringLike": {"s3:prefix": "jobs/*"}}


def test_replaced_versions_go_after_a_day_everywhere_and_so_do_uploads_cut_short() -> None:
    """A rotated checkpoint is a noncurrent version: kept 30 days, a 7B job's came to ~$3.7k a month."""
    rules = properties("CheckpointBucket")["LifecycleConfiguration"]["Rules"]
    (everywhere,) = [r for r in rules if "Prefix" not in r and "Filter" not in r]
    parameter = load_template()["Parameters"]["NoncurrentVersionRetentionDays"]

    assert everywhere["Status"] == "Enabled"
    assert everywhere["NoncurrentVersionExpiration"] == {"NoncurrentDays": {"Ref": "NoncurrentVersionRetentionDays"}}
    assert (parameter["Default"], parameter["MinValue"]) == (1, 1)
    assert everywhere["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 1}
    assert everywhere["ExpiredObjectDeleteMarker"] is True
    assert not [r for r in rules if "NoncurrentVersionExpiration" in r and r is not everywhere]


def test_outputs_include_everything_the_cli_reads() -> None:
    assert set(load_template()["Outputs"]) >= OUTPUTS_THE_CLI_READS


# --------------------------------------------------------------------------------- IAM
def test_every_mutating_ec2_statement_is_scoped_by_the_stack_tag() -> None:
    checked = 0
    for logical_id, statement in _all_statements():
        actions = set(as_list(statement.get("Action", [])))
        condition = statement.get("Condition", {})
        if actions & {"ec2:TerminateInstances", "ec2:StopInstances"}:
            checked += 1
            assert "aws:ResourceTag/gpujobs:stack" in condition.get("StringEquals", {}), (logical_id, statement)
        if "ec2:RunInstances" in actions and ":instance/*" in _resources_text(statement):
            checked += 1
            assert condition["StringEquals"]["aws:RequestTag/gpujobs:stack"] == {"Ref": "AWS::StackName"}
            assert set(condition["ForAllValues:StringEquals"]["aws:TagKeys"]) == TAG_KEYS_THE_LAUNCHER_WRITES
        if "ec2:RunInstances" in actions and not condition:
            assert not any(f":{r}/" in _resources_text(statement) for r in ("instance", "volume")), statement
        if "ec2:CreateTags" in actions:
            checked += 1
            plain = condition["StringEquals"]
            if "ec2:CreateAction" not in plain:  # outside a create: one key, on the stack's instances only
                assert plain["aws:ResourceTag/gpujobs:stack"] == {"Ref": "AWS::StackName"}, (logical_id, statement)
                assert condition["ForAllValues:StringEquals"]["aws:TagKeys"] == ["gpujobs:generation"], statement
                assert ":instance/*" in _resources_text(statement), statement
    assert checked >= 3


def test_pass_role_is_limited_to_the_instance_role_and_to_ec2() -> None:
    passes = [(lid, s) for lid, s in _all_statements() if "iam:PassRole" in as_list(s.get("Action", []))]

    assert passes
    for logical_id, statement in passes:
        assert statement["Resource"] == {"Fn::GetAtt": ["InstanceRole", "Arn"]}, logical_id
        assert statement["Condition"] == {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}


def test_no_statement_grants_every_action_of_a_service() -> None:
    for logical_id, statement in _all_statements():
        for action in as_list(statement.get("Action", [])):
            assert not str(action).endswith(":*"), (logical_id, statement)


# ------------------------------------------------------------------- reacting to the cloud
def test_each_event_function_has_its_code_folder_and_the_shared_handler_name() -> None:
    for logical_id, code_uri in EVENT_FUNCTIONS.items():
        props = function_properties(logical_id)

        assert (props["CodeUri"], props["Handler"]) == (code_uri, "app.handler"), logical_id


def test_every_function_writes_to_its_own_log_group_with_the_retention_parameter() -> None:
    groups = resources_of_type("AWS::Logs::LogGroup")
    seen: set[str] = set()
    for logical_id in resources_of_type("AWS::Serverless::Function"):
        group = function_properties(logical_id)["LoggingConfig"]["LogGroup"]["Ref"]

        assert group in groups, logical_id
        assert groups[group]["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}, group
        assert group not in seen, f"{logical_id} shares {group}"
        seen.add(group)


def test_spot_signals_and_instance_state_changes_come_from_ec2_on_the_default_bus() -> None:
    (spot,) = _event_sources("SpotFunction", "EventBridgeRule").values()
    (state,) = _event_sources("InstanceStateFunction", "EventBridgeRule").values()

    assert "EventBusName" not in spot
    assert "EventBusName" not in state
    assert spot["Pattern"] == {
        "source": ["aws.ec2"],
        "detail-type": ["EC2 Spot Instance Interruption Warning", "EC2 Instance Rebalance Recommendation"],
    }
    assert state["Pattern"]["source"] == ["aws.ec2"]
    assert state["Pattern"]["detail-type"] == ["EC2 Instance State-change Notification"]
    assert set(state["Pattern"]["detail"]["state"]) == {"stopping", "stopped", "shutting-down", "terminated", "running"}


def test_trainer_and_instance_reports_come_from_the_stacks_own_bus() -> None:
    (reports,) = _event_sources("ReportsFunction", "EventBridgeRule").values()

    assert reports["EventBusName"] == {"Ref": "JobsEventBus"}
    assert reports["Pattern"] == {
        "source": ["gpujobs.trainer", "gpujobs.instance"],
        "detail-type": ["Checkpoint Committed", "Training Heartbeat", "Job Exited"],
    }


def test_idle_alarms_are_matched_by_this_stacks_alarm_name_prefix_in_alarm_state_only() -> None:
    (idle,) = _event_sources("IdleFunction", "EventBridgeRule").values()
    pattern = idle["Pattern"]

    assert "EventBusName" not in idle
    assert (pattern["source"], pattern["detail-type"]) == (["aws.cloudwatch"], ["CloudWatch Alarm State Change"])
    assert pattern["detail"]["alarmName"] == [{"prefix": {"Fn::Sub": "gpujobs-idle-${AWS::StackName}-i-"}}]
    assert pattern["detail"]["state"] == {"value": ["ALARM"]}


def test_budget_function_hears_budgets_over_sns_and_cost_anomalies_over_eventbridge() -> None:
    (sns,) = _event_sources("BudgetFunction", "SNS").values()
    (anomalies,) = _event_sources("BudgetFunction", "EventBridgeRule").values()

    assert sns["Topic"] == {"Ref": "BudgetAlertsTopic"}
    assert sns["RedrivePolicy"] == {"deadLetterTargetArn": {"Fn::GetAtt": ["EventsDeadLetterQueue", "Arn"]}}
    assert anomalies["Pattern"] == {"source": ["aws.ce"], "detail-type": ["Anomaly Detected"]}


def test_the_reconciler_runs_every_minute_one_at_a_time_and_drops_stale_ticks() -> None:
    props = function_properties("ReconcilerFunction")
    (tick,) = _event_sources("ReconcilerFunction", "Schedule").values()

    assert tick["Schedule"] == "rate(1 minute)"
    assert props["Timeout"] == 120
    assert props["EventInvokeConfig"]["MaximumRetryAttempts"] == 0
    assert props["EventInvokeConfig"]["MaximumEventAgeInSeconds"] <= 3 * 60


def test_the_stack_reserves_no_concurrency_unless_asked_so_a_new_account_with_a_quota_of_10_can_deploy() -> None:
    """A reservation must leave 100 unreserved: on a 10-concurrency account any reservation fails the
    deploy (aws-round3.md section 4a), so the reconciler's is a parameter that defaults to none."""
    parameter = load_template()["Parameters"]["ReconcilerReservedConcurrency"]
    reserved = {
        logical_id: function_properties(logical_id)["ReservedConcurrentExecutions"]
        for logical_id in resources_of_type("AWS::Serverless::Function")
        if "ReservedConcurrentExecutions" in function_properties(logical_id)
    }

    reports = load_template()["Parameters"]["ReportsReservedConcurrency"]

    assert parameter["Default"] == reports["Default"] == ""
    assert reserved == {
        function: {
            "Fn::If": [f"Reserves{name}Concurrency", {"Ref": f"{name}ReservedConcurrency"}, {"Ref": "AWS::NoValue"}]
        }
        for function, name in (("ReconcilerFunction", "Reconciler"), ("ReportsFunction", "Reports"))
    }
    for name in ("Reconciler", "Reports"):
        assert load_template()["Conditions"][f"Reserves{name}Concurrency"] == {
            "Fn::Not": [{"Fn::Equals": [{"Ref": f"{name}ReservedConcurrency"}, ""]}]
        }
    for pattern in (parameter["AllowedPattern"], reports["AllowedPattern"]):
        assert re.fullmatch(pattern, "")
        assert re.fullmatch(pattern, "1")
        assert not re.fullmatch(pattern, "0")  # 0 would throttle every invocation


def test_every_eventbridge_rule_retries_for_an_hour_then_dead_letters_to_one_encrypted_queue() -> None:
    rules = [
        (fn, name, props)
        for fn in resources_of_type("AWS::Serverless::Function")
        for name, props in _event_sources(fn, "EventBridgeRule").items()
    ]

    assert len(rules) >= 5
    for fn, name, props in rules:
        assert props["RetryPolicy"] == {"MaximumRetryAttempts": 8, "MaximumEventAgeInSeconds": 3600}, (fn, name)
        assert props["DeadLetterConfig"] == {"Arn": {"Fn::GetAtt": ["EventsDeadLetterQueue", "Arn"]}}, (fn, name)
    assert properties("EventsDeadLetterQueue")["SqsManagedSseEnabled"] is True
    assert properties("EventsDeadLetterQueue")["MessageRetentionPeriod"] == 14 * 24 * 3600


def test_a_function_failing_on_an_event_after_its_retries_also_ends_in_the_dead_letter_queue() -> None:
    for logical_id in set(EVENT_FUNCTIONS) - {"ReconcilerFunction"}:
        config = function_properties(logical_id)["EventInvokeConfig"]

        assert config["DestinationConfig"]["OnFailure"] == {
            "Type": "SQS",
            "Destination": {"Fn::GetAtt": ["EventsDeadLetterQueue", "Arn"]},
        }, logical_id


def test_only_eventbridge_rules_and_the_budget_topic_of_this_account_may_dead_letter() -> None:
    (policy,) = [
        p["Properties"]
        for p in resources_of_type("AWS::SQS::QueuePolicy").values()
        if p["Properties"]["Queues"] == [{"Ref": "EventsDeadLetterQueue"}]
    ]
    statements = {s["Principal"]["Service"]: s for s in policy["PolicyDocument"]["Statement"]}
    alarm = properties("EventsDeadLetterAlarm")

    assert set(statements) == {"events.amazonaws.com", "sns.amazonaws.com"}
    assert statements["events.amazonaws.com"]["Condition"]["StringEquals"] == {
        "aws:SourceAccount": {"Ref": "AWS::AccountId"}
    }
    assert statements["sns.amazonaws.com"]["Condition"] == {
        "ArnEquals": {"aws:SourceArn": {"Ref": "BudgetAlertsTopic"}}
    }
    assert all(s["Action"] == "sqs:SendMessage" for s in statements.values())
    assert alarm["Dimensions"] == [
        {"Name": "QueueName", "Value": {"Fn::GetAtt": ["EventsDeadLetterQueue", "QueueName"]}}
    ]
    assert (alarm["ComparisonOperator"], alarm["Threshold"]) == ("GreaterThanThreshold", 0)


# ----------------------------------------------------------------------------- budgets
def test_only_aws_budgets_of_this_account_may_publish_budget_alerts() -> None:
    policy = properties("BudgetAlertsTopicPolicy")
    (statement,) = policy["PolicyDocument"]["Statement"]

    assert policy["Topics"] == [{"Ref": "BudgetAlertsTopic"}]
    assert statement["Principal"] == {"Service": "budgets.amazonaws.com"}
    assert statement["Action"] == "SNS:Publish"
    assert statement["Condition"]["StringEquals"] == {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}
    # Budgets cannot publish to a topic under the AWS-managed key alias/aws/sns.
    assert properties("BudgetAlertsTopic").get("KmsMasterKeyId") != "alias/aws/sns"


def test_the_stack_budget_exists_only_when_asked_for_and_alerts_on_actual_and_forecast() -> None:
    budget = resource("MonthlyBudget")
    template = load_template()
    data = budget["Properties"]["Budget"]
    notifications = budget["Properties"]["NotificationsWithSubscribers"]

    assert template["Parameters"]["MonthlyBudgetUsd"]["Default"] == 0
    assert budget["Condition"] == "HasMonthlyBudget"
    assert template["Conditions"]["HasMonthlyBudget"] == {
        "Fn::Not": [{"Fn::Equals": [{"Ref": "MonthlyBudgetUsd"}, "0"]}]
    }
    assert (data["BudgetType"], data["TimeUnit"]) == ("COST", "MONTHLY")
    assert data["BudgetName"] == {"Fn::Sub": "gpujobs-${AWS::StackName}-all"}
    assert data["BudgetLimit"] == {"Amount": {"Ref": "MonthlyBudgetUsd"}, "Unit": "USD"}
    assert data["CostFilters"] == {"TagKeyValue": [{"Fn::Sub": "user:gpujobs:stack$${AWS::StackName}"}]}
    assert sorted(n["Notification"]["NotificationType"] for n in notifications) == ["ACTUAL", "FORECASTED"]
    for n in notifications:
        assert n["Notification"]["ComparisonOperator"] == "GREATER_THAN"
        assert (n["Notification"]["Threshold"], n["Notification"]["ThresholdType"]) == (100, "PERCENTAGE")
        assert n["Subscribers"] == [{"SubscriptionType": "SNS", "Address": {"Ref": "BudgetAlertsTopic"}}]


# ------------------------------------------------------------------------ checkpoint now
def test_checkpoint_now_document_signals_only_a_gpujobs_container_name() -> None:
    props = properties("CheckpointNowDocument")
    content = props["Content"]
    (step,) = content["mainSteps"]
    allowed = re.compile(content["parameters"]["containerName"]["allowedPattern"])
    signals = re.compile(content["parameters"]["signal"]["allowedPattern"])

    assert props["DocumentType"] == "Command"
    assert content["schemaVersion"] == "2.2"
    assert list(content["parameters"]) == ["containerName", "signal"]
    assert step["action"] == "aws:runShellScript"
    assert step["inputs"]["runCommand"] == ["docker kill --signal {{ signal }} {{ containerName }}"]
    assert content["parameters"]["signal"]["default"] == "SIGUSR1"
    assert [
        s for s in ("SIGUSR1", "SIGUSR2", "SIGKILL", "SIGUSR1; reboot", "SIGUSR2\nreboot") if signals.search(s)
    ] == [
        "SIGUSR1",
        "SIGUSR2",
    ]
    assert allowed.search("gpujobs-j-0123456789abcdef-a1")
    assert allowed.search("gpujobs-j-0123456789abcdef-a9999")
    for hostile in (
        "gpujobs-j-0123456789abcdef-a1; rm -rf /",
        "gpujobs-j-0123456789abcdef-a1\nreboot",
        "$(reboot)",
        "gpujobs-j-0123456789ABCDEF-a1",
        "other-container",
    ):
        assert not allowed.search(hostile), hostile


# --------------------------------------------------------------------------------- IAM (functions)
# The credentials function changes no job: it reads one record and vends a session, nothing more.
# The Publisher function reads the table's stream (the Lambda service reads it on its role's behalf).
READ_ONLY_FUNCTIONS = ("CredentialsFunction", "PublisherFunction")
# Who puts events on the bus: every state change from the stream, the reconciler's and the budget
# function's notices. A handler that changes a job only writes it (service/outbox.py).
PUBLISHERS = ("PublisherFunction", "ReconcilerFunction", "BudgetFunction")


def test_every_function_reads_and_writes_the_jobs_table_and_only_publishers_put_events_on_the_stacks_bus() -> None:
    for logical_id in resources_of_type("AWS::Serverless::Function"):
        policies = properties(logical_id)["Policies"]
        publishes = _allowing(_function_statements(logical_id), "events:PutEvents")

        writes = {"DynamoDBCrudPolicy": {"TableName": {"Ref": "JobsTable"}}} in policies
        assert writes is (logical_id not in READ_ONLY_FUNCTIONS), logical_id
        assert bool(publishes) is (logical_id in PUBLISHERS), logical_id
        assert all(s["Resource"] == {"Fn::GetAtt": ["JobsEventBus", "Arn"]} for s in publishes), logical_id


def test_state_changes_are_published_from_the_tables_stream_in_order_with_partial_batch_failures() -> None:
    (stream,) = _event_sources("PublisherFunction", "DynamoDB").values()
    table = properties("JobsTable")

    assert table["StreamSpecification"] == {"StreamViewType": "NEW_AND_OLD_IMAGES"}
    assert stream["Stream"] == {"Fn::GetAtt": ["JobsTable", "StreamArn"]}
    assert stream["StartingPosition"] == "TRIM_HORIZON"
    assert stream["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert stream["ParallelizationFactor"] == 1  # one reader per shard: a job's writes in order
    # bounded: retried for hours, never forever, then its place in the stream is dead-lettered
    assert 0 < stream["MaximumRetryAttempts"] <= 10_000
    assert 0 < stream["MaximumRecordAgeInSeconds"] < 24 * 3600  # the stream keeps records 24 h
    assert stream["DestinationConfig"]["OnFailure"]["Destination"] == {"Fn::GetAtt": ["EventsDeadLetterQueue", "Arn"]}
    assert [json.loads(f["Pattern"]) for f in stream["FilterCriteria"]["Filters"]] == [
        {"dynamodb": {"Keys": {"sk": {"S": ["JOB"]}}}}
    ]
    alarm = properties("PublisherIteratorAgeAlarm")
    assert (alarm["MetricName"], alarm["Statistic"]) == ("IteratorAge", "Maximum")
    assert alarm["Dimensions"] == [{"Name": "FunctionName", "Value": {"Ref": "PublisherFunction"}}]


def test_the_credentials_function_only_reads_job_records_and_publishes_nothing() -> None:
    statements = _function_statements("CredentialsFunction")
    reads = _allowing(statements, "dynamodb:GetItem")

    assert not any("DynamoDBCrudPolicy" in str(p) for p in properties("CredentialsFunction")["Policies"])
    assert not _allowing(statements, "events:PutEvents")
    assert not _allowing(statements, "dynamodb:PutItem")
    assert not _allowing(statements, "dynamodb:UpdateItem")
    assert [s["Action"] for s in reads] == ["dynamodb:GetItem"]
    assert "table/${JobsTable}" in _resources_text(reads[0])


def test_every_function_that_may_launch_gets_the_launch_permissions_submit_has() -> None:
    for logical_id in LAUNCHERS:
        statements = _function_statements(logical_id)
        launches = _allowing(statements, "ec2:RunInstances")

        assert _managed_policies_of(logical_id)[:3] == ["LaunchPolicy", "EndPolicy", "IdleAlarmsPolicy"], logical_id
        assert any(":instance/*" in _resources_text(s) and "Condition" in s for s in launches), logical_id
        assert any(":launch-template/" in _resources_text(s) for s in launches), logical_id
        assert _allowing(statements, "iam:PassRole"), logical_id
        assert _allowing(statements, "ec2:TerminateInstances"), logical_id
        assert _allowing(statements, "ec2:StopInstances"), logical_id
        assert _allowing(statements, "ec2:CreateTags"), logical_id
        assert _allowing(statements, "ec2:DescribeInstances"), logical_id
        assert _allowing(statements, "ssm:GetParameters"), logical_id
        # every launch is an admission: quotas, pauses and the drain hold in each launcher (the
        # reconciler's admission pass included), not only where jobs are submitted
        assert properties(logical_id)["Environment"]["Variables"]["TEAMS_PARAMETER"] == {"Ref": "TeamsParameterName"}
        assert any(
            "parameter${TeamsParameterName}" in _resources_text(s) for s in _allowing(statements, "ssm:GetParameter")
        )
        assert any(
            s["Resource"] == {"Fn::Sub": "${CheckpointBucket.Arn}/jobs/*"}
            for s in _allowing(statements, "s3:PutObject")
        )
        for action in (
            "cloudwatch:PutMetricAlarm",
            "cloudwatch:DeleteAlarms",
            "cloudwatch:TagResource",
            "cloudwatch:DescribeAlarms",
        ):
            assert _allowing(statements, action), (logical_id, action)
    # Signalling a checkpoint is given to exactly the functions whose reactions ask for one.
    for logical_id in SIGNALLERS:
        assert _allowing(_function_statements(logical_id), "ssm:SendCommand"), logical_id


def test_idle_alarms_may_be_managed_only_under_this_stacks_name_prefix() -> None:
    statements = _managed_policy_statements("IdleAlarmsPolicy")
    for action in ("cloudwatch:PutMetricAlarm", "cloudwatch:DeleteAlarms", "cloudwatch:TagResource"):
        (statement,) = _allowing(statements, action)

        assert statement["Resource"] == {
            "Fn::Sub": "arn:${AWS::Partition}:cloudwatch:${AWS::Region}:${AWS::AccountId}:alarm:gpujobs-idle-${AWS::StackName}-i-*"
        }


def test_ssm_commands_run_only_the_checkpoint_document_and_only_on_this_stacks_instances() -> None:
    sends = [s for _, s in _all_statements() if "ssm:SendCommand" in as_list(s.get("Action", []))]
    documents = [s for s in sends if ":document/" in _resources_text(s)]
    instances = [s for s in sends if ":instance/" in _resources_text(s)]

    assert len(sends) == len(documents) + len(instances) == 2
    (document,) = documents
    (instance,) = instances
    assert document["Resource"] == {
        "Fn::Sub": "arn:${AWS::Partition}:ssm:${AWS::Region}:${AWS::AccountId}:document/${CheckpointNowDocument}"
    }
    assert instance["Condition"] == {"StringEquals": {"ssm:resourceTag/gpujobs:stack": {"Ref": "AWS::StackName"}}}


def test_only_the_reconciler_and_the_budget_function_read_budgets_and_spot_prices() -> None:
    readers = {
        logical_id
        for logical_id in resources_of_type("AWS::Serverless::Function")
        if _allowing(_function_statements(logical_id), "budgets:ViewBudget")
    }
    pricers = {
        logical_id
        for logical_id in resources_of_type("AWS::Serverless::Function")
        if _allowing(_function_statements(logical_id), "ec2:DescribeSpotPriceHistory")
    }

    assert readers == pricers == {"ReconcilerFunction", "BudgetFunction"}
    for logical_id in readers:
        (view,) = _allowing(_function_statements(logical_id), "budgets:ViewBudget")
        assert view["Resource"] == {
            "Fn::Sub": "arn:${AWS::Partition}:budgets::${AWS::AccountId}:budget/gpujobs-${AWS::StackName}-*"
        }


def test_only_the_reconciler_which_prices_the_cost_caps_reads_the_price_list() -> None:
    readers = {
        logical_id
        for logical_id in resources_of_type("AWS::Serverless::Function")
        if _allowing(_function_statements(logical_id), "pricing:GetProducts")
    }

    assert readers == {"ReconcilerFunction"}
    (read,) = _allowing(_function_statements("ReconcilerFunction"), "pricing:GetProducts")
    assert read["Resource"] == "*"  # GetProducts supports no resource-level permissions
    assert as_list(read["Action"]) == ["pricing:GetProducts"]


def test_only_the_reconciler_reads_the_reports_functions_throttles_and_it_is_told_its_name() -> None:
    """Silence while reports were throttled is no hang (domain/hangs.py): one metric read per tick."""
    readers = {
        logical_id
        for logical_id in resources_of_type("AWS::Serverless::Function")
        if _allowing(_function_statements(logical_id), "cloudwatch:GetMetricStatistics")
    }

    assert readers == {"ReconcilerFunction"}
    (read,) = _allowing(_function_statements("ReconcilerFunction"), "cloudwatch:GetMetricStatistics")
    assert as_list(read["Action"]) == ["cloudwatch:GetMetricStatistics"]
    variables = function_properties("ReconcilerFunction")["Environment"]["Variables"]
    assert variables["REPORTS_FUNCTION_NAME"] == {"Ref": "ReportsFunction"}


def test_instances_may_publish_gpu_metrics_in_the_cloudwatch_agents_namespace() -> None:
    (publish,) = _allowing(policy_statements("InstanceRole"), "cloudwatch:PutMetricData")

    assert publish["Condition"] == {"StringEquals": {"cloudwatch:namespace": "CWAgent"}}
    assert _allowing(policy_statements("InstanceRole"), "events:PutEvents")


# --------------------------------------------------------------------------------- docs
def _doc_rows(doc: Path = DOCS_EVENTS) -> list[str]:
    return [line for line in doc.read_text(encoding="utf-8").splitlines() if line.startswith("|")]


@pytest.mark.parametrize("doc", [DOCS_EVENTS, DOCS_EVENTS.parents[1] / "README.md"], ids=["docs-events", "readme"])
def test_every_event_the_template_routes_is_in_the_docs_events_table_with_its_function(doc: Path) -> None:
    # Given every (function, kind of event) pair the template wires up
    expected: list[tuple[str, str]] = []
    for logical_id in resources_of_type("AWS::Serverless::Function"):
        for props in _event_sources(logical_id, "EventBridgeRule").values():
            expected += [(logical_id, detail_type) for detail_type in props["Pattern"]["detail-type"]]
        if _event_sources(logical_id, "Schedule"):
            expected.append((logical_id, "Scheduled Event"))
        for props in _event_sources(logical_id, "SNS").values():
            expected.append((logical_id, props["Topic"]["Ref"]))
    assert len(expected) >= 10
    # Then docs/events.md has a table row naming both
    rows = _doc_rows(doc)
    missing = [(fn, what) for fn, what in expected if not any(what in row and fn in row for row in rows)]
    assert not missing, f"{doc.name} lacks rows for {missing}"


# ------------------------------------------------------------------------- moto (integration)
@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with mock_aws():
        yield


@pytest.mark.integration
@pytest.mark.usefixtures("aws")
def test_a_table_built_from_the_template_answers_queries_on_both_indexes() -> None:
    # Given a table created from template.yaml's own definition
    dynamodb = boto3.client("dynamodb", region_name="us-east-1")
    dynamodb.create_table(TableName="jobs", **table_definition())
    # When a job attempt is written
    dynamodb.put_item(
        TableName="jobs",
        Item={
            "pk": {"S": "JOB#j-1"},
            "sk": {"S": "ATTEMPT#1"},
            "state": {"S": "RUNNING"},
            "updated_at": {"S": "2026-11-29T12:00:00Z"},
            "instance_id": {"S": "i-0abc1234def567890"},
        },
    )
    # Then it is found by state (newest first) and by instance
    by_state = dynamodb.query(
        TableName="jobs",
        IndexName="ByState",
        KeyConditionExpression="#s = :s AND updated_at > :t",
        ExpressionAttributeNames={"#s": "state"},
        ExpressionAttributeValues={":s": {"S": "RUNNING"}, ":t": {"S": "2026-01-01"}},
        ScanIndexForward=False,
    )
    by_instance = dynamodb.query(
        TableName="jobs",
        IndexName="ByInstance",
        KeyConditionExpression="instance_id = :i",
        ExpressionAttributeValues={":i": {"S": "i-0abc1234def567890"}},
    )
    assert [i["pk"]["S"] for i in by_state["Items"]] == ["JOB#j-1"]
    assert [i["sk"]["S"] for i in by_instance["Items"]] == ["ATTEMPT#1"]
    described = dynamodb.describe_table(TableName="jobs")["Table"]
    assert described["SSEDescription"]["Status"] == "ENABLED"


@pytest.mark.integration
@pytest.mark.usefixtures("aws")
def test_an_instance_launched_from_the_template_data_has_imdsv2_and_the_stack_tag() -> None:
    # Given the launch template created from template.yaml's data
    ec2 = boto3.client("ec2", region_name="us-east-1")
    image_id = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    data = launch_template_data(
        image_id=image_id,
        instance_profile_arn="arn:aws:iam::123456789012:instance-profile/gpujobs-test",
        stack_name=STACK,
    )
    template_id = ec2.create_launch_template(LaunchTemplateName="gpujobs", LaunchTemplateData=data)["LaunchTemplate"][
        "LaunchTemplateId"
    ]
    # When an instance is launched from it, the way the launcher does
    subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
    (instance,) = ec2.run_instances(
        LaunchTemplate={"LaunchTemplateId": template_id},
        InstanceType="g5.xlarge",
        MinCount=1,
        MaxCount=1,
        NetworkInterfaces=[{"DeviceIndex": 0, "SubnetId": subnet, "AssociatePublicIpAddress": False}],
    )["Instances"]
    # Then it carries the template's settings
    stored = ec2.describe_launch_template_versions(LaunchTemplateId=template_id)["LaunchTemplateVersions"][0]
    assert stored["LaunchTemplateData"]["MetadataOptions"]["HttpTokens"] == "required"
    assert stored["LaunchTemplateData"]["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] == 200
    tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
    assert tags.get("gpujobs:stack") == STACK
    assert "KeyName" not in instance


@pytest.mark.integration
@pytest.mark.usefixtures("aws")
def test_a_queue_built_from_the_template_moves_a_poison_message_to_the_dlq() -> None:
    # Given the jobs queue and its DLQ created from template.yaml
    sqs = boto3.client("sqs", region_name="us-east-1")
    dlq_url = sqs.create_queue(QueueName="dlq", Attributes=queue_attributes("JobsDeadLetterQueue"))["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    url = sqs.create_queue(QueueName="jobs", Attributes=queue_attributes("JobsQueue", dead_letter_arn=dlq_arn))[
        "QueueUrl"
    ]
    sqs.send_message(QueueUrl=url, MessageBody="{not json")
    # When the function fails it more often than the redrive policy allows
    for _ in range(queue_redrive_max_receive_count() + 1):
        for message in sqs.receive_message(QueueUrl=url, VisibilityTimeout=0).get("Messages", []):
            sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0)
    sqs.receive_message(QueueUrl=url, VisibilityTimeout=0)
    # Then the message waits in the dead-letter queue
    dead = sqs.receive_message(QueueUrl=dlq_url).get("Messages", [])
    assert [m["Body"] for m in dead] == ["{not json"]
    visibility = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])["Attributes"]
    assert visibility["VisibilityTimeout"] == "3600"
