"""What IAM would know about the resources a request names, read from moto's state at call time.

Only what the stack's conditions test is read: the tags of instances and security groups
(`aws:ResourceTag/*`, `ssm:resourceTag/*`), the owner of an image (`ec2:Owner`) and a secret's full
ARN (a request may name it by name). Read from moto's backends directly, so recording a call makes
no call of its own. A resource moto does not know yields nothing, and the check then sees no tag.
"""

from __future__ import annotations

from typing import Any

ACCOUNT = "123456789012"
"""moto's default account: every test in this suite runs in it."""


def _ec2(region: str) -> Any:
    from moto.ec2.models import ec2_backends

    return ec2_backends[ACCOUNT][region]


def _tags(region: str, resource_ids: list[str]) -> dict[str, dict[str, str]]:
    """Tags per resource id; an id moto does not hold (the call fails there anyway) is left out."""
    if not resource_ids:
        return {}
    backend = _ec2(region)
    known = [r for r in resource_ids if _exists(backend, r)]
    found: dict[str, dict[str, str]] = {rid: {} for rid in known}
    if known:
        for tag in backend.describe_tags(filters={"resource-id": known}):
            found.setdefault(tag["resource_id"], {})[tag["key"]] = tag["value"]
    return found


def _exists(backend: Any, resource_id: str) -> bool:
    if resource_id.startswith("i-"):
        return backend.get_instance_by_id(resource_id) is not None
    if resource_id.startswith("sg-"):
        return backend.get_security_group_from_id(resource_id) is not None
    return True


def _interface_groups(params: dict[str, Any]) -> list[str]:
    return [g for spec in params.get("NetworkInterfaces", []) for g in spec.get("Groups", [])]


def moto_facts(service: str, operation: str, params: dict[str, Any], region: str) -> dict[str, Any]:
    if service == "ec2" and operation in {"TerminateInstances", "StopInstances"}:
        return {"tags": _tags(region, list(params.get("InstanceIds", [])))}
    if service == "ssm" and operation == "SendCommand":
        return {"tags": _tags(region, list(params.get("InstanceIds", [])))}
    if service == "ec2" and operation == "CreateTags":  # a regroup's generation tag, on existing instances
        return {"tags": _tags(region, [r for r in params.get("Resources", []) if r.startswith("i-")])}
    if service == "ec2" and operation in {"AuthorizeSecurityGroupIngress", "DeleteSecurityGroup"}:
        return {"tags": _tags(region, [params["GroupId"]] if "GroupId" in params else [])}
    if service == "ec2" and operation == "RunInstances":
        groups = _interface_groups(params) + list(params.get("SecurityGroupIds", []))
        facts: dict[str, Any] = {"tags": _tags(region, groups)}
        template = params.get("LaunchTemplate", {}).get("LaunchTemplateId")
        if template:
            version = _ec2(region).get_launch_template(template).default_version()
            image = _ec2(region).amis.get(version.image_id)
            if image is not None:
                facts["image"] = {"id": image.id, "owner": image.owner_alias or image.owner_id}
        return facts
    if service == "secretsmanager" and operation == "GetSecretValue":
        from moto.secretsmanager.models import secretsmanager_backends

        secret = secretsmanager_backends[ACCOUNT][region].secrets.get(params.get("SecretId", ""))
        return {"arn": secret.arn} if secret is not None else {}
    return {}


def moto_binding_facts(binding: dict[str, str], region: str) -> dict[str, str]:
    """The stack's VPC (its security group's), which the policies name and no setting does."""
    found = {"REGION": region}
    group = binding.get("SECURITY_GROUP_ID")
    if group:
        described = _ec2(region).get_security_group_from_id(group)
        if described is not None:
            found["VPC_ID"] = described.vpc_id
    return found
