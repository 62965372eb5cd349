"""The IAM policies of the stack's principals, as CloudFormation would deploy them for one stack.

template.yaml is transformed by SAM's own translator (`samtranslator`, the library `sam deploy`
and cfn-lint use), so the roles SAM generates, its policy templates (DynamoDBCrudPolicy, ...) and
the managed policies it attaches are the real ones. Intrinsics are then resolved with the names the
code ran with (a `Binding`: the Lambda settings, which name the stack's table, bucket, bus, ...),
parameters take their defaults unless the binding overrides them, and conditions are evaluated.

AWS-managed policies are not in the template: the ones the functions' roles attach are written out
in `AWS_MANAGED` (AWS's managed policy reference); a role attaching one not listed there fails the
check. The instance role attaches none (its statements are the template's own).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from gpujobs_local.template import TEMPLATE_PATH
from tests.iam.facts import ACCOUNT

Statement = dict[str, Any]
FUNCTION_ROLES = {
    "SubmitFunction",
    "SpotFunction",
    "InstanceStateFunction",
    "ReportsFunction",
    "IdleFunction",
    "BudgetFunction",
    "ReconcilerFunction",
    "CredentialsFunction",
    "PublisherFunction",
}
PRINCIPALS = FUNCTION_ROLES | {"InstanceRole", "JobRole"}

AWS_MANAGED: dict[str, list[Statement]] = {
    "AWSLambdaBasicExecutionRole": [
        {
            "Effect": "Allow",
            "Action": ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"],
            "Resource": "*",
        }
    ],
    "AWSXrayWriteOnlyAccess": [
        {
            "Effect": "Allow",
            "Action": [
                "xray:PutTraceSegments",
                "xray:PutTelemetryRecords",
                "xray:GetSamplingRules",
                "xray:GetSamplingTargets",
                "xray:GetSamplingStatisticSummaries",
            ],
            "Resource": "*",
        }
    ],
    "AWSLambdaDynamoDBExecutionRole": [
        {
            "Effect": "Allow",
            "Action": [
                "dynamodb:DescribeStream",
                "dynamodb:GetRecords",
                "dynamodb:GetShardIterator",
                "dynamodb:ListStreams",
                "logs:CreateLogGroup",
                "logs:CreateLogStream",
                "logs:PutLogEvents",
            ],
            "Resource": "*",
        }
    ],
    "AWSLambdaSQSQueueExecutionRole": [
        {
            "Effect": "Allow",
            "Action": ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"],
            "Resource": "*",
        }
    ],
}


class Binding(dict[str, str]):
    """The settings a call ran with (tests.iam.recorder.BINDING_ENV), plus REGION and VPC_ID."""


@cache
def rendered(parameters_json: str = "{}", template_path: str = str(TEMPLATE_PATH)) -> dict[str, Any]:
    """A template (template.yaml unless told) through SAM's translator (artifacts named as `sam
    package` would upload them; AWS::LanguageExtensions only touches the log group's DeletionPolicy)."""
    import boto3
    from samtranslator.parser.parser import Parser
    from samtranslator.translator.translator import Translator
    from samtranslator.yaml_helper import yaml_parse

    template = yaml_parse(Path(template_path).read_text(encoding="utf-8"))
    template["Transform"] = [t for t in _as_list(template.get("Transform")) if t != "AWS::LanguageExtensions"]
    template["Transform"] = template["Transform"][0] if len(template["Transform"]) == 1 else template["Transform"]
    for res in template["Resources"].values():
        for key in ("CodeUri", "ContentUri"):
            if isinstance(res.get("Properties", {}).get(key), str):
                res["Properties"][key] = f"s3://artifacts/{res['Properties'][key]}"
    translator = Translator(None, Parser(), boto_session=boto3.session.Session(region_name="us-east-1"))
    values = {"AWS::AccountId": ACCOUNT, "AWS::StackName": "gpujobs", **json.loads(parameters_json)}
    result: dict[str, Any] = translator.translate(template, parameter_values=values, get_managed_policy_map=dict)
    return result


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


_NO_VALUE = object()
_SUB = re.compile(r"\$\{([^}!][^}]*)\}")


class Resolver:
    """Intrinsics of the rendered template, for one binding and parameter set."""

    def __init__(self, template: dict[str, Any], binding: Mapping[str, str], parameters: Mapping[str, Any]) -> None:
        self.template = template
        region = binding.get("REGION", "us-east-1")
        stack = binding.get("GPUJOBS_STACK_NAME", "gpujobs")
        self.refs: dict[str, Any] = {
            name: spec["Default"] for name, spec in template.get("Parameters", {}).items() if "Default" in spec
        }
        for name, spec in template.get("Parameters", {}).items():
            if "List" in spec.get("Type", "") and isinstance(self.refs.get(name), str):
                self.refs[name] = list(self.refs[name].split(",")) if self.refs[name] else [""]
        self.refs.update(
            {
                "AWS::Region": region,
                "AWS::AccountId": ACCOUNT,
                "AWS::Partition": "aws",
                "AWS::StackName": stack,
                "AWS::URLSuffix": "amazonaws.com",
            }
        )
        env_params = {
            "AllowedInstanceTypes": ("ALLOWED_INSTANCE_TYPES", True),
            "SubnetIds": ("SUBNET_IDS", True),
            "TeamsParameterName": ("TEAMS_PARAMETER", False),
            "VpcId": ("VPC_ID", False),
        }
        for parameter, (variable, is_list) in env_params.items():
            if binding.get(variable):
                self.refs[parameter] = binding[variable].split(",") if is_list else binding[variable]
        self.refs.update(parameters)
        queue_url = binding.get("JOBS_QUEUE_URL", f"https://sqs.{region}.amazonaws.com/{ACCOUNT}/{stack}-JobsQueue")
        bucket = binding.get("CHECKPOINT_BUCKET", f"{stack}-checkpointbucket")
        bus = binding.get("EVENT_BUS_NAME", f"{stack}-jobs")
        self.physical: dict[str, dict[str, str]] = {
            "JobsTable": {"Ref": binding.get("JOBS_TABLE", f"{stack}-JobsTable")},
            "CheckpointBucket": {"Ref": bucket, "Arn": f"arn:aws:s3:::{bucket}"},
            "JobsEventBus": {"Ref": bus, "Arn": f"arn:aws:events:{region}:{ACCOUNT}:event-bus/{bus}"},
            "JobsQueue": {"Ref": queue_url, "Arn": f"arn:aws:sqs:{region}:{ACCOUNT}:{queue_url.rsplit('/', 1)[-1]}"},
            "InstanceLaunchTemplate": {"Ref": binding.get("LAUNCH_TEMPLATE_ID", "lt-0stack")},
            "InstanceSecurityGroup": {"Ref": binding.get("SECURITY_GROUP_ID", "sg-0stack")},
            "CheckpointNowDocument": {"Ref": binding.get("CHECKPOINT_DOCUMENT", f"{stack}-CheckpointNowDocument")},
            "ReportSecret": {
                "Ref": binding.get("REPORT_SECRET_ARN", f"arn:aws:secretsmanager:{region}:{ACCOUNT}:secret:report")
            },
            "JobRole": {"Arn": binding.get("JOB_ROLE_ARN", f"arn:aws:iam::{ACCOUNT}:role/{stack}-JobRole")},
            "InstanceRole": {
                "Arn": f"arn:aws:iam::{ACCOUNT}:role/{stack}-InstanceRole",
                "Ref": f"{stack}-InstanceRole",
            },
            "JobLogGroup": {"Ref": binding.get("JOB_LOG_GROUP", f"/gpujobs/{stack}/jobs")},
        }
        self.physical["InstanceSecurityGroup"]["GroupId"] = self.physical["InstanceSecurityGroup"]["Ref"]

    def _attribute(self, logical_id: str, attribute: str) -> str:
        if logical_id in self.physical and attribute in self.physical[logical_id]:
            return self.physical[logical_id][attribute]
        region, stack = self.refs["AWS::Region"], self.refs["AWS::StackName"]
        resource_type = self.template["Resources"].get(logical_id, {}).get("Type", "")
        name = f"{stack}-{logical_id}"
        if attribute == "Ref" and resource_type == "AWS::SNS::Topic":
            return f"arn:aws:sns:{region}:{ACCOUNT}:{name}"
        if attribute == "Ref":
            return name
        if attribute == "QueueName":
            return name
        if attribute == "Arn" and resource_type == "AWS::SQS::Queue":
            return f"arn:aws:sqs:{region}:{ACCOUNT}:{name}"
        if attribute == "Arn" and resource_type == "AWS::Lambda::Function":
            return f"arn:aws:lambda:{region}:{ACCOUNT}:function:{name}"
        if attribute == "Arn" and resource_type == "AWS::IAM::Role":
            return f"arn:aws:iam::{ACCOUNT}:role/{name}"
        return f"arn:aws:resource:{region}:{ACCOUNT}:{name}/{attribute}"

    def condition(self, name: str) -> bool:
        return self._condition(self.template.get("Conditions", {})[name])

    def _condition(self, expression: Any) -> bool:
        ((key, arg),) = expression.items()
        if key == "Condition":
            return self.condition(arg)
        if key == "Fn::Not":
            return not self._condition(arg[0])
        if key == "Fn::And":
            return all(self._condition(a) for a in arg)
        if key == "Fn::Or":
            return any(self._condition(a) for a in arg)
        if key == "Fn::Equals":
            left, right = (self.resolve(a) for a in arg)
            return str(left) == str(right)
        raise ValueError(f"unknown condition {expression!r}")

    def resolve(self, value: Any) -> Any:
        if isinstance(value, list):
            return [v for v in (self.resolve(i) for i in value) if v is not _NO_VALUE]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            ((key, arg),) = value.items()
            if key == "Ref":
                if arg == "AWS::NoValue":
                    return _NO_VALUE
                if arg in self.refs:
                    return self.refs[arg]
                managed = self.template["Resources"].get(arg, {}).get("Type") == "AWS::IAM::ManagedPolicy"
                return f"managed-policy:{arg}" if managed else self._attribute(arg, "Ref")
            if key == "Fn::GetAtt":
                logical_id, attribute = arg if isinstance(arg, list) else arg.split(".", 1)
                return self._attribute(logical_id, attribute)
            if key == "Fn::If":
                name, yes, no = arg
                return self.resolve(yes if self.condition(name) else no)
            if key == "Fn::Join":
                separator, items = arg
                return separator.join(str(i) for i in self.resolve(items))
            if key == "Fn::Split":
                separator, text = arg
                return str(self.resolve(text)).split(separator)
            if key == "Fn::Select":
                index, items = arg
                return self.resolve(items)[int(self.resolve(index))]
            if key == "Fn::Sub":
                text, variables = (arg, {}) if isinstance(arg, str) else arg
                local = {k: self.resolve(v) for k, v in variables.items()}

                def substitute(match: re.Match[str]) -> str:
                    name = match.group(1)
                    if name in local:
                        return str(local[name])
                    if name in self.refs:
                        found = self.refs[name]
                        return ",".join(found) if isinstance(found, list) else str(found)
                    logical_id, _, attribute = name.partition(".")
                    return self._attribute(logical_id, attribute or "Ref")

                return _SUB.sub(substitute, text).replace("${!", "${")
        resolved = {k: self.resolve(v) for k, v in value.items()}
        return {k: v for k, v in resolved.items() if v is not _NO_VALUE}


def _statements(document: Any) -> list[Statement]:
    found = document.get("Statement", []) if isinstance(document, dict) else []
    return [s for s in _as_list(found) if isinstance(s, dict)]


def principal_policies(
    principal: str, binding: Mapping[str, str], parameters: Mapping[str, Any] | None = None
) -> list[Statement]:
    """Every identity-policy statement of `principal` (a function's logical id, InstanceRole, JobRole)."""
    key = json.dumps({"p": principal, "b": dict(binding), "x": dict(parameters or {})}, sort_keys=True)
    return copy.deepcopy(_principal_policies(key))


@cache
def _principal_policies(key: str) -> list[Statement]:
    spec = json.loads(key)
    template = rendered()
    resolver = Resolver(template, spec["b"], spec["x"])
    resources = template["Resources"]
    role_id = spec["p"] if spec["p"] in ("InstanceRole", "JobRole") else f"{spec['p']}Role"
    role = resolver.resolve(resources[role_id]["Properties"])
    statements: list[Statement] = []
    for policy in role.get("Policies", []):
        statements += _statements(policy.get("PolicyDocument"))
    for arn in role.get("ManagedPolicyArns", []):
        if str(arn).startswith("managed-policy:"):
            logical_id = str(arn).split(":", 1)[1]
            statements += _statements(resolver.resolve(resources[logical_id]["Properties"]["PolicyDocument"]))
            continue
        name = str(arn).rsplit("/", 1)[-1]
        if name not in AWS_MANAGED:
            raise KeyError(f"{role_id} attaches {arn}, whose statements tests/iam/stack_policies.py does not hold")
        statements += copy.deepcopy(AWS_MANAGED[name])
    for res in resources.values():  # AWS::IAM::Policy resources attached to the role
        if res.get("Type") == "AWS::IAM::Policy":
            props = resolver.resolve(res["Properties"])
            if resolver.physical.get(role_id, {}).get(
                "Ref", f"{resolver.refs['AWS::StackName']}-{role_id}"
            ) in props.get("Roles", []):
                statements += _statements(props.get("PolicyDocument"))
    return statements
