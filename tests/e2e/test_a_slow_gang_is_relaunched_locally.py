"""On the local cloud, a two-node gang whose all-reduce is below its type's floor: the instances'
PATH holds a fake `nvidia-smi` that shows every p5.48xlarge host its 8 healthy GPUs, so the
bootstrap judges the gang against p5's floor (a quarter of its 3,200 Gbps fabric: 100 GB/s), and
the real launcher measures the real gloo all-reduce of two CPU processes, far below it. Each such
gang exits 123 before the job's code runs and is relaunched on other hosts without spending an
attempt; after two in a row the third measures and logs only (the image's NCCL setup or the type is
then the likelier cause), and trains the job to the end on its one attempt."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpujobs.domain.states import JobState
from gpujobs_local.session import LOCAL_INSTANCE_TYPES
from tests.e2e.conftest import Stage, digits_spec, fake_nvidia_smi_on_path

pytestmark = [pytest.mark.integration, pytest.mark.training]

FAKE_NVIDIA_SMI = """\
for i in range(8):
    print(f"{i}, 00000000:{16 + i:02X}:00.0, 0, [N/A]")
"""


@pytest.fixture
def session_options() -> dict[str, Any]:
    """The local stack's allow-list and p5.48xlarge, whose floor no CPU's gloo reaches (g5.12xlarge's
    1.25 GB/s is within a fast CPU's reach)."""
    return {"allowed_instance_types": (*LOCAL_INSTANCE_TYPES, "p5.48xlarge")}


@pytest.fixture
def gpu_hosts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH folder whose nvidia-smi shows every host 8 healthy GPUs (p5.48xlarge has 8)."""
    return fake_nvidia_smi_on_path(tmp_path, monkeypatch, FAKE_NVIDIA_SMI)


@pytest.mark.timeout(300)
def test_a_gang_below_its_fabrics_floor_is_relaunched_twice_then_trains_at_what_it_gets(
    gpu_hosts: Path, stage: Stage
) -> None:
    # given a two-node job on p5.48xlarge with one attempt to spend
    spec = digits_spec(steps=20, checkpoint_every=10, nodes=2, max_attempts=1, instance_types=["p5.48xlarge"])
    job_id = stage.submit(spec)

    # then its first two gangs are found slow before the job's code runs, and the third trains it
    job = stage.wait_state(job_id, JobState.SUCCEEDED, JobState.FAILED, timeout=260)
    assert job.state is JobState.SUCCEEDED, job.status_detail
    first, second, third = job.attempts
    assert (first.end_reason, second.end_reason) == ("slow-interconnect", "slow-interconnect")
    assert (job.crashes, job.interruptions) == (0, 0)
    for slow in (first, second):
        said = stage.log_text(slow.instance_ids[0])
        assert "below p5.48xlarge's floor of 100.00 GB/s" in said
        assert "[digits] step" not in said  # the job's code never ran on a slow gang
    assert not set(third.instance_ids) & set(first.instance_ids + second.instance_ids)
    measured_only = stage.log_text(third.instance_ids[0])
    assert "all-reduce bus bandwidth" in measured_only
    assert "[digits] step" in measured_only
    stage.wait_nothing_running()
