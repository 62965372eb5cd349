"""A script that did not opt in to the trainer library is never sent "checkpoint now" (SIGUSR1).

`checkpoint: gpujobs` keeps today's behaviour; `directory` and `none` scripts would be killed by
SIGUSR1, so the control plane never sends it to them: a rebalance notice is ignored, a spot warning
replaces the attempt without it, and a policy stop takes the instances at once (their SIGTERM is
what a `directory` job saves on).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from gpujobs.domain.decisions import on_rebalance, on_spot_warning, request_stop
from gpujobs.domain.effects import Launch, Outcome, SignalCheckpoint, Terminate
from gpujobs.domain.job import Admission, Job, Market
from gpujobs.domain.launching import Gang, claim_launch, record_launch
from gpujobs.domain.rundoc import RunDocument
from gpujobs.domain.spec import CheckpointMode, validate_spec
from gpujobs.domain.spec_errors import SpecError
from gpujobs.domain.states import JobState, Reason
from gpujobs.instance.rundoc import FIELDS

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
SPEC: dict[str, Any] = {
    "name": "any-script",
    "image": "img:1",
    "command": ["python", "train.py"],
    "instance_types": ["g5.xlarge"],
}
GANG = Gang(("i-1",), "g5.xlarge", "us-east-1a", Market.SPOT, "subnet-a")
CODE = "s3://team-code/runs/train.tar.gz"


def running(mode: str) -> Job:
    spec = validate_spec({**SPEC, "checkpoint": mode})
    job = Job.submitted(job_id="j-0000000000000001", spec=spec, now=NOW, message_id="m-1")
    claimed = claim_launch(job, now=NOW, hold=None, admission=Admission(at=NOW)).job
    assert claimed is not None
    launched = record_launch(claimed, attempt_number=1, gang=GANG, tries=(), now=NOW).job
    assert launched is not None
    assert launched.state is JobState.RUNNING
    return launched


# ---- the spec ---------------------------------------------------------------------------------
def test_a_spec_without_a_checkpoint_field_keeps_the_trainer_librarys_behaviour() -> None:
    assert validate_spec(SPEC).checkpoint is CheckpointMode.GPUJOBS


def test_an_unknown_checkpoint_mode_is_refused_naming_the_choices() -> None:
    with pytest.raises(SpecError) as raised:
        validate_spec({**SPEC, "checkpoint": "folder"})
    assert raised.value.problems[0].startswith("checkpoint: Input should be 'gpujobs', 'directory' or 'none'")


def test_code_in_s3_travels_with_its_digest() -> None:
    spec = validate_spec({**SPEC, "code": CODE, "code_sha256": "a" * 64})
    assert (spec.code, spec.code_sha256) == (CODE, "a" * 64)


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"code": "./src"}, "code: must be s3://bucket/key here; a local folder is packed"),
        ({"code": "s3://bucket-only"}, "code: 's3://bucket-only' is not s3://bucket/key"),
        ({"code_sha256": "a" * 64}, "code_sha256: only for an s3:// code archive"),
        ({"code": CODE, "code_sha256": "not-hex"}, "code_sha256: must be a SHA-256 in lowercase hex"),
        ({"code": CODE}, "(spec): code_sha256: required with an s3:// code archive"),
    ],
    ids=["local-folder-in-the-queue", "no-key", "digest-alone", "bad-digest", "unpinned-archive"],
)
def test_code_the_control_plane_could_not_fetch_is_refused(fields: dict[str, str], problem: str) -> None:
    with pytest.raises(SpecError) as raised:
        validate_spec({**SPEC, **fields})
    assert any(p.startswith(problem) for p in raised.value.problems), raised.value.problems


def test_a_local_code_folder_is_valid_where_submit_packs_it() -> None:
    assert validate_spec({**SPEC, "code": "./src"}, local_code=True).code == "./src"


def test_the_run_document_carries_the_mode_and_the_code_to_the_bootstrap() -> None:
    carried = {"checkpoint_mode", "code_uri", "code_sha256"}
    assert carried <= set(RunDocument.model_fields) & set(FIELDS)
    assert RunDocument.model_fields["checkpoint_mode"].default == FIELDS["checkpoint_mode"][1] == "gpujobs"


# ---- what the control plane sends --------------------------------------------------------------
def test_a_rebalance_notice_signals_a_gpujobs_script_to_checkpoint() -> None:
    decision = on_rebalance(running("gpujobs"), "i-1", now=NOW)

    assert decision.outcome is Outcome.CHECKPOINT_REQUESTED
    assert decision.effects == (SignalCheckpoint(("i-1",), "gpujobs-j-0000000000000001-a1"),)


@pytest.mark.parametrize("mode", ["directory", "none"])
def test_a_rebalance_notice_is_ignored_by_a_script_that_did_not_opt_in(mode: str) -> None:
    decision = on_rebalance(running(mode), "i-1", now=NOW)

    assert decision.outcome is Outcome.NO_CHECKPOINT_REQUESTS
    assert decision.outcome.ignored
    assert decision.job is None
    assert decision.effects == ()


@pytest.mark.parametrize("mode", ["directory", "none"])
def test_a_spot_warning_replaces_the_attempt_without_sigusr1(mode: str) -> None:
    decision = on_spot_warning(running(mode), "i-1", now=NOW)

    assert decision.outcome is Outcome.INTERRUPTED
    assert decision.job is not None
    assert decision.job.state is JobState.INTERRUPTED
    assert decision.effects == (Launch("j-0000000000000001"),)


def test_a_policy_stop_of_a_gpujobs_script_asks_for_a_checkpoint_first() -> None:
    decision = request_stop(running("gpujobs"), Reason.IDLE, detail="idle", now=NOW)

    assert decision.effects == (SignalCheckpoint(("i-1",), "gpujobs-j-0000000000000001-a1"),)
    assert not any(isinstance(e, Terminate) for e in decision.effects)


@pytest.mark.parametrize("mode", ["directory", "none"])
def test_a_policy_stop_of_any_other_script_takes_the_instances_at_once(mode: str) -> None:
    decision = request_stop(running(mode), Reason.BUDGET_EXCEEDED, detail="budget", now=NOW)

    assert decision.outcome is Outcome.STOP_REQUESTED
    assert decision.effects == (Terminate(("i-1",)),)  # their shutdown is the SIGTERM a script saves on
    assert decision.job is not None
    assert decision.job.stop_request is not None
    assert decision.job.stop_request.executed_at == NOW
