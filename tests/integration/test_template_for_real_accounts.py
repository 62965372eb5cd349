"""template.yaml against what a real account does that moto does not: condition keys a request may
lack, images in other accounts' registries, a customer managed EBS key, alarms nobody hears, and
resources nobody can attribute a cost to.

The IAM checks evaluate the rendered policies (tests/iam: SAM's translator, IAM's evaluation rules)
for requests written out here; the call ledger (tests/integration/test_every_call_is_allowed.py)
does the same for the calls the code really makes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, get_args

import cfnlint
import pytest

from gpujobs.domain.effects import (
    CreateAlarms,
    DeleteAlarms,
    DumpStacks,
    Effect,
    Launch,
    SignalCheckpoint,
    Stop,
    TagGeneration,
    Terminate,
    TerminateJobInstances,
    aws_call_of,
)
from gpujobs.runtime.observability import EmfMetrics
from gpujobs.service.changes import Actuator
from gpujobs_fakes.memory import FakeCompute
from gpujobs_fakes.wiring import fake_ports
from gpujobs_local.template import as_list, load_template, properties, resource
from tests.iam.evaluate import Request, evaluate
from tests.iam.stack_policies import principal_policies, rendered

DLC_ACCOUNT = "763104351884"
ALARM_ACTIONS = [{"Fn::If": ["HasAlarmTopic", {"Ref": "AlarmTopicArn"}, {"Ref": "AlarmTopic"}]}]
EFFECTS = ["Stop", "Terminate", "SendCommand", "PutMetricAlarm", "DeleteAlarms", "CreateTags"]
ALWAYS_PRESENT = {
    "aws:requesttag/gpujobs:stack": "every create the stack allows is tagged by the launcher (tag-on-create)",
    "aws:resourcetag/gpujobs:stack": "the resource either carries the stack's tag (ours) or not (refused: intended)",
    "ssm:resourcetag/gpujobs:stack": "as aws:ResourceTag, for SendCommand's instance resources",
    "aws:tagkeys": "only under ForAllValues, which holds when the key is missing",
    "aws:requesttag/gpujobs:job-id": "the job role's trust: AssumeRole without the tag is refused, as intended",
    "aws:requesttag/gpujobs:team": "the job role's trust: AssumeRole without the tag is refused, as intended",
    "aws:requesttag/gpujobs:attempt": "the job role's trust: AssumeRole without the tag is refused, as intended",
    "ec2:metadatahttptokens": "the stack's launch template sets HttpTokens; RunInstances evaluates its values",
    "ec2:instancetype": "every RunInstances names its type",
    "ec2:launchtemplate": "every launch is from the stack's launch template; one without is refused, as intended",
    "ec2:encrypted": "every volume resource of RunInstances has the key (the template sets Encrypted)",
    "ec2:owner": "every image resource has an owner",
    "ec2:createaction": "present on tag-on-create; a standalone CreateTags is refused, as intended",
    "iam:passedtoservice": "present on every PassRole",
    "events:source": "every PutEvents entry has a Source",
    "cloudwatch:namespace": "every PutMetricData names its Namespace (a required parameter)",
    "s3:prefix": "a listing without a prefix (the whole bucket) is refused for a job, as intended",
    "aws:securetransport": "present on every request (the bucket policy's Deny of plain HTTP)",
    "aws:sourceaccount": "present when a service principal (EventBridge, SNS, Budgets) acts for a resource",
    "aws:sourcearn": "present when a service principal (EventBridge, SNS, Budgets) acts for a resource",
    "kms:viaservice": "the stack's key is used only by EC2 on the launcher's behalf, which sets it",
    "kms:grantisforawsresource": "present on every CreateGrant",
}
"""Every condition key the template tests with a plain operator, and why no request it must allow
lacks it. A key that a request may rightly omit needs `...IfExists` instead (aws-round3.md 1a)."""


def _statements_anywhere(value: Any, owner: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every IAM statement in the template (roles, managed policies, resource policies), with its owner."""
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(value, dict):
        if "Effect" in value and ("Action" in value or "NotAction" in value):
            found.append((owner, value))
        for item in value.values():
            found += _statements_anywhere(item, owner)
    elif isinstance(value, list):
        for item in value:
            found += _statements_anywhere(item, owner)
    return found


def _every_statement() -> list[tuple[str, dict[str, Any]]]:
    return [s for lid, res in load_template()["Resources"].items() for s in _statements_anywhere(res, lid)]


# ------------------------------------------------------------------------ condition keys
def test_every_plain_condition_key_is_one_every_request_it_must_allow_carries() -> None:
    """The EFA mistake, for every condition: `Bool ec2:AssociatePublicIpAddress` refused the launches
    that rightly omit the key. Each plain key is audited above; the rest must be IfExists."""
    unaudited = []
    for owner, statement in _every_statement():
        for operator, block in statement.get("Condition", {}).items():
            for key in block:
                if operator.endswith("IfExists") or operator.startswith("ForAllValues:"):
                    continue
                if key.lower() not in ALWAYS_PRESENT:
                    unaudited.append((owner, statement.get("Sid"), operator, key))

    assert not unaudited, "audit these keys (ALWAYS_PRESENT) or use ...IfExists: " + repr(unaudited)


def test_the_public_ip_key_is_the_one_a_launch_may_omit_and_true_is_refused_either_way() -> None:
    statements = principal_policies("SubmitFunction", {})
    interface = "arn:aws:ec2:us-east-1:123456789012:network-interface/eni-new"
    modelled = {"ec2:associatepublicipaddress"}

    omitted = evaluate(statements, Request("ec2:RunInstances", interface, {}, modelled))
    false = evaluate(
        statements, Request("ec2:RunInstances", interface, {"ec2:associatepublicipaddress": ["false"]}, modelled)
    )
    true = evaluate(
        statements, Request("ec2:RunInstances", interface, {"ec2:associatepublicipaddress": ["true"]}, modelled)
    )

    assert (omitted.allowed, false.allowed, true.allowed) == (True, True, False)


# ------------------------------------------------------------------------------ images
def _pull(repository: str, parameters: dict[str, Any] | None = None) -> bool:
    statements = principal_policies("InstanceRole", {}, parameters)
    return evaluate(statements, Request("ecr:BatchGetImage", repository)).allowed


def test_instances_pull_from_the_stacks_registry_and_the_deep_learning_containers_by_default() -> None:
    parameter = load_template()["Parameters"]["ImageRepositoryArns"]

    assert parameter["Default"] == f"arn:aws:ecr:*:{DLC_ACCOUNT}:repository/*"
    assert _pull("arn:aws:ecr:us-east-1:123456789012:repository/team/train")
    assert _pull(f"arn:aws:ecr:us-west-2:{DLC_ACCOUNT}:repository/pytorch-training")
    assert not _pull("arn:aws:ecr:us-east-1:210987654321:repository/someone-elses")
    assert not _pull("arn:aws:ecr:eu-west-1:123456789012:repository/team/train")  # own account, other region


def test_an_empty_registry_list_leaves_only_the_stacks_own_and_a_list_adds_exactly_its_entries() -> None:
    only_own = {"ImageRepositoryArns": [""]}
    more = {
        "ImageRepositoryArns": [
            "arn:aws:ecr:eu-west-1:210987654321:repository/base/*",
            f"arn:aws:ecr:*:{DLC_ACCOUNT}:repository/*",
        ]
    }

    assert _pull("arn:aws:ecr:us-east-1:123456789012:repository/x", only_own)
    assert not _pull(f"arn:aws:ecr:us-east-1:{DLC_ACCOUNT}:repository/pytorch-training", only_own)
    assert _pull("arn:aws:ecr:eu-west-1:210987654321:repository/base/cuda", more)
    assert not _pull("arn:aws:ecr:eu-west-1:210987654321:repository/other", more)


# ------------------------------------------------------------------------------ KMS
def test_root_volumes_use_the_key_parameter_and_only_launchers_get_grants_on_it() -> None:
    parameter = load_template()["Parameters"]["EbsKmsKeyArn"]
    key = "arn:aws:kms:us-east-1:123456789012:key/0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
    via = {"kms:viaservice": ["ec2.us-east-1.amazonaws.com"]}
    grant = {**via, "kms:grantisforawsresource": ["true"]}
    keys = {"kms:viaservice", "kms:grantisforawsresource"}

    assert parameter["Default"] == ""
    assert re.fullmatch(parameter["AllowedPattern"], key)
    assert re.fullmatch(
        parameter["AllowedPattern"], "arn:aws:kms:us-east-1:123456789012:key/mrk-0f1e2d3c4b5a69788796a5b4c3d2e1f0"
    )
    assert not re.fullmatch(
        parameter["AllowedPattern"], "arn:aws:kms:us-east-1:123456789012:alias/ebs"
    )  # IAM needs the key
    for principal in ("SubmitFunction", "SpotFunction", "ReconcilerFunction"):
        statements = principal_policies(principal, {}, {"EbsKmsKeyArn": key})
        assert evaluate(statements, Request("kms:CreateGrant", key, grant, keys)).allowed
        assert evaluate(statements, Request("kms:Decrypt", key, via, keys)).allowed
        # not a grant for something else, and not outside EC2
        assert not evaluate(
            statements, Request("kms:CreateGrant", key, {**via, "kms:grantisforawsresource": ["false"]}, keys)
        ).allowed
        assert not evaluate(
            statements, Request("kms:Decrypt", key, {"kms:viaservice": ["s3.us-east-1.amazonaws.com"]}, keys)
        ).allowed
    for principal in ("IdleFunction", "BudgetFunction", "InstanceRole", "JobRole"):
        statements = principal_policies(principal, {}, {"EbsKmsKeyArn": key})
        assert not evaluate(statements, Request("kms:CreateGrant", key, grant, keys)).allowed, principal


# ------------------------------------------------------------------------------ alarms
def test_every_alarm_notifies_the_given_topic_or_the_one_the_stack_creates() -> None:
    alarms = {
        lid: r["Properties"] for lid, r in load_template()["Resources"].items() if r["Type"] == "AWS::CloudWatch::Alarm"
    }
    conditions = load_template()["Conditions"]

    assert set(alarms) >= {
        "ReconcilerErrorsAlarm",
        "JobRecordTooLargeAlarm",
        "EventsDeadLetterAlarm",
        "JobsDeadLetterAlarm",
        "EffectsFailedAlarm",
    }
    for lid, alarm in alarms.items():
        assert alarm["AlarmActions"] == ALARM_ACTIONS, lid
        assert alarm["OKActions"] == ALARM_ACTIONS, lid
    assert resource("AlarmTopic")["Condition"] == "CreatesAlarmTopic"
    assert conditions["CreatesAlarmTopic"] == {"Fn::Equals": [{"Ref": "AlarmTopicArn"}, ""]}
    subscription = resource("AlarmEmailSubscription")
    assert subscription["Condition"] == "SubscribesAlarmEmail"
    assert subscription["Properties"] == {
        "TopicArn": {"Ref": "AlarmTopic"},
        "Protocol": "email",
        "Endpoint": {"Ref": "AlarmEmail"},
    }
    assert conditions["SubscribesAlarmEmail"] == {
        "Fn::And": [{"Condition": "CreatesAlarmTopic"}, {"Fn::Not": [{"Fn::Equals": [{"Ref": "AlarmEmail"}, ""]}]}]
    }


def test_a_failed_effect_of_any_kind_raises_the_effects_alarm_and_shows_on_the_dashboard() -> None:
    """The metric the service emits (EffectsFailed, dimensions service and Effect) for every effect kind."""
    alarm = properties("EffectsFailedAlarm")
    series = [m for m in alarm["Metrics"] if "MetricStat" in m]
    (total,) = [m for m in alarm["Metrics"] if "Expression" in m]
    dashboard = json.loads(properties("OperationsDashboard")["DashboardBody"]["Fn::Sub"])

    assert [{d["Name"]: d["Value"] for d in m["MetricStat"]["Metric"]["Dimensions"]} for m in series] == [
        {"service": "gpujobs", "Effect": effect} for effect in EFFECTS
    ]
    assert {(m["MetricStat"]["Metric"]["Namespace"], m["MetricStat"]["Metric"]["MetricName"]) for m in series} == {
        ("GpuJobs", "EffectsFailed")
    }
    assert all(m["ReturnData"] is False for m in series)
    assert total["ReturnData"] is True
    assert total["Expression"] == f"SUM([{', '.join(m['Id'] for m in series)}])"
    assert (alarm["Threshold"], alarm["ComparisonOperator"], alarm["TreatMissingData"]) == (
        0,
        "GreaterThanThreshold",
        "notBreaching",
    )
    searches = [
        m[0]["expression"] for w in dashboard["widgets"] for m in w["properties"]["metrics"] if isinstance(m[0], dict)
    ]
    assert "SEARCH('{GpuJobs,Effect,service} MetricName=\"EffectsFailed\"', 'Sum', 300)" in searches


def test_the_effects_alarm_has_a_series_for_every_call_a_failed_effect_is_counted_under() -> None:
    """`aws_call_of` names the `Effect` dimension the actuator counts a failure under; the alarm can
    only sum the series it lists, so each name the code can emit has its line, and no other."""
    one_of_each = [
        Terminate(("i-1",)),
        TerminateJobInstances("j-1"),
        Stop(("i-1",)),
        CreateAlarms("j-1", ("i-1",), 5, 30),
        DeleteAlarms(("i-1",)),
        SignalCheckpoint(("i-1",), "c"),
        DumpStacks(("i-1",), "c"),
        TagGeneration(("i-1",), 1),
        Launch("j-1"),
    ]
    assert {type(e) for e in one_of_each} == set(get_args(Effect))
    emitted = {call for e in one_of_each if (call := aws_call_of(e)) is not None}

    assert emitted == set(EFFECTS)


def test_a_failed_effect_is_emitted_as_the_series_the_alarm_sums(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The EMF line a failed Terminate makes, under the functions' environment from the template:
    an alarm's MetricStat matches only the exact namespace, name and set of dimensions."""
    variables = load_template()["Globals"]["Function"]["Environment"]["Variables"]
    for name in ("POWERTOOLS_SERVICE_NAME", "POWERTOOLS_METRICS_NAMESPACE"):
        monkeypatch.setenv(name, variables[name])
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    monkeypatch.delenv("POWERTOOLS_DEV", raising=False)
    compute = FakeCompute()
    compute.faults.fail_next("terminate")
    capsys.readouterr()

    Actuator(fake_ports(compute=compute, metrics=EmfMetrics())).carry_out([Terminate(("i-1",))])

    [line] = [json.loads(out) for out in capsys.readouterr().out.splitlines()]
    [directive] = line["_aws"]["CloudWatchMetrics"]
    (terminate,) = [m for m in properties("EffectsFailedAlarm")["Metrics"] if m["Id"] == "terminate"]
    queried = terminate["MetricStat"]["Metric"]
    assert directive["Namespace"] == queried["Namespace"]
    assert [m["Name"] for m in directive["Metrics"]] == [queried["MetricName"]]
    assert {d: line[d] for d in directive["Dimensions"][0]} == {d["Name"]: d["Value"] for d in queried["Dimensions"]}
    assert line[queried["MetricName"]] == [1.0]


# ------------------------------------------------------------------------------ cost allocation
UNTAGGED_BY_SAM = {"AWS::Events::Rule", "AWS::Lambda::EventSourceMapping"}
"""What SAM generates for a function's events and does not tag, PropagateTags or not (SAM 1.115):
free resources, reached by the stack-level tags of `sam deploy --tags` (docs/deploy.md)."""


def _taggable() -> dict[str, str]:
    """Resource type -> its tag property, per the CloudFormation resource schemas cfn-lint ships."""
    schemas = Path(cfnlint.__file__).parent / "data" / "schemas"
    provider = json.loads((schemas / "providers" / "us-east-1.json").read_text())
    found = {}
    for resource_type, schema_id in provider.items():
        tagging = json.loads((schemas / "resources" / f"{schema_id}.json").read_text()).get("tagging") or {}
        if tagging.get("taggable"):
            found[resource_type] = tagging.get("tagProperty", "/properties/Tags").rsplit("/", 1)[-1]
    return found


def test_every_taggable_resource_the_stack_deploys_carries_the_stacks_tag() -> None:
    taggable = _taggable()
    untagged = [
        (lid, res["Type"])
        for lid, res in rendered()["Resources"].items()
        if res["Type"] in taggable
        and res["Type"] not in UNTAGGED_BY_SAM
        and "gpujobs:stack" not in json.dumps(res.get("Properties", {}).get(taggable[res["Type"]]))
    ]

    assert len([r for r in rendered()["Resources"].values() if r["Type"] in taggable]) > 40
    assert not untagged


def test_the_job_log_group_outlives_the_stack_unless_told_otherwise() -> None:
    group = resource("JobLogGroup")
    parameter = load_template()["Parameters"]["JobLogsOnDelete"]

    assert (parameter["Default"], parameter["AllowedValues"]) == ("Retain", ["Retain", "Delete"])
    assert group["DeletionPolicy"] == group["UpdateReplacePolicy"] == {"Ref": "JobLogsOnDelete"}
    assert as_list(load_template()["Transform"])[0] == "AWS::LanguageExtensions"  # what resolves that Ref


@pytest.mark.parametrize("logical_id", ["JobsTable", "CheckpointBucket"])
def test_job_history_and_checkpoints_are_still_retained(logical_id: str) -> None:
    assert (resource(logical_id)["DeletionPolicy"], resource(logical_id)["UpdateReplacePolicy"]) == ("Retain", "Retain")
