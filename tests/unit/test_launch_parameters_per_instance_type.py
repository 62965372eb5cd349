"""The launch parameters and run document each instance type gets: EFA interfaces and checkpoint staging.

Stories, per type of the packaged catalog: a multi-node p4d.24xlarge gang launches with an EFA
interface on each of its 4 network cards, a p5.48xlarge gang on each of its 32; card 0 device 0 is
the primary interface and every other card's EFA sits at device index 1; a single node, or a type
without EFA, keeps the one plain interface it always had, without a public IP. A type whose cards
do not all take EFA (p6-b300.48xlarge: card 0 is ENA only) keeps the plain interface too, rather
than a layout EC2 would refuse. The run document names the types that launch with EFA and those
whose NVMe instance store stages checkpoints.
"""

from __future__ import annotations

from datetime import UTC, datetime

import boto3
import pytest

from gpujobs.adapters.catalog import packaged_catalog, packaged_hardware
from gpujobs.adapters.ec2 import Ec2Compute
from gpujobs.domain.hardware import InterfaceType, NetworkInterface, efa_interfaces, network_interfaces
from gpujobs.domain.job import Attempt, Job, Market
from gpujobs.domain.rundoc import run_document
from gpujobs.domain.spec import validate_spec
from gpujobs.service.ports import LaunchRequest, Subnet

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
EFA_CARDS = {
    "p4d.24xlarge": 4,
    "p4de.24xlarge": 4,
    "p5.48xlarge": 32,
    "p5e.48xlarge": 32,
    "p5en.48xlarge": 16,
    "p6-b200.48xlarge": 8,
    "g5.48xlarge": 1,
    "g5.12xlarge": 1,
    "g6.12xlarge": 1,
    "g6e.48xlarge": 4,
}


def test_the_hardware_table_names_every_catalogued_type() -> None:
    assert set(packaged_hardware()) == set(packaged_catalog())


@pytest.mark.parametrize("instance_type", sorted(packaged_catalog()))
def test_a_multi_node_gang_gets_one_efa_per_network_card_of_its_type(instance_type: str) -> None:
    facts = packaged_catalog()[instance_type]
    count = efa_interfaces(packaged_hardware(), instance_type=instance_type, nodes=2)

    assert count == EFA_CARDS.get(instance_type, count)
    assert count == (facts.network_cards if facts.efa_interfaces == facts.network_cards else 0)
    layout = network_interfaces(count)
    if count == 0:
        assert layout == (NetworkInterface(0, 0, InterfaceType.PLAIN),)
        return
    assert [i.network_card_index for i in layout] == list(range(count))
    assert layout[0] == NetworkInterface(0, 0, InterfaceType.EFA)
    assert all(i.device_index == 1 and i.interface_type is InterfaceType.EFA for i in layout[1:])


@pytest.mark.parametrize("instance_type", ["p4d.24xlarge", "p5.48xlarge"])
def test_a_single_node_talks_over_nvlink_and_launches_with_the_plain_interface(instance_type: str) -> None:
    assert efa_interfaces(packaged_hardware(), instance_type=instance_type, nodes=1) == 0


def test_a_type_the_table_does_not_know_launches_as_before() -> None:
    assert efa_interfaces(packaged_hardware(), instance_type="p7.48xlarge", nodes=4) == 0


def test_a_type_whose_first_card_takes_no_efa_launches_with_the_plain_interface() -> None:
    facts = packaged_catalog()["p6-b300.48xlarge"]

    assert (facts.efa_interfaces, facts.network_cards) == (16, 17)  # EC2: card 0 ENA only, EFA on 1-16
    assert efa_interfaces(packaged_hardware(), instance_type="p6-b300.48xlarge", nodes=4) == 0


def a_request(instance_type: str, efa: int) -> LaunchRequest:
    return LaunchRequest(
        job_id="j-0123456789abcdef",
        attempt=1,
        team="default",
        name="llm",
        count=2,
        instance_type=instance_type,
        subnet=Subnet("subnet-a", "us-east-1a"),
        market=Market.SPOT,
        client_token="token",
        user_data="{}",
        placement_group="gpujobs-j-0123456789abcdef-a1",
        security_group_id="sg-job",
        efa_interfaces=efa,
    )


@pytest.mark.parametrize(("instance_type", "cards"), [("p4d.24xlarge", 4), ("p5.48xlarge", 32)])
def test_runinstances_gets_an_efa_per_card_in_the_gang_subnet_and_groups_without_a_public_ip(
    instance_type: str, cards: int
) -> None:
    ec2 = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    compute = Ec2Compute(
        client=ec2, launch_template_id="lt-1", security_group_id="sg-stack", subnet_ids=["subnet-a"], stack_name="s"
    )

    interfaces = compute.network_interfaces(a_request(instance_type, cards))

    assert len(interfaces) == cards
    assert [(i["NetworkCardIndex"], i["DeviceIndex"]) for i in interfaces] == [(0, 0)] + [
        (c, 1) for c in range(1, cards)
    ]
    assert {i.get("InterfaceType") for i in interfaces} == {"efa"}
    assert all(i["SubnetId"] == "subnet-a" and i["Groups"] == ["sg-stack", "sg-job"] for i in interfaces)
    # EC2 refuses AssociatePublicIpAddress with several interfaces, and assigns no public IP then.
    assert not any("AssociatePublicIpAddress" in i for i in interfaces)


def test_runinstances_without_efa_keeps_one_plain_interface_without_a_public_ip() -> None:
    ec2 = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    compute = Ec2Compute(
        client=ec2, launch_template_id="lt-1", security_group_id="sg-stack", subnet_ids=["subnet-a"], stack_name="s"
    )

    (interface,) = compute.network_interfaces(a_request("g5.xlarge", 0))

    assert interface["DeviceIndex"] == 0
    assert interface["NetworkCardIndex"] == 0
    assert "InterfaceType" not in interface
    assert interface["AssociatePublicIpAddress"] is False
    assert interface["Groups"] == ["sg-stack", "sg-job"]


def a_job(*, nodes: int, instance_types: list[str]) -> tuple[Job, Attempt]:
    spec = validate_spec(
        {"name": "llm", "image": "train:1", "command": ["torchrun"], "nodes": nodes, "instance_types": instance_types}
    )
    job = Job.submitted(job_id="j-0123456789abcdef", spec=spec, now=NOW, message_id="m-1")
    return job, Attempt(number=1, started_at=NOW)


def a_document(job: Job, attempt: Attempt) -> dict[str, object]:
    doc = run_document(
        job,
        attempt,
        bucket="b",
        event_bus="bus",
        region="us-east-1",
        log_group="",
        wait_for_attempt=None,
        report_key="",
        access={},
        hardware=packaged_hardware(),
    )
    return doc.model_dump()


def test_the_run_document_names_the_types_launched_with_efa_and_those_staging_on_nvme() -> None:
    job, attempt = a_job(nodes=2, instance_types=["p5.48xlarge", "p4d.24xlarge", "g5.xlarge", "c7i.large"])

    doc = a_document(job, attempt)

    assert doc["efa_instance_types"] == ["p5.48xlarge", "p4d.24xlarge"]
    assert doc["instance_store_types"] == ["p5.48xlarge", "p4d.24xlarge", "g5.xlarge"]


def test_a_single_node_document_names_no_efa_type_but_still_stages_on_nvme() -> None:
    job, attempt = a_job(nodes=1, instance_types=["p5.48xlarge"])

    doc = a_document(job, attempt)

    assert doc["efa_instance_types"] == []
    assert doc["instance_store_types"] == ["p5.48xlarge"]


def test_the_run_document_names_each_gpu_types_gpus_from_the_catalog_for_the_nodes_gpu_check() -> None:
    job, attempt = a_job(nodes=1, instance_types=["p5.48xlarge", "p4d.24xlarge", "g5.xlarge", "c7i.large"])

    doc = a_document(job, attempt)

    assert doc["gpu_counts"] == {"p5.48xlarge": 8, "p4d.24xlarge": 8, "g5.xlarge": 1}  # c7i has none to check


def test_a_multi_node_gang_on_efa_is_judged_against_a_quarter_of_its_fabrics_documented_bandwidth() -> None:
    types = ["p4d.24xlarge", "p5.48xlarge", "g5.12xlarge", "g5.xlarge", "c7i.large"]
    job, attempt = a_job(nodes=2, instance_types=types)

    floors = a_document(job, attempt)["interconnect_floors"]

    # 400 Gbps = 50 GB/s, 3200 Gbps = 400 GB/s, 40 Gbps = 5 GB/s (the catalog's cards' baselines together);
    # g5.xlarge and c7i.large launch without EFA: no documented figure for NCCL over TCP, measured only
    assert floors == {"p4d.24xlarge": 12.5, "p5.48xlarge": 100.0, "g5.12xlarge": 1.25}
    assert packaged_catalog()["p4d.24xlarge"].network_gbps == 400.0


def test_a_single_node_measures_no_interconnect() -> None:
    job, attempt = a_job(nodes=1, instance_types=["p4d.24xlarge"])

    assert a_document(job, attempt)["interconnect_floors"] == {}


def ended(number: int, reason: str, *, launched: bool = True) -> Attempt:
    """An ended attempt whose gang (two instances) was launched, or a walk that launched nothing."""
    gang = (f"i-{number:016x}", f"i-{number + 100:016x}") if launched else ()
    return Attempt(number=number, started_at=NOW, ended_at=NOW, end_reason=reason, instance_ids=gang)


def test_after_two_slow_gangs_in_a_row_the_next_one_trains_at_what_it_gets() -> None:
    """Fresh hosts twice below the floor say the image's NCCL setup or the type is the cause, not the
    hosts: the third gang measures and logs only, rather than the job failing for its fabric."""
    job, _ = a_job(nodes=2, instance_types=["p4d.24xlarge"])

    once = job.model_copy(update={"attempts": (ended(1, "crashed"), ended(2, "slow-interconnect"))})
    twice = job.model_copy(update={"attempts": (ended(1, "slow-interconnect"), ended(2, "slow-interconnect"))})
    broken = job.model_copy(
        update={"attempts": (ended(1, "slow-interconnect"), ended(2, "slow-interconnect"), ended(3, "crashed"))}
    )

    assert a_document(once, Attempt(number=3, started_at=NOW))["interconnect_floors"] == {"p4d.24xlarge": 12.5}
    assert a_document(twice, Attempt(number=3, started_at=NOW))["interconnect_floors"] == {}
    assert a_document(broken, Attempt(number=4, started_at=NOW))["interconnect_floors"] == {"p4d.24xlarge": 12.5}


def test_a_walk_that_launched_nothing_does_not_break_the_row_of_slow_gangs() -> None:
    """Counted as the limit that fails the job counts (`fate.unhealthy_in_a_row`): else a third slow gang
    would still be judged, and end the job FAILED, instead of training at what it gets."""
    job, _ = a_job(nodes=2, instance_types=["p4d.24xlarge"])
    between = (ended(1, "slow-interconnect"), ended(2, "no-capacity", launched=False), ended(3, "slow-interconnect"))

    doc = a_document(job.model_copy(update={"attempts": between}), Attempt(number=4, started_at=NOW))

    assert doc["interconnect_floors"] == {}
