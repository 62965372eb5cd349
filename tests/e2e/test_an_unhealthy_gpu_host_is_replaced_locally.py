"""On the local cloud, a bad GPU host played with a fake `nvidia-smi` on the instances' PATH: the
first instance sees fewer GPUs than its type has, fails its GPU check before training and reports
`unhealthy-node`; the control plane relaunches the job on another instance without spending an
attempt (max_attempts 1 still leaves it its one), and the second instance, healthy, trains the job
to the end. The record names the bad instance and what its check found."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpujobs.domain.states import JobState, Reason
from tests.e2e.conftest import Stage, digits_spec, fake_nvidia_smi_on_path

pytestmark = [pytest.mark.integration, pytest.mark.training]

FAKE_NVIDIA_SMI = """\
import os, sys
seen = {seen!r}
gpus = 4 if os.path.exists(seen) else 1  # the first host to ask is the bad one
open(seen, "a").close()
for i in range(gpus):
    print(f"{{i}}, 00000000:{{16 + i:02X}}:00.0, 0, [N/A]")
"""


@pytest.fixture
def a_bad_first_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH folder whose nvidia-smi shows the first instance 1 GPU of its type's 4, later ones all 4."""
    return fake_nvidia_smi_on_path(tmp_path, monkeypatch, FAKE_NVIDIA_SMI.format(seen=str(tmp_path / "asked-once")))


@pytest.mark.timeout(300)
def test_a_host_whose_gpus_fail_their_check_is_replaced_and_the_job_still_succeeds(
    a_bad_first_host: Path, stage: Stage
) -> None:
    # given a job with one attempt to spend, whose first host shows 1 of its type's 4 GPUs
    job_id = stage.submit(digits_spec(steps=40, checkpoint_every=20, max_attempts=1))

    # then it succeeds on a second instance
    job = stage.wait_state(job_id, JobState.SUCCEEDED, JobState.FAILED, timeout=240)
    assert job.state is JobState.SUCCEEDED, job.status_detail
    first, second = job.attempts
    assert first.end_reason == "unhealthy-node"
    [(bad, found)] = first.unhealthy.items()
    assert found.endswith("nvidia-smi sees 1 GPU(s), the type has 4")
    assert bad not in second.instance_ids
    assert (job.crashes, job.interruptions) == (0, 0)
    assert any(e.reason is Reason.UNHEALTHY_NODE for e in job.history)
    assert "GPU check passed (4 GPU(s) expected)" in stage.log_text(second.instance_ids[0])
    stage.wait_nothing_running()
