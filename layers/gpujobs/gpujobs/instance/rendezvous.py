"""Rendezvous: the nodes of one attempt find each other through their EC2 tags.

No coordinator: every node lists the instances tagged with its job and attempt and derives the same
ranks and the same master from that list. The tags are the launcher's (`contract.TAG_*`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from gpujobs.instance.contract import RENDEZVOUS_STATES, TAG_ATTEMPT, TAG_JOB_ID
from gpujobs.instance.errors import BootstrapError


def describe_attempt(ec2: Any, *, job_id: str, attempt: int, states: Iterable[str]) -> list[dict[str, Any]]:
    """The instances tagged with `job_id` and `attempt` whose state is one of `states`."""
    filters = [
        {"Name": f"tag:{TAG_JOB_ID}", "Values": [job_id]},
        {"Name": f"tag:{TAG_ATTEMPT}", "Values": [str(attempt)]},
        {"Name": "instance-state-name", "Values": list(states)},
    ]
    return [
        instance
        for page in ec2.get_paginator("describe_instances").paginate(Filters=filters)
        for reservation in page["Reservations"]
        for instance in reservation["Instances"]
    ]


def rendezvous(
    ec2: Any,
    *,
    job_id: str,
    attempt: int,
    nodes: int,
    instance_id: str,
    own_ip: str,
    timeout: float = 900.0,
    poll: float = 5.0,
) -> tuple[int, str]:
    """(node rank, master address). Waits until all `nodes` instances of this attempt are visible.

    Ranks are positions in the members sorted by (AMI launch index, instance id): the launch index
    itself when one RunInstances call launched them all, still consistent when several did.
    """
    if nodes <= 1:
        return 0, own_ip or "127.0.0.1"
    deadline = time.monotonic() + timeout
    while True:
        members = sorted(
            (i["AmiLaunchIndex"], i["InstanceId"], i.get("PrivateIpAddress", ""))
            for i in describe_attempt(ec2, job_id=job_id, attempt=attempt, states=RENDEZVOUS_STATES)
        )
        if len(members) >= nodes and all(ip for _, _, ip in members):
            break
        if time.monotonic() > deadline:
            raise BootstrapError(f"rendezvous: {len(members)} of {nodes} instances after {timeout:.0f}s")
        time.sleep(poll)
    ids = [iid for _, iid, _ in members]
    if len(members) > nodes or instance_id not in ids:
        raise BootstrapError(f"rendezvous: instances {ids} do not match {nodes} nodes including {instance_id}")
    return ids.index(instance_id), members[0][2]
