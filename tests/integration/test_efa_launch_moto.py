"""A two-node p4d.24xlarge job launches on moto's EC2 with an EFA interface per network card.

The real launch path (JobService -> Ec2Compute -> boto3) against moto, with the packaged hardware
table. What reaches EC2 is read from botocore's own parameters, because moto does not check it:
moto 5.2.5 ignores `InterfaceType` and `NetworkCardIndex` (its instances have plain interfaces on
card 0) and implements no placement groups (the stack answers those, `gpujobs_local`). What moto
does check, and this test asserts: the gang runs, in the rung's subnet, in the stack's and the job's
security groups, the job's group admits its own members on every protocol, and no instance has a
public IP.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import boto3
import pytest

from gpujobs.adapters.catalog import packaged_hardware
from gpujobs.adapters.ec2 import Ec2Compute
from gpujobs.domain.states import JobState
from gpujobs.service.config import LaunchConfig
from gpujobs_local.stack import REGION, MotoStack
from tests.service.conftest import ALLOWED, World, spec

pytestmark = pytest.mark.integration


def test_a_p4d_gang_asks_for_four_efa_interfaces_and_keeps_its_placement_group_and_self_ingress_group(
    stack: MotoStack,
) -> None:
    # given the control plane wired to moto's EC2 with the packaged hardware table
    world = World()
    ec2 = boto3.client("ec2", region_name=REGION)
    sent: list[dict[str, Any]] = []
    ec2.meta.events.register("provide-client-params.ec2.RunInstances", lambda params, **_: sent.append(params))
    world.rewire(
        compute=Ec2Compute(
            client=ec2,
            launch_template_id=stack.launch_template,
            security_group_id=stack.security_group,
            subnet_ids=stack.subnets,
            stack_name=stack.stack_name,
        ),
        config=LaunchConfig(
            checkpoint_bucket="ckpt-bucket",
            event_bus_name="gpujobs-jobs",
            region=REGION,
            allowed_instance_types=ALLOWED,
            hardware=packaged_hardware(),
        ),
    )

    # when a two-node p4d.24xlarge job is submitted
    job = world.store.get(world.submit(spec(nodes=2, instance_types=["p4d.24xlarge"])).job.job_id)

    # then it runs on two instances launched with an EFA on each of the 4 network cards
    assert job.state is JobState.RUNNING, job.status_detail
    (params,) = sent
    interfaces = params["NetworkInterfaces"]
    assert [(i["NetworkCardIndex"], i["DeviceIndex"], i["InterfaceType"]) for i in interfaces] == [
        (0, 0, "efa"),
        (1, 1, "efa"),
        (2, 1, "efa"),
        (3, 1, "efa"),
    ]
    assert params["Placement"] == {"GroupName": f"gpujobs-{job.job_id}-a1"}
    described = ec2.describe_instances(InstanceIds=list(job.instance_ids))["Reservations"]
    instances = [i for r in described for i in r["Instances"]]
    assert len(instances) == 2
    subnet = job.current_attempt.subnet_id if job.current_attempt else None
    assert {i["SubnetId"] for i in instances} == {subnet}
    assert not any(i.get("PublicIpAddress") for i in instances)
    groups = {g["GroupId"] for i in instances for n in i["NetworkInterfaces"] for g in n["Groups"]}
    (job_group,) = groups - {stack.security_group}
    (rule,) = ec2.describe_security_groups(GroupIds=[job_group])["SecurityGroups"][0]["IpPermissions"]
    assert rule["IpProtocol"] == "-1"
    assert [p["GroupId"] for p in rule["UserIdGroupPairs"]] == [job_group]
    # and the run document tells the bootstrap to hand the EFA devices to the container on this type
    doc = json.loads(base64.b64decode(params["UserData"]))
    assert doc["efa_instance_types"] == ["p4d.24xlarge"]
    assert doc["instance_store_types"] == ["p4d.24xlarge"]


def test_a_single_node_g5_job_launches_with_one_plain_interface_as_before(stack: MotoStack) -> None:
    world = World()
    ec2 = boto3.client("ec2", region_name=REGION)
    sent: list[dict[str, Any]] = []
    ec2.meta.events.register("provide-client-params.ec2.RunInstances", lambda params, **_: sent.append(params))
    world.rewire(
        compute=Ec2Compute(
            client=ec2,
            launch_template_id=stack.launch_template,
            security_group_id=stack.security_group,
            subnet_ids=stack.subnets,
            stack_name=stack.stack_name,
        ),
        config=LaunchConfig(checkpoint_bucket="b", event_bus_name="bus", region=REGION, hardware=packaged_hardware()),
    )

    job = world.store.get(world.submit(spec(instance_types=["g5.xlarge"])).job.job_id)

    assert job.state is JobState.RUNNING, job.status_detail
    (interface,) = sent[0]["NetworkInterfaces"]
    assert "InterfaceType" not in interface
    assert interface["AssociatePublicIpAddress"] is False
