"""On moto: the submit function puts each job's instances in the job's own security group, which
admits only its own members, and the reconciler deletes it once the job is over.

The stack's group, which every instance also carries, admits nothing. Before, it admitted every
instance of the stack, so one job's code could reach another job's rendezvous and NCCL ports.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpujobs.contract import STACK_TAG
from gpujobs_local.stack import STACK, LambdaContext, MotoStack, load_function

pytestmark = pytest.mark.integration

SPEC: dict[str, Any] = {
    "name": "ddp",
    "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/gpujobs-train:1",
    "command": ["torchrun", "train.py"],
    "instance_types": ["g5.xlarge"],
    "nodes": 2,
}


def groups_by_job(stack: MotoStack) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for instance in stack.instances():
        job = {t["Key"]: t["Value"] for t in instance["Tags"]}["gpujobs:job-id"]
        groups = [g["GroupId"] for eni in instance["NetworkInterfaces"] for g in eni["Groups"]]
        found.setdefault(job, set()).update(groups)
    return found


def test_gangs_of_two_jobs_share_no_group_that_admits_the_other(stack: MotoStack) -> None:
    for team in ("vision", "speech"):
        stack.send({**SPEC, "team": team, "client_token": team})
    stack.deliver(load_function("submit").handler)

    groups = groups_by_job(stack)
    assert len(groups) == 2
    first, second = groups.values()
    shared = first & second
    assert shared == {stack.security_group}  # the stack's egress-only group
    for group in stack.ec2.describe_security_groups(GroupIds=sorted(first | second))["SecurityGroups"]:
        admitted = [pair["GroupId"] for rule in group["IpPermissions"] for pair in rule.get("UserIdGroupPairs", [])]
        cidrs = [r for rule in group["IpPermissions"] for r in rule.get("IpRanges", [])]
        assert cidrs == []
        assert admitted == ([] if group["GroupId"] == stack.security_group else [group["GroupId"]])


def test_the_reconciler_deletes_the_group_of_a_cancelled_job(stack: MotoStack) -> None:
    stack.send({**SPEC, "client_token": "short-lived"})
    stack.deliver(load_function("submit").handler)
    ((job_id, groups),) = groups_by_job(stack).items()
    (own,) = groups - {stack.security_group}

    stack.send({"cancel_job_id": job_id})
    stack.deliver(load_function("submit").handler)
    load_function("reconciler").handler({}, LambdaContext())

    left = stack.ec2.describe_security_groups(Filters=[{"Name": f"tag:{STACK_TAG}", "Values": [STACK]}])
    assert own not in [g["GroupId"] for g in left["SecurityGroups"]]
