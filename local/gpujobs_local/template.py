"""Read template.yaml so that tests build their AWS fakes from the stack's own definitions.

Why: a moto table, queue or launch template written out by hand in a test drifts from the deployed
one the first time someone adds an index or changes a timeout, and the tests keep passing against a
stack that no longer exists. Building the fakes from template.yaml means a change to the template is
a change to what the integration tests run against, and an index the code needs but the template
lacks fails here rather than in an account.

CloudFormation's short-form tags (``!Ref``, ``!GetAtt``, ``!Sub`` ...) are not YAML that a plain
``yaml.safe_load`` understands, so :class:`CloudFormationLoader` turns each into its long form
(``{"Ref": x}``, ``{"Fn::GetAtt": [resource, attribute]}``, ...). Intrinsics are resolved only where a
caller asks for concrete data (:func:`launch_template_data`), and an intrinsic this module does not
know how to resolve raises rather than passing through silently.
"""

from __future__ import annotations

import copy
import json
import re
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from types_boto3_ec2.type_defs import RequestLaunchTemplateDataTypeDef

TEMPLATE_PATH = Path(__file__).resolve().parents[2] / "template.yaml"

_SHORT_FORMS = {
    "!Ref": "Ref",
    "!Condition": "Condition",
    "!GetAtt": "Fn::GetAtt",
    "!Sub": "Fn::Sub",
    "!Join": "Fn::Join",
    "!If": "Fn::If",
    "!Equals": "Fn::Equals",
    "!Not": "Fn::Not",
    "!And": "Fn::And",
    "!Or": "Fn::Or",
    "!Select": "Fn::Select",
    "!Split": "Fn::Split",
    "!FindInMap": "Fn::FindInMap",
    "!GetAZs": "Fn::GetAZs",
    "!Base64": "Fn::Base64",
    "!ImportValue": "Fn::ImportValue",
    "!Cidr": "Fn::Cidr",
}


class TemplateError(Exception):
    """The template lacks something a test needs, or holds an intrinsic this module cannot resolve."""


class CloudFormationLoader(yaml.SafeLoader):
    """A SafeLoader that reads CloudFormation short-form tags as their long (JSON) form."""


def _short_form_constructor(long_name: str) -> Any:
    def construct(loader: yaml.SafeLoader, node: yaml.Node) -> dict[str, Any]:
        value: Any
        if isinstance(node, yaml.ScalarNode):
            value = loader.construct_scalar(node)
            if long_name == "Fn::GetAtt":
                value = str(value).split(".", 1)
        elif isinstance(node, yaml.SequenceNode):
            value = loader.construct_sequence(node, deep=True)
        else:
            value = loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]
        return {long_name: value}

    return construct


for _tag, _long_name in _SHORT_FORMS.items():
    CloudFormationLoader.add_constructor(_tag, _short_form_constructor(_long_name))


@cache
def _load(path: Path) -> dict[str, Any]:
    with path.open(encoding="utf-8") as f:
        loaded = yaml.load(f, Loader=CloudFormationLoader)  # noqa: S506 - a SafeLoader subclass: no arbitrary objects
    if not isinstance(loaded, dict):
        raise TemplateError(f"{path} is not a mapping")
    return loaded


def load_template(path: Path = TEMPLATE_PATH) -> dict[str, Any]:
    """The template as plain data, intrinsics in long form. A fresh copy: callers may mutate it."""
    return copy.deepcopy(_load(path))


def resource(logical_id: str) -> dict[str, Any]:
    """One resource (Type, Properties, ...) by logical id."""
    resources = load_template()["Resources"]
    if logical_id not in resources:
        raise TemplateError(f"template.yaml has no resource {logical_id!r}")
    found: dict[str, Any] = resources[logical_id]
    return found


def properties(logical_id: str) -> dict[str, Any]:
    props: dict[str, Any] = resource(logical_id).get("Properties", {})
    return props


def resources_of_type(resource_type: str) -> dict[str, dict[str, Any]]:
    """Logical id -> resource, for every resource of one type."""
    return {
        logical_id: res for logical_id, res in load_template()["Resources"].items() if res.get("Type") == resource_type
    }


def event_sources(function: str, kind: str) -> dict[str, dict[str, Any]]:
    """A function's `Events:` of one type (SQS, DynamoDB, ...), name -> properties."""
    events = properties(function).get("Events", {})
    return {name: dict(e.get("Properties", {})) for name, e in events.items() if e.get("Type") == kind}


def parameter_default(name: str) -> Any:
    parameters = load_template().get("Parameters", {})
    if name not in parameters or "Default" not in parameters[name]:
        raise TemplateError(f"template.yaml has no parameter {name!r} with a default")
    return parameters[name]["Default"]


def function_properties(logical_id: str) -> dict[str, Any]:
    """A serverless function's properties as SAM deploys them: Globals.Function, then its own.

    Environment variables merge key by key, as SAM merges them; other keys are replaced.
    """
    template = load_template()
    merged: dict[str, Any] = copy.deepcopy(template.get("Globals", {}).get("Function", {}))
    own = properties(logical_id)
    for key, value in own.items():
        if key == "Environment":
            variables = merged.setdefault("Environment", {}).setdefault("Variables", {})
            variables.update(value.get("Variables", {}))
        else:
            merged[key] = value
    return merged


# ------------------------------------------------------------------------------------------- table
def table_definition(logical_id: str = "JobsTable", *, table_name: str | None = None) -> dict[str, Any]:
    """Keyword arguments for ``dynamodb.create_table`` built from the template's table.

    ``TableName`` is added only when given, so ``create_table(TableName=name, **table_definition())``
    works too. Point-in-time recovery and deletion protection are account settings that a test table
    does not need (and PITR is a separate API), so they are left out.
    """
    props = properties(logical_id)
    kwargs: dict[str, Any] = {
        "BillingMode": props["BillingMode"],
        "KeySchema": props["KeySchema"],
        "AttributeDefinitions": props["AttributeDefinitions"],
    }
    indexes = props.get("GlobalSecondaryIndexes")
    if indexes:
        kwargs["GlobalSecondaryIndexes"] = [
            {"IndexName": i["IndexName"], "KeySchema": i["KeySchema"], "Projection": i["Projection"]} for i in indexes
        ]
    stream = props.get("StreamSpecification")
    if stream:
        # CloudFormation enables the stream by naming its view; the DynamoDB API asks for both.
        kwargs["StreamSpecification"] = {"StreamEnabled": True, "StreamViewType": stream["StreamViewType"]}
    sse = props.get("SSESpecification")
    if sse:
        # CloudFormation spells it SSEEnabled; the DynamoDB API spells it Enabled.
        kwargs["SSESpecification"] = {"Enabled": bool(sse["SSEEnabled"])}
    if table_name is not None:
        kwargs["TableName"] = table_name
    return kwargs


def table_index_names(logical_id: str = "JobsTable") -> list[str]:
    return [i["IndexName"] for i in properties(logical_id).get("GlobalSecondaryIndexes", [])]


# ------------------------------------------------------------------------------------------- queue
def queue_visibility_timeout(logical_id: str = "JobsQueue") -> int:
    return int(properties(logical_id)["VisibilityTimeout"])


def queue_redrive_max_receive_count(logical_id: str = "JobsQueue") -> int:
    return int(properties(logical_id)["RedrivePolicy"]["maxReceiveCount"])


def queue_dead_letter_logical_id(logical_id: str = "JobsQueue") -> str:
    target = properties(logical_id)["RedrivePolicy"]["deadLetterTargetArn"]
    if "Fn::GetAtt" not in target:
        raise TemplateError(f"{logical_id} redrives to {target!r}, not to a queue of this stack")
    dlq: str = target["Fn::GetAtt"][0]
    return dlq


def queue_attributes(logical_id: str = "JobsQueue", *, dead_letter_arn: str | None = None) -> dict[str, str]:
    """``sqs.create_queue(Attributes=...)`` for a template queue (SQS attributes are strings).

    A queue with a redrive policy needs the ARN of the dead-letter queue the caller created first.
    """
    props = properties(logical_id)
    attributes: dict[str, str] = {}
    for name in ("VisibilityTimeout", "MessageRetentionPeriod", "DelaySeconds", "ReceiveMessageWaitTimeSeconds"):
        if name in props:
            attributes[name] = str(props[name])
    if "RedrivePolicy" in props:
        if dead_letter_arn is None:
            raise TemplateError(f"{logical_id} has a redrive policy: pass dead_letter_arn")
        attributes["RedrivePolicy"] = json.dumps(
            {"deadLetterTargetArn": dead_letter_arn, "maxReceiveCount": queue_redrive_max_receive_count(logical_id)}
        )
    return attributes


# --------------------------------------------------------------------------------- launch template
_SUB_VARIABLE = re.compile(r"\$\{([^}!]+)\}")


_NO_VALUE = object()
"""What `Ref: AWS::NoValue` resolves to: the key or item holding it is dropped, as CloudFormation does."""


def condition_value(name: str, refs: dict[str, Any]) -> bool:
    """A condition of the template's `Conditions`, with parameter values from `refs`."""
    conditions = load_template().get("Conditions", {})
    if name not in conditions:
        raise TemplateError(f"template.yaml has no condition {name!r}")
    return _condition(conditions[name], refs)


def _condition(expression: Any, refs: dict[str, Any]) -> bool:
    ((key, arg),) = expression.items()
    if key == "Condition":
        return condition_value(arg, refs)
    if key == "Fn::Not":
        return not _condition(arg[0], refs)
    if key == "Fn::And":
        return all(_condition(a, refs) for a in arg)
    if key == "Fn::Or":
        return any(_condition(a, refs) for a in arg)
    if key == "Fn::Equals":
        left, right = (_resolve(a, refs, {}) for a in arg)
        return str(left) == str(right)
    raise TemplateError(f"cannot evaluate condition {expression!r}")


def _resolve(value: Any, refs: dict[str, Any], attributes: dict[str, Any]) -> Any:
    resolved = _resolve_or_drop(value, refs, attributes)
    if resolved is _NO_VALUE:
        raise TemplateError(f"{value!r} resolves to AWS::NoValue")
    return resolved


def _resolve_or_drop(value: Any, refs: dict[str, Any], attributes: dict[str, Any]) -> Any:
    if isinstance(value, list):
        listed = [_resolve_or_drop(v, refs, attributes) for v in value]
        return [i for i in listed if i is not _NO_VALUE]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        ((key, arg),) = value.items()
        if key == "Ref" and arg == "AWS::NoValue":
            return _NO_VALUE
        if key == "Fn::If":
            name, when_true, when_false = arg
            return _resolve_or_drop(when_true if condition_value(name, refs) else when_false, refs, attributes)
        if key == "Fn::Join":
            separator, joined = arg
            resolved = _resolve(joined, refs, attributes)
            if isinstance(resolved, str):  # a CommaDelimitedList parameter's default, as written
                resolved = resolved.split(",")
            return separator.join(str(i) for i in resolved)
        if key == "Ref":
            if arg not in refs:
                raise TemplateError(f"no test value for Ref {arg!r}")
            return refs[arg]
        if key == "Fn::GetAtt":
            name = ".".join(arg)
            if name not in attributes:
                raise TemplateError(f"no test value for GetAtt {name!r}")
            return attributes[name]
        if key == "Fn::Sub" and isinstance(arg, str):
            lookup = {**refs, **attributes}

            def substitute(match: re.Match[str]) -> str:
                if match.group(1) not in lookup:
                    raise TemplateError(f"no test value for ${{{match.group(1)}}} in {arg!r}")
                return str(lookup[match.group(1)])

            return _SUB_VARIABLE.sub(substitute, arg).replace("${!", "${")  # ${!x} is CloudFormation's literal ${x}
        if key.startswith("Fn::") or key == "Condition":
            raise TemplateError(f"cannot resolve {key} in {value!r}")
    fields = {k: _resolve_or_drop(v, refs, attributes) for k, v in value.items()}
    return {k: v for k, v in fields.items() if v is not _NO_VALUE}


def launch_template_data(
    *,
    image_id: str,
    instance_profile_arn: str,
    stack_name: str,
    logical_id: str = "InstanceLaunchTemplate",
    parameters: dict[str, Any] | None = None,
) -> RequestLaunchTemplateDataTypeDef:
    """The launch template's ``LaunchTemplateData`` with intrinsics replaced by test values.

    ``ImageId`` becomes ``image_id`` (the template resolves an SSM parameter at launch, which moto
    cannot), the instance profile ARN and the stack name come from the caller, and other parameter
    references take the template's defaults unless ``parameters`` overrides them. The result is ready
    for ``ec2.create_launch_template(LaunchTemplateName=..., LaunchTemplateData=...)``.
    """
    template = load_template()
    refs: dict[str, Any] = {
        name: spec["Default"] for name, spec in template.get("Parameters", {}).items() if "Default" in spec
    }
    refs.update(parameters or {})
    refs["AWS::StackName"] = stack_name
    attributes = {"InstanceProfile.Arn": instance_profile_arn}
    data = copy.deepcopy(properties(logical_id)["LaunchTemplateData"])
    data["ImageId"] = image_id
    resolved: RequestLaunchTemplateDataTypeDef = _resolve(data, refs, attributes)
    return resolved


# ------------------------------------------------------------------------------------------- IAM
def policy_statements(logical_id: str) -> list[dict[str, Any]]:
    """Every inline IAM statement of a function (SAM ``Policies``) or role (``Policies``).

    SAM policy templates (``DynamoDBCrudPolicy: {...}``) and managed policy names are not expanded.
    """
    res = resource(logical_id)
    statements: list[dict[str, Any]] = []
    for policy in res.get("Properties", {}).get("Policies", []):
        if not isinstance(policy, dict):
            continue
        document = policy.get("PolicyDocument", policy)
        found = document.get("Statement", [])
        statements.extend([found] if isinstance(found, dict) else found)
    return statements


def role_documents(logical_id: str, *, stack_name: str, attributes: dict[str, Any]) -> tuple[str, str]:
    """A role's trust policy and inline policy as JSON, intrinsics replaced by `attributes` and the stack's values.

    Statements behind a condition (``Fn::If``, e.g. data buckets given as a parameter) are left out:
    the parameters they depend on default to empty.
    """
    refs = {"AWS::StackName": stack_name, "AWS::Partition": "aws", "AWS::Region": "us-east-1"}
    refs["AWS::AccountId"] = "123456789012"
    role = properties(logical_id)
    statements = [s for s in policy_statements(logical_id) if "Fn::If" not in s]
    policy = {"Version": "2012-10-17", "Statement": _resolve(statements, refs, attributes)}
    return json.dumps(_resolve(role["AssumeRolePolicyDocument"], refs, attributes)), json.dumps(policy)


def as_list(value: Any) -> list[Any]:
    """IAM lets Action, Resource and condition values be one item or a list."""
    return value if isinstance(value, list) else [value]
