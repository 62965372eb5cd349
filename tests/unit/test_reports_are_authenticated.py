"""A report proves it comes from the attempt it names: the three signers agree with the verifier.

The bootstrap (stdlib, in user data), the trainer (the training image) and the control plane each
keep their own code for the canonical form; these tests sign the same reports with each and check
that the verifier accepts exactly those, and nothing that was changed, re-keyed or is stale.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpujobs import contract
from gpujobs.adapters.inbound_reports import REPORT_MODELS
from gpujobs.domain import report_auth
from gpujobs.domain.report_auth import Proof, report_key, verify
from gpujobs.domain.reports import HeartbeatReport
from gpujobs.instance import signing as bootstrap_signing
from gpujobs_trainer import signing as trainer_signing
from gpujobs_trainer.events import EventBridgePublisher

SECRET = b"the stack secret"
JOB = "j-0123456789abcdef"
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
KEY = report_key(SECRET, job_id=JOB, attempt=2)
REPORTS = {
    contract.CHECKPOINT_COMMITTED: {"job_id": JOB, "attempt": 2, "step": 1200, "uri": "s3://b/jobs/x/step-1200"},
    contract.TRAINING_HEARTBEAT: {"job_id": JOB, "attempt": 2, "step": 1150},
    contract.JOB_EXITED: {
        "job_id": JOB,
        "attempt": 2,
        "exit_code": 0,
        "instance_id": "i-0abc1234def567890",
        "node_rank": 0,
    },
}


def _verify(detail_type: str, detail: dict[str, object], *, key: bytes = KEY, now: datetime = NOW) -> Proof:
    fields = {name: detail.get(name) for name in contract.REPORT_SIGNED_FIELDS[detail_type]}
    return verify(
        key,
        detail_type,
        fields,
        signed_at=detail.get("signed_at"),  # type: ignore[arg-type]
        signature=detail.get("signature"),  # type: ignore[arg-type]
        now=now,
    )


@pytest.mark.parametrize("detail_type", sorted(REPORTS))
def test_the_trainers_canonical_form_is_the_verifiers(detail_type: str) -> None:
    detail = REPORTS[detail_type]
    signed_at = int(NOW.timestamp())

    assert trainer_signing.canonical(detail_type, detail, signed_at=signed_at) == report_auth.canonical(
        detail_type, detail, signed_at=signed_at
    )


def test_the_bootstraps_canonical_form_is_the_verifiers() -> None:
    detail = {**REPORTS[contract.JOB_EXITED], "reason": "exited", "message": "workload exited with 0"}
    signed_at = int(NOW.timestamp())

    assert bootstrap_signing.canonical(detail, signed_at=signed_at) == report_auth.canonical(
        contract.JOB_EXITED, detail, signed_at=signed_at
    )


@pytest.mark.parametrize("detail_type", sorted(REPORTS))
def test_a_report_the_trainer_signed_with_its_attempts_key_is_proven(detail_type: str) -> None:
    detail = trainer_signing.signed(KEY, detail_type, dict(REPORTS[detail_type]), now=NOW.timestamp())

    assert _verify(detail_type, detail) is Proof.VALID


def test_an_exit_the_bootstrap_signed_with_its_attempts_key_is_proven() -> None:
    detail = bootstrap_signing.signed_exit(dict(REPORTS[contract.JOB_EXITED]), KEY.hex(), now=NOW.timestamp())

    assert _verify(contract.JOB_EXITED, detail) is Proof.VALID


def test_an_exit_without_a_readable_key_goes_unsigned_and_is_not_proven() -> None:
    for unusable in (None, "", "not hex"):
        detail = bootstrap_signing.signed_exit(dict(REPORTS[contract.JOB_EXITED]), unusable, now=NOW.timestamp())

        assert "signature" not in detail
        assert _verify(contract.JOB_EXITED, detail) is Proof.MISSING


@pytest.mark.parametrize(
    ("field", "forged"), [("exit_code", 1), ("attempt", 3), ("job_id", "j-fedcba9876543210"), ("node_rank", 1)]
)
def test_changing_a_field_the_control_plane_acts_on_breaks_the_proof(field: str, forged: object) -> None:
    detail = trainer_signing.signed(KEY, contract.JOB_EXITED, dict(REPORTS[contract.JOB_EXITED]), now=NOW.timestamp())

    assert _verify(contract.JOB_EXITED, {**detail, field: forged}) is Proof.MISMATCH


def test_a_key_of_another_job_or_attempt_or_stack_proves_nothing() -> None:
    detail_type = contract.CHECKPOINT_COMMITTED
    for key in (
        report_key(SECRET, job_id="j-fedcba9876543210", attempt=2),
        report_key(SECRET, job_id=JOB, attempt=1),
        report_key(b"another stack's secret", job_id=JOB, attempt=2),
    ):
        detail = trainer_signing.signed(key, detail_type, dict(REPORTS[detail_type]), now=NOW.timestamp())

        assert _verify(detail_type, detail) is Proof.MISMATCH


def test_a_report_is_proven_only_within_the_retry_window() -> None:
    detail_type = contract.TRAINING_HEARTBEAT
    detail = trainer_signing.signed(KEY, detail_type, dict(REPORTS[detail_type]), now=NOW.timestamp())

    assert _verify(detail_type, detail, now=NOW + timedelta(minutes=64)) is Proof.VALID
    assert _verify(detail_type, detail, now=NOW + timedelta(minutes=66)) is Proof.STALE
    assert _verify(detail_type, detail, now=NOW - timedelta(minutes=6)) is Proof.STALE


def test_a_signature_that_is_not_hex_is_a_mismatch_not_a_crash() -> None:
    detail = {**REPORTS[contract.TRAINING_HEARTBEAT], "signed_at": int(NOW.timestamp()), "signature": "\u00e9" * 64}

    assert _verify(contract.TRAINING_HEARTBEAT, detail) is Proof.MISMATCH


def test_the_trainer_reads_its_key_from_the_variable_the_bootstrap_sets() -> None:
    assert trainer_signing.key_from_env({trainer_signing.REPORT_KEY_ENV: KEY.hex()}) == KEY
    assert trainer_signing.key_from_env({}) == b""
    assert trainer_signing.key_from_env({trainer_signing.REPORT_KEY_ENV: "zz"}) == b""


class _RecordingEvents:
    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []

    def put_events(self, *, Entries: list[dict[str, Any]]) -> dict[str, Any]:  # noqa: N803 - boto3's name
        self.entries += Entries
        return {"FailedEntryCount": 0}


def test_the_trainers_publisher_signs_every_report_with_the_key_from_its_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(trainer_signing.REPORT_KEY_ENV, KEY.hex())
    client = _RecordingEvents()
    publisher = EventBridgePublisher("bus", client=client)

    publisher.publish(contract.CHECKPOINT_COMMITTED, {**REPORTS[contract.CHECKPOINT_COMMITTED], "reason": "final"})
    publisher.close()

    (entry,) = client.entries
    detail = json.loads(entry["Detail"])
    now = datetime.fromtimestamp(detail["signed_at"], UTC)
    assert _verify(contract.CHECKPOINT_COMMITTED, detail, now=now) is Proof.VALID
    assert KEY.hex() not in entry["Detail"]


HEARTBEAT_WITH_METRICS = {
    **REPORTS[contract.TRAINING_HEARTBEAT],
    "metrics": {"loss": 0.731, "lr": 0.0003},
    "steps_per_second": 2.5,
    "samples_per_second": 80.0,
}


def _verify_as_received(detail: dict[str, Any]) -> Proof:
    """As the reports function does: the detail off the wire, parsed, then verified on the parsed values."""
    model = REPORT_MODELS[contract.TRAINING_HEARTBEAT].model_validate_json(json.dumps(detail))
    signed_report = model.signed()
    return verify(
        KEY,
        contract.TRAINING_HEARTBEAT,
        signed_report.report.signed_fields(),
        signed_at=signed_report.signed_at,
        signature=signed_report.signature,
        now=NOW,
    )


def test_a_heartbeats_metrics_and_throughput_are_proven_as_the_control_plane_parses_them() -> None:
    detail = trainer_signing.signed(KEY, contract.TRAINING_HEARTBEAT, dict(HEARTBEAT_WITH_METRICS), now=NOW.timestamp())

    assert _verify_as_received(detail) is Proof.VALID


@pytest.mark.parametrize(
    "forged",
    [
        {"metrics": {"loss": 9.0, "lr": 0.0003}},
        {"metrics": {"loss": 0.731, "lr": 0.0003, "acc": 1.0}},
        {"metrics": {"loss": 0.731}},
        {"steps_per_second": 250.0},
        {"samples_per_second": 1.0},
    ],
)
def test_changing_a_heartbeats_metrics_or_throughput_breaks_the_proof(forged: dict[str, object]) -> None:
    detail = trainer_signing.signed(KEY, contract.TRAINING_HEARTBEAT, dict(HEARTBEAT_WITH_METRICS), now=NOW.timestamp())

    assert _verify_as_received({**detail, **forged}) is Proof.MISMATCH


def test_stripping_a_heartbeats_metrics_to_pass_it_off_as_an_older_trainers_breaks_the_proof() -> None:
    detail = trainer_signing.signed(KEY, contract.TRAINING_HEARTBEAT, dict(HEARTBEAT_WITH_METRICS), now=NOW.timestamp())
    stripped = {name: value for name, value in detail.items() if name != "metrics"}

    assert _verify_as_received(stripped) is Proof.MISMATCH


def test_an_older_trainers_heartbeat_is_proven_on_its_step_and_its_unsigned_rate_is_not_acted_on() -> None:
    older = {**REPORTS[contract.TRAINING_HEARTBEAT], "steps_per_second": 2.5, "samples_per_second": 80.0}
    signed_at = int(NOW.timestamp())
    base = {name: older[name] for name in contract.REPORT_SIGNED_FIELDS[contract.TRAINING_HEARTBEAT]}
    detail = {
        **older,
        "signed_at": signed_at,
        "signature": report_auth.sign(KEY, contract.TRAINING_HEARTBEAT, base, signed_at=signed_at),
    }

    assert _verify_as_received(detail) is Proof.VALID
    report = REPORT_MODELS[contract.TRAINING_HEARTBEAT].model_validate(detail).report()
    assert report == HeartbeatReport(job_id=JOB, attempt=2, step=1150)
