"""EC2 behind the Compute port: RunInstances from the stack's launch template, tag lookups, terminate.

Capacity refusals become CapacityError so the service walks to the next rung (a vCPU quota's,
QuotaExceededError, so the job can say which quota); throttling and
service errors propagate unchanged so the SQS record is retried; anything else is a
LaunchRejectedError that no other rung would fix. Every instance and volume is tagged on create,
which is also what the IAM policy requires before RunInstances is allowed at all.

Its network interfaces follow `domain.hardware`: one plain interface, or on an EFA type of a
multi-node gang an EFA interface on every network card; none gets a public IP.

A multi-node gang launches into a cluster placement group made for its attempt and tagged like its
instances; the reconciler deletes the groups of ended attempts, because a Region holds only 500
(`PlacementGroupLimitExceeded`, a CapacityError: the job waits, it does not fail).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from botocore.exceptions import ClientError

from gpujobs.contract import (
    ATTEMPT_TAG,
    GENERATION_TAG,
    JOB_TAG,
    LIVE_STATES,
    NAME_TAG,
    STACK_TAG,
    TEAM_TAG,
    instance_display_name,
    job_security_group_name,
)
from gpujobs.domain.hardware import InterfaceType, network_interfaces
from gpujobs.domain.job import Market
from gpujobs.service.ports import (
    CapacityError,
    JobSecurityGroup,
    LaunchedInstance,
    LaunchRejectedError,
    LaunchRequest,
    LaunchTokenMismatchError,
    PlacementGroup,
    QuotaExceededError,
    Subnet,
    TaggedInstance,
)

if TYPE_CHECKING:
    from types_boto3_ec2 import EC2Client
    from types_boto3_ec2.literals import InstanceTypeType
    from types_boto3_ec2.type_defs import (
        FilterTypeDef,
        InstanceNetworkInterfaceSpecificationTypeDef,
        InstanceTypeDef,
        RunInstancesRequestTypeDef,
        TagTypeDef,
    )


class Ec2Compute:
    def __init__(
        self,
        *,
        client: EC2Client,
        launch_template_id: str,
        security_group_id: str,
        subnet_ids: Sequence[str],
        stack_name: str,
    ) -> None:
        self._ec2 = client
        self._launch_template_id = launch_template_id
        self._security_group_id = security_group_id
        self._subnet_ids = list(subnet_ids)
        self._stack = stack_name

    @functools.cache  # noqa: B019 - one adapter per Lambda container; subnets do not move zones
    def subnets(self) -> Sequence[Subnet]:
        if not self._subnet_ids:
            return ()
        found = self._ec2.describe_subnets(SubnetIds=self._subnet_ids)["Subnets"]
        zones = {s["SubnetId"]: s["AvailabilityZone"] for s in found}
        return tuple(Subnet(sid, zones[sid]) for sid in self._subnet_ids if sid in zones)

    def tags(self, request: LaunchRequest) -> list[TagTypeDef]:
        tags: list[TagTypeDef] = [
            {"Key": STACK_TAG, "Value": self._stack},
            {"Key": JOB_TAG, "Value": request.job_id},
            {"Key": ATTEMPT_TAG, "Value": str(request.attempt)},
            {"Key": TEAM_TAG, "Value": request.team},
            {"Key": NAME_TAG, "Value": instance_display_name(request.name, request.attempt)},
        ]
        if request.generation:  # a regroup's replacement (absent: generation 0)
            tags.append({"Key": GENERATION_TAG, "Value": str(request.generation)})
        return tags

    def network_interfaces(self, request: LaunchRequest) -> list[InstanceNetworkInterfaceSpecificationTypeDef]:
        """`domain.hardware`'s layout, each in the rung's subnet and the stack's and job's groups, no public IP."""
        groups = [self._security_group_id, *filter(None, [request.security_group_id])]
        layout = network_interfaces(request.efa_interfaces)
        specs: list[InstanceNetworkInterfaceSpecificationTypeDef] = []
        for interface in layout:
            spec: InstanceNetworkInterfaceSpecificationTypeDef = {
                "NetworkCardIndex": interface.network_card_index,
                "DeviceIndex": interface.device_index,
                "SubnetId": request.subnet.subnet_id,
                "Groups": groups,
                "DeleteOnTermination": True,
            }
            if interface.interface_type is InterfaceType.EFA:
                spec["InterfaceType"] = interface.interface_type.value
            # EC2 refuses the key when several interfaces launch, and then assigns no public IP anyway.
            if len(layout) == 1:
                spec["AssociatePublicIpAddress"] = False
            specs.append(spec)
        return specs

    def run_instances(self, request: LaunchRequest) -> list[LaunchedInstance]:
        tags = self.tags(request)
        params: RunInstancesRequestTypeDef = {
            "LaunchTemplate": {"LaunchTemplateId": self._launch_template_id, "Version": "$Default"},
            # The stubs list today's instance types as a Literal; EC2 takes any name (new types arrive first).
            "InstanceType": cast("InstanceTypeType", request.instance_type),
            "MinCount": request.count,
            "MaxCount": request.count,
            "ClientToken": request.client_token,
            # The stubs say str, but botocore base64-encodes str or bytes (gzipped user data is bytes).
            "UserData": cast("str", request.user_data),
            "NetworkInterfaces": self.network_interfaces(request),
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": tags},
                {"ResourceType": "volume", "Tags": tags},
            ],
        }
        if request.market is Market.SPOT:
            params["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
            }
        try:
            if request.placement_group:
                self._ensure_placement_group(request.placement_group, tags)
                params["Placement"] = {"GroupName": request.placement_group}
            response = self._ec2.run_instances(**params)
        except ClientError as exc:
            error = exc.response.get("Error", {})
            code, message = str(error.get("Code", "Unknown")), str(error.get("Message", ""))
            if code == "IdempotentParameterMismatch":
                raise LaunchTokenMismatchError(request.client_token, message) from exc
            from gpujobs.domain.ladder import ErrorKind, classify_launch_error  # launches only

            kind = classify_launch_error(code)
            if kind is ErrorKind.QUOTA:
                raise QuotaExceededError(code, message) from exc
            if kind is ErrorKind.NEXT_RUNG:
                raise CapacityError(code, message) from exc
            if kind is ErrorKind.TRANSIENT:
                raise
            raise LaunchRejectedError(code, message) from exc
        return [_launched(i) for i in response["Instances"]]

    def _ensure_placement_group(self, name: str, tags: list[TagTypeDef]) -> None:
        try:
            self._ec2.create_placement_group(
                GroupName=name,
                Strategy="cluster",
                TagSpecifications=[{"ResourceType": "placement-group", "Tags": tags}],
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "InvalidPlacementGroup.Duplicate":
                raise

    def list_placement_groups(self) -> list[PlacementGroup]:
        filters: list[FilterTypeDef] = [
            {"Name": f"tag:{STACK_TAG}", "Values": [self._stack]},
            {"Name": "state", "Values": ["pending", "available"]},
        ]
        found: list[PlacementGroup] = []
        for group in self._ec2.describe_placement_groups(Filters=filters)["PlacementGroups"]:
            tags = {t["Key"]: t["Value"] for t in group.get("Tags", [])}
            attempt = tags.get(ATTEMPT_TAG, "")
            if JOB_TAG in tags and attempt.isdecimal():
                found.append(PlacementGroup(group["GroupName"], tags[JOB_TAG], int(attempt)))
        return found

    def delete_placement_group(self, name: str) -> bool:
        try:
            self._ec2.delete_placement_group(GroupName=name)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code == "InvalidPlacementGroup.Unknown":
                return True
            if code == "InvalidPlacementGroup.InUse":
                return False
            raise
        return True

    def find_instances(self, *, job_id: str, attempt: int | None = None) -> list[LaunchedInstance]:
        filters: list[FilterTypeDef] = [
            {"Name": f"tag:{STACK_TAG}", "Values": [self._stack]},
            {"Name": f"tag:{JOB_TAG}", "Values": [job_id]},
            {"Name": "instance-state-name", "Values": list(LIVE_STATES)},
        ]
        if attempt is not None:
            filters.append({"Name": f"tag:{ATTEMPT_TAG}", "Values": [str(attempt)]})
        found: list[LaunchedInstance] = []
        for page in self._ec2.get_paginator("describe_instances").paginate(Filters=filters):
            found += [_launched(i) for r in page["Reservations"] for i in r["Instances"]]
        return sorted(found, key=lambda i: i.launch_index)

    def state_reason(self, instance_id: str) -> str | None:
        reservations = self._ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
        for inst in (i for r in reservations for i in r["Instances"]):
            reason = inst.get("StateReason", {})
            return reason.get("Message") or reason.get("Code") or None
        return None

    def terminate(self, instance_ids: Sequence[str]) -> None:
        if instance_ids:
            self._ec2.terminate_instances(InstanceIds=list(instance_ids))

    def tag_generation(self, instance_ids: Sequence[str], generation: int) -> None:
        if instance_ids:
            tags: list[TagTypeDef] = [{"Key": GENERATION_TAG, "Value": str(generation)}]
            self._ec2.create_tags(Resources=list(instance_ids), Tags=tags)

    def stop(self, instance_ids: Sequence[str]) -> None:
        if instance_ids:
            self._ec2.stop_instances(InstanceIds=list(instance_ids))

    def list_instances(self) -> list[TaggedInstance]:
        filters: list[FilterTypeDef] = [
            {"Name": f"tag:{STACK_TAG}", "Values": [self._stack]},
            {"Name": "instance-state-name", "Values": list(LIVE_STATES)},
        ]
        found: list[TaggedInstance] = []
        for page in self._ec2.get_paginator("describe_instances").paginate(Filters=filters):
            for reservation in page["Reservations"]:
                for inst in reservation["Instances"]:
                    tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
                    attempt = tags.get(ATTEMPT_TAG, "0") or "0"
                    if JOB_TAG not in tags or not attempt.isdecimal():
                        continue  # not a training instance, or one whose tags someone else wrote
                    found.append(
                        TaggedInstance(
                            instance_id=inst["InstanceId"],
                            job_id=tags[JOB_TAG],
                            attempt=int(attempt),
                            state=inst.get("State", {}).get("Name", "unknown"),
                            launched_at=inst["LaunchTime"],
                        )
                    )
        return found

    # ---- a security group per job ---------------------------------------------------------------
    # Instances carry the stack's group (egress, no ingress) and their job's own group, whose one
    # ingress rule admits members of that group only: a gang's rendezvous, NCCL and gloo ports are
    # reachable from its own nodes and from no other job's. Created before the first launch (by
    # name, so a retried launch finds it), deleted by the reconciler once the job is over and its
    # instances are gone (EC2 refuses to delete a group an interface still uses).
    @functools.cached_property
    def _vpc_id(self) -> str:
        (group,) = self._ec2.describe_security_groups(GroupIds=[self._security_group_id])["SecurityGroups"]
        return group["VpcId"]

    def job_security_group(self, job_id: str) -> str:
        name = job_security_group_name(self._stack, job_id)
        tags: list[TagTypeDef] = [{"Key": STACK_TAG, "Value": self._stack}, {"Key": JOB_TAG, "Value": job_id}]
        try:
            group_id = self._ec2.create_security_group(
                GroupName=name,
                Description=f"gpujobs job {job_id}: its own instances only",
                VpcId=self._vpc_id,
                TagSpecifications=[{"ResourceType": "security-group", "Tags": tags}],
            )["GroupId"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "InvalidGroup.Duplicate":
                raise
            filters: list[FilterTypeDef] = [
                {"Name": "group-name", "Values": [name]},
                {"Name": "vpc-id", "Values": [self._vpc_id]},
            ]
            (group,) = self._ec2.describe_security_groups(Filters=filters)["SecurityGroups"]
            group_id = group["GroupId"]
        try:  # again after a duplicate: the launch that created the group may have died before this
            self._ec2.authorize_security_group_ingress(
                GroupId=group_id, IpPermissions=[{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group_id}]}]
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "InvalidPermission.Duplicate":
                raise
        return group_id

    def job_security_groups(self) -> list[JobSecurityGroup]:
        filters: list[FilterTypeDef] = [{"Name": f"tag:{STACK_TAG}", "Values": [self._stack]}]
        found: list[JobSecurityGroup] = []
        for page in self._ec2.get_paginator("describe_security_groups").paginate(Filters=filters):
            for group in page["SecurityGroups"]:
                tags = {t["Key"]: t["Value"] for t in group.get("Tags", [])}
                if JOB_TAG in tags:
                    found.append(JobSecurityGroup(group_id=group["GroupId"], job_id=tags[JOB_TAG]))
        return found

    def delete_security_group(self, group_id: str) -> bool:
        try:
            self._ec2.delete_security_group(GroupId=group_id)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code == "DependencyViolation":
                return False
            if code != "InvalidGroup.NotFound":
                raise
        return True


def _launched(instance: InstanceTypeDef) -> LaunchedInstance:
    tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
    generation = tags.get(GENERATION_TAG, "0")
    return LaunchedInstance(
        instance_id=instance["InstanceId"],
        instance_type=instance["InstanceType"],
        zone=instance.get("Placement", {}).get("AvailabilityZone", ""),
        market=Market.SPOT if instance.get("InstanceLifecycle") == "spot" else Market.ON_DEMAND,
        launch_index=int(instance.get("AmiLaunchIndex", 0)),
        private_ip=instance.get("PrivateIpAddress"),
        state=instance.get("State", {}).get("Name", "pending"),
        generation=int(generation) if generation.isdecimal() else 0,
    )
