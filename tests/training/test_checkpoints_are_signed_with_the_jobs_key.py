"""Checkpoints signed with the job's checkpoint key: a well-formed checkpoint relabelled as this
job's is skipped unless the job's key signed it (issue 18).

With `GPUJOBS_CHECKPOINT_KEY` set, every commit marker is signed (HMAC-SHA256 over its parsed
content, which lists every file's digest) and a resume skips a marker that is unsigned or signed
with another key, for the newest that verifies. The story runs the digits job (2 ranks, gloo,
torchrun) on a copy of the baseline's checkpoints; the unit tests pin the marker rules.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from gpujobs_trainer.digests import file_digest
from gpujobs_trainer.layout import CommitMarker, provenance_problems
from gpujobs_trainer.storage import LocalStore
from tests.training.conftest import Baseline
from tests.training.harness import TOTAL_STEPS, assert_bit_identical, job_env, recommit, run_job
from tests.training.test_checkpoints_are_trusted_only_if_ours import OURS, _copy_of, _marker_json, _plant, _write_step

KEY = bytes(range(32))
ANOTHER_JOBS_KEY = bytes(range(32, 64))


def _resign(step_dir: Path, key: bytes, **changes: Any) -> None:
    """What a job that holds ``key`` can write: a marker for the files there now, signed with it."""
    recommit(step_dir, **changes)
    marker = CommitMarker.from_json((step_dir / "COMMIT.json").read_text())
    (step_dir / "COMMIT.json").write_text(marker.signed(key).to_json())


@pytest.mark.training
def test_a_checkpoint_relabelled_for_this_job_is_refused_unless_signed_with_its_key(
    tmp_path: Path, baseline: Baseline
) -> None:
    # given a job whose step 300 is signed with its key
    checkpoints = _copy_of(baseline, tmp_path)
    _resign(checkpoints / "step-00000300", KEY)
    # and newer, well-formed checkpoints that name this job: step 400 unsigned (planted, or written
    # without the key), step 500 another job's checkpoint relabelled as this one's and signed by it
    recommit(checkpoints / "step-00000400", signature="")
    _resign(_plant(checkpoints, step=500), ANOTHER_JOBS_KEY, step=500)

    # when the job resumes with its key
    dump = tmp_path / "resumed.pt"
    resumed = run_job(
        job_env(str(checkpoints), GPUJOBS_CHECKPOINT_KEY=KEY.hex()),
        "--steps",
        str(TOTAL_STEPS),
        "--state-dump",
        str(dump),
    )

    # then it resumed from its own signed commit, said why it skipped the others, and trained exactly
    assert resumed.exit_code == 0, resumed.output
    assert resumed.resumed_from == 300
    skipped = resumed.events("resumed")[0]["skipped"]
    assert skipped[0].startswith("step 500: its commit marker: its signature is not this job's")
    assert skipped[1].startswith("step 400: its commit marker: it is not signed")
    assert_bit_identical(baseline.state_dump, dump)
    # and what it committed is signed with its key
    final = CommitMarker.from_json((checkpoints / "step-00000400" / "COMMIT.json").read_text())
    assert final.reason == "final"
    assert final.signature
    assert final.signature_problem(KEY) == ""


def test_a_signed_marker_vouches_only_under_its_own_jobs_key() -> None:
    marker = CommitMarker.from_json(_marker_json(".metadata", "__0_0.distcp", "rng-rank-00000.json"))
    signed = CommitMarker.from_json(marker.signed(KEY).to_json())  # as written, then read back

    assert provenance_problems(signed, step=7, job_id=OURS, key=KEY) == []
    assert provenance_problems(marker, step=7, job_id=OURS) == []  # no key: nothing to check against
    [unsigned] = provenance_problems(marker, step=7, job_id=OURS, key=KEY)
    assert "not signed" in unsigned
    [foreign] = provenance_problems(signed, step=7, job_id=OURS, key=ANOTHER_JOBS_KEY)
    assert "not this job's" in foreign
    relabelled = dataclasses.replace(signed, job_id="job-b")
    assert provenance_problems(relabelled, step=7, job_id="job-b", key=KEY) == [
        "its commit marker: its signature is not this job's (another job's checkpoint, or tampered with)"
    ]


def test_a_marker_written_before_blake3_still_verifies_with_sha256(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    marker = _write_step(store.staging_dir(7))
    legacy = dataclasses.replace(
        marker,
        digest_algorithm="sha256",
        digests={name: file_digest(store.staging_dir(7) / name, "sha256") for name in marker.files},
    )
    store.write_commit(legacy)
    read = store.read_commit(7)
    assert read.digest_algorithm == "sha256"
    assert store.fetch(7, read) == store.staging_dir(7)
