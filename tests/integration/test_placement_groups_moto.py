"""600 multi-node jobs in a row leave no placement group behind, on moto's EC2.

moto implements no placement groups at all; the stack answers them as EC2 does, with the limit of
500 per Region (local/gpujobs_local/placement_groups.py), and counts them. Instances, their tags and
their states are moto's. Without the sweep the 501st gang would meet `PlacementGroupLimitExceeded`.
"""

from __future__ import annotations

import boto3
import pytest
from moto.core import DEFAULT_ACCOUNT_ID
from moto.ec2.models import ec2_backends

from gpujobs.adapters.ec2 import Ec2Compute
from gpujobs.domain.reports import ExitReport
from gpujobs.domain.states import JobState
from gpujobs_local.stack import REGION, MotoStack
from tests.service.conftest import World, spec

pytestmark = pytest.mark.integration

JOBS = 600
RECONCILE_EVERY = 50


def forget_terminated_instances() -> None:
    """EC2 stops listing a terminated instance after about an hour; moto never does, and its tag
    filters scan every tag it ever stored, so listing 1,200 instances would take half an hour."""
    backend = ec2_backends[DEFAULT_ACCOUNT_ID][REGION]
    for reservation_id, reservation in list(backend.reservations.items()):
        for instance in [i for i in reservation.instances if i.state == "terminated"]:
            reservation.instances.remove(instance)
            backend.tags.pop(instance.id, None)
        if not reservation.instances:
            del backend.reservations[reservation_id]
    volumes = set(backend.volumes)
    for resource_id in [r for r in backend.tags if r.startswith("vol-") and r not in volumes]:
        del backend.tags[resource_id]


@pytest.mark.timeout(900)  # 600 launches on moto: 139 s alone on the 2-core machine, past 300 s beside other suites
def test_600_multi_node_jobs_in_a_row_leave_no_placement_group_behind(stack: MotoStack) -> None:
    world = World()
    ec2 = boto3.client("ec2", region_name=REGION)
    compute = Ec2Compute(
        client=ec2,
        launch_template_id=stack.launch_template,
        security_group_id=stack.security_group,
        subnet_ids=stack.subnets,
        stack_name=stack.stack_name,
    )
    world.rewire(compute=compute)
    states = []

    for n in range(JOBS):
        job = world.store.get(world.submit(spec(nodes=2), message_id=f"m-{n}").job.job_id)
        assert job.state is JobState.RUNNING, job.status_detail
        for rank in range(2):
            world.reactions.report(ExitReport(job_id=job.job_id, attempt=1, exit_code=0, node_rank=rank))
        compute.terminate(list(job.instance_ids))  # the nodes shut down once their trainers exit
        states.append(world.store.get(job.job_id).state)
        if n % RECONCILE_EVERY == RECONCILE_EVERY - 1:
            world.reconciler.run()
            forget_terminated_instances()
    world.reconciler.run()

    assert states == [JobState.SUCCEEDED] * JOBS
    assert stack.placement_groups.groups == {}
    assert compute.list_placement_groups() == []
    assert stack.placement_groups.most_at_once <= RECONCILE_EVERY + 1
