"""Rendezvous: the nodes of one attempt find each other through their EC2 tags.

No coordinator: every node lists the instances tagged with its job and attempt and derives the same
ranks and the same master from that list. The tags are the launcher's (`contract.TAG_*`).

A gang regroups when spot reclaims one of its nodes: the control plane raises the survivors'
`gpujobs:generation` tag and launches the replacement with it, so the members of a rendezvous are
the attempt's instances of this node's own generation (read again at every poll: a node still
waiting when its generation is raised joins the new one), never the node that is going away.
`wait_for_regroup` is how a survivor whose workload stopped at the warning learns the gang goes on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from gpujobs.instance.contract import RENDEZVOUS_STATES, TAG_ATTEMPT, TAG_GENERATION, TAG_JOB_ID
from gpujobs.instance.errors import BootstrapError


class Place(NamedTuple):
    """This node's place in its gang: its rank, the master's address and the gang's generation."""

    rank: int
    master: str
    generation: int = 0


def generation_of(instance: dict[str, Any]) -> int:
    """The instance's `gpujobs:generation` tag (absent or malformed: 0, as launched)."""
    value = next((t["Value"] for t in instance.get("Tags", []) if t["Key"] == TAG_GENERATION), "0")
    return int(value) if value.isdecimal() else 0


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
) -> Place:
    """This node's place. Waits until all `nodes` instances of this attempt and of this node's
    generation are visible.

    Ranks are positions in the members sorted by (AMI launch index, instance id): the launch index
    itself when one RunInstances call launched them all, still consistent when several did.
    """
    if nodes <= 1:
        return Place(0, own_ip or "127.0.0.1")
    deadline = time.monotonic() + timeout
    while True:
        found = describe_attempt(ec2, job_id=job_id, attempt=attempt, states=RENDEZVOUS_STATES)
        own = next((i for i in found if i["InstanceId"] == instance_id), None)
        generation = generation_of(own) if own is not None else 0
        members = sorted(
            (i["AmiLaunchIndex"], i["InstanceId"], i.get("PrivateIpAddress", ""))
            for i in found
            if generation_of(i) == generation
        )
        if len(members) >= nodes and all(ip for _, _, ip in members):
            break
        if time.monotonic() > deadline:
            raise BootstrapError(
                f"rendezvous: {len(members)} of {nodes} instances of generation {generation} after {timeout:.0f}s"
            )
        time.sleep(poll)
    ids = [iid for _, iid, _ in members]
    if len(members) > nodes or instance_id not in ids:
        raise BootstrapError(f"rendezvous: instances {ids} do not match {nodes} nodes including {instance_id}")
    return Place(ids.index(instance_id), members[0][2], generation)


def wait_for_regroup(
    ec2: Any,
    *,
    instance_id: str,
    above: int,
    timeout: float,
    poll: float = 5.0,
    stopped: Callable[[], bool] = lambda: False,
) -> int | None:
    """This instance's generation once the control plane raises it above `above` (the gang regroups
    around a replacement), or None after `timeout` or once `stopped()` (it does not: this node's part
    is over)."""
    deadline = time.monotonic() + timeout
    while not stopped():
        reservations = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
        generation = max((generation_of(i) for r in reservations for i in r["Instances"]), default=0)
        if generation > above:
            return generation
        if time.monotonic() >= deadline:
            return None
        time.sleep(poll)
    return None
