"""Two teams on one local cloud: team B tries each attack of issue 10 on team A's job, and each fails.

The stack runs with a team configuration (`vision` is team A, `speech` team B, each with its own
role). B acts through the paths a job's code or a team member has: messages on the jobs queue
carrying B's `SenderId`, events on the stack's bus, objects in the checkpoint bucket. A's jobs are
real jobs: the bootstrap and the digits trainer run as local processes. Each refusal is checked
where an operator would look: the job's state and problems, the control plane's metrics, the
instance's log.

What the local cloud enforces and what is proven elsewhere:

* **Enforced here** by gpujobs' own code: who may submit and cancel for a team (the submit function
  reads the `SenderId`), ids that cannot be squatted, secrets outside the team's prefix (REJECTED at
  submit), forged reports (the report function verifies the per-attempt signature), a planted
  checkpoint (A's trainer verifies its marker and loads `.metadata` without unpickling), a swapped
  run document (the bootstrap checks the SHA-256 that user data carries).
* **Not enforced by the local cloud**: IAM. Its moto server runs with IAM checks off (every handler
  and instance would need moto IAM users otherwise), so the story plants the checkpoint and swaps
  the run document with the account's own credentials, as a job would if IAM let it, and shows the
  next line of defence holds. IAM itself is proven elsewhere:
  - B's job session reading or writing A's checkpoint prefix is **denied by moto** with its IAM
    enforcement on (`tests/integration/test_job_isolation_policies.py::
    test_on_moto_a_jobs_credentials_cannot_read_or_plant_in_another_jobs_checkpoints`);
  - reading A's secret (`secretsmanager:GetSecretValue` on `gpujobs/<team>/*`), writing a run
    document, putting `gpujobs.instance` events and the session policy are **asserted on the rendered
    documents**, because moto matches those services' resources as `*` and ignores session policies
    and conditions (aws-round2.md §1d): `test_job_isolation_policies.py::
    test_the_job_role_reaches_only_its_own_prefix_its_teams_secrets_and_trainer_events`,
    `::test_no_job_may_write_a_run_document_and_instances_may_only_read_them`,
    `::test_a_session_policy_names_only_its_job_its_team_and_its_teams_data_buckets`.

The refusal of a swapped run document reaches the control plane as that attempt's exit (exit 125,
bootstrap-failed): user data carries, beside the pointer and its digest, the job, attempt and bus
to report to, so a refused document never leaves the job waiting for its instance to vanish.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import secrets
import time
from collections import Counter
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from gpujobs.contract import INSTANCE_SOURCE, TRAINER_SOURCE, ExitCode
from gpujobs.domain.job_ids import job_id_for
from gpujobs.domain.report_auth import sign
from gpujobs.domain.states import JobState
from gpujobs.runtime.observability import metrics
from gpujobs_trainer.layout import COMMIT_FILE, DCP_METADATA_FILE, CommitMarker, step_dir_name
from tests.e2e.conftest import Stage, digits_spec

pytestmark = [pytest.mark.integration, pytest.mark.training]

VISION_ROLE, SPEECH_ROLE = "AROAVISIONTEAMEXAMPLE", "AROASPEECHTEAMEXAMPLE"
ALICE, MALLORY = f"{VISION_ROLE}:alice", f"{SPEECH_ROLE}:mallory"  # SenderIds of sessions of the two roles
TEAMS = json.dumps({"teams": {"vision": {"principals": [VISION_ROLE]}, "speech": {"principals": [SPEECH_ROLE]}}})
PLANTED_STEP = 99_999_990  # newer than anything A saves, so A's trainer looks at it first


class _MakesDirectoryWhenUnpickled:
    """A `.metadata` payload: unpickling it runs `os.mkdir(path)`, code of the attacker's choosing."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (self.path,))


def _count_metrics(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """What the handlers count (they run in this process; the local cloud does not ship metrics)."""
    counted: Counter[str] = Counter()
    add_metric = metrics.add_metric

    def counting(*, name: str, **rest: Any) -> None:
        counted[name] += 1
        add_metric(name=name, **rest)

    monkeypatch.setattr(metrics, "add_metric", counting)
    return counted


def _rejected(stage: Stage, message_id: str) -> tuple[str, ...]:
    """The problems of the REJECTED record a message left (recorded under the message's id)."""
    job = stage.wait_state(job_id_for(client_token=None, team=None, message_id=message_id), JobState.REJECTED)
    return job.problems


def _forged(detail_type: str, detail: dict[str, Any]) -> dict[str, Any]:
    """`detail` signed with a key that is not the attempt's (B's own attempt key would be no better)."""
    signed_at = int(time.time())
    return {
        **detail,
        "signed_at": signed_at,
        "signature": sign(secrets.token_bytes(32), detail_type, detail, signed_at=signed_at),
    }


def _offloaded_spec() -> dict[str, Any]:
    """A job of team A whose run document is too large for user data, so it goes to S3 with its SHA-256."""
    env = {f"VOCABULARY_{i}": secrets.token_urlsafe(3000) for i in range(6)}  # ~24 KB that gzip cannot shrink
    return digits_spec(team="vision", name="vision-big-env", env=env)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("session_options", [{"teams": TEAMS}], ids=["two-teams"])
def test_each_attack_by_one_teams_job_on_anothers_is_refused_and_recorded(
    stage: Stage, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    counted = _count_metrics(monkeypatch)
    cloud = stage.cloud
    bucket = cloud.outputs["CheckpointBucketName"]
    s3 = cloud.client("s3")
    a_secret = cloud.client("secretsmanager").create_secret(Name="gpujobs/vision/hf", SecretString="hf_vision")["ARN"]
    a_spec = digits_spec(team="vision", token="vision-nightly", steps=3000, checkpoint_every=100, step_sleep=0.05)
    a_job = job_id_for(client_token="vision-nightly", team="vision", message_id=None)

    # 1a. B submits for team A, with the token A will use next (to squat A's job id): REJECTED, id left free
    problems = _rejected(stage, stage.session.send(a_spec, sender=MALLORY))
    assert any("'vision'" in p and SPEECH_ROLE in p for p in problems), problems
    assert stage.state(a_job) is None
    # ... and A's own submission with that token gets its id, and runs
    assert stage.submit(a_spec, sender=ALICE) == a_job
    (a_instance,) = stage.wait_running(a_job).instance_ids
    stage.wait("A's first checkpoint", lambda: stage.job(a_job).checkpoint_step is not None, 120)

    # 4. B names A's secret in its own job: REJECTED naming the prefix B may read
    b_spec = digits_spec(team="speech", secrets={"HF_TOKEN": a_secret})
    problems = _rejected(stage, stage.session.send(b_spec, sender=MALLORY))
    assert any("HF_TOKEN" in p and "gpujobs/speech/" in p for p in problems), problems
    assert stage.state(job_id_for(client_token=b_spec["client_token"], team="speech", message_id=None)) is None

    # 1b. B cancels A's job: refused, counted, consumed; A keeps running on its instance
    stage.session.send({"cancel_job_id": a_job}, sender=MALLORY)
    stage.wait("the refused cancel", lambda: counted["CancelsRefused"] == 1, 30)
    assert stage.job(a_job).state is JobState.RUNNING
    assert stage.live_instances() == [a_instance]

    # 2. B forges A's reports on the bus: ignored as forged, A's record unchanged
    bus = cloud.outputs["EventBusName"]
    exit_1 = {"job_id": a_job, "attempt": 1, "node_rank": 0, "instance_id": a_instance, "exit_code": 1}
    forged_step = {"job_id": a_job, "attempt": 1, "step": 2999, "uri": f"s3://{bucket}/jobs/{a_job}/ckpt/x"}
    cloud.put_event(source=INSTANCE_SOURCE, detail_type="Job Exited", detail=_forged("Job Exited", exit_1), bus=bus)
    cloud.put_event(
        source=TRAINER_SOURCE,
        detail_type="Checkpoint Committed",
        detail=_forged("Checkpoint Committed", forged_step),
        bus=bus,
    )
    stage.wait("both forged reports", lambda: counted["ForgedReports"] == 2, 30)
    a = stage.job(a_job)
    assert a.state is JobState.RUNNING
    assert a.attempt(1).exit_codes == {}  # type: ignore[union-attr]
    assert a.checkpoint_step is not None
    assert a.checkpoint_step < 2999

    # 5. B swaps the run document of A's next job in S3 between its launch and its boot
    pwned = tmp_path / "run-document-command-ran"
    with stage.runner.boots_held():
        a2_job = stage.submit(_offloaded_spec(), sender=ALICE)
        key = f"jobs/{a2_job}/attempt-1/run.json"
        stage.wait(
            "A's second job launched", lambda: bool(s3.list_objects_v2(Bucket=bucket, Prefix=key).get("Contents")), 60
        )
        document = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        document["command"] = ["python", "-c", f"import os; os.mkdir({str(pwned)!r})"]
        s3.put_object(Bucket=bucket, Key=key, Body=json.dumps(document).encode())
    (a2_instance,) = stage.job(a2_job).attempts[0].instance_ids
    stage.wait("the bootstrap's refusal", lambda: "user data expects" in stage.log_text(a2_instance), 60)
    assert "refused" in stage.log_text(a2_instance)
    stage.wait("A's second machine to be off", lambda: stage.machine_is_off(a2_instance), 60)
    assert not pwned.exists(), "the swapped run document's command ran"
    stage.wait(
        "the refusal reported as the attempt's exit",
        lambda: ExitCode.BOOTSTRAP_FAILED in getattr(stage.job(a2_job).attempt(1), "exit_codes", {}).values(),
        60,
    )
    # A gives that job up
    stage.session.send({"cancel_job_id": a2_job}, sender=ALICE)
    stage.wait_state(a2_job, JobState.CANCELLED, timeout=30)

    # 3. B plants a checkpoint in A's prefix whose .metadata runs code when unpickled, with a marker
    #    that vouches for it (A's job id, the digests of what it lists); then A's spot instance goes
    ran = tmp_path / "planted-pickle-ran"
    payload = pickle.dumps(_MakesDirectoryWhenUnpickled(str(ran)))
    folder = f"jobs/{a_job}/ckpt/{step_dir_name(PLANTED_STEP)}"
    marker = CommitMarker(
        step=PLANTED_STEP,
        world_size=2,
        torch_version=version("torch"),
        reason="periodic",
        files={DCP_METADATA_FILE: len(payload)},
        digests={DCP_METADATA_FILE: hashlib.sha256(payload).hexdigest()},
        time="2026-11-30T00:00:00Z",
        job_id=a_job,
        attempt=1,
    )
    s3.put_object(Bucket=bucket, Key=f"{folder}/{DCP_METADATA_FILE}", Body=payload)
    s3.put_object(Bucket=bucket, Key=f"{folder}/{COMMIT_FILE}", Body=marker.to_json().encode())
    stage.runner.interrupt_spot(a_instance, notice_seconds=10)
    (replacement,) = stage.wait_running(a_job, attempt=2, timeout=90).instance_ids
    stage.wait("A's replacement to resume", lambda: stage.trainer_line(replacement, "resumed") is not None, 150)
    preempted = stage.preemption_checkpoint(a_job, 1, timeout=30)
    resumed = stage.trainer_line(replacement, "resumed")
    assert resumed is not None
    assert resumed["step"] == preempted.step  # A's own newest, exactly where its first attempt stopped
    assert f"skipping checkpoint step {PLANTED_STEP}" in stage.log_text(replacement)
    assert not ran.exists(), "the planted pickle ran in A's trainer"

    # A itself may cancel its job; nothing B did retried or dead-lettered anything
    stage.session.send({"cancel_job_id": a_job}, sender=ALICE)
    assert stage.wait_state(a_job, JobState.CANCELLED, timeout=60).state is JobState.CANCELLED
    stage.wait_nothing_running()
    assert counted["CancelsRefused"] == 1
    assert counted["JobsRejected"] == 2
    assert stage.failed_deliveries() == []
