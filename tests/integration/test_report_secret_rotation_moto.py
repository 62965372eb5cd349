"""The report secret can be rotated while jobs run: both versions verify for a grace, then one.

Before, the reports function read the secret once per container and verified under that value
only: a rotation made every running attempt's reports unprovable at once (their keys were derived
from the old value), and a container that had cached the old value refused the reports of attempts
launched after it. Now reports verify under the key of the secret's `AWSCURRENT` version and, for
`grace` after that version was created, of its `AWSPREVIOUS` version; a container re-reads the
secret when a report matches neither (at most once a minute) and when its copy is ten minutes old.
Played on moto's Secrets Manager, whose `PutSecretValue` moves the staging labels as AWS does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import boto3
import pytest
from moto import mock_aws

from gpujobs.adapters.secrets import REFRESH_AT_MOST_EVERY, SECRET_MAX_AGE, StackSecretReportKeys
from gpujobs.domain.effects import Outcome
from gpujobs.domain.job import Job
from gpujobs.domain.reports import HeartbeatReport, SignedReport
from gpujobs.domain.states import JobState
from gpujobs.service.reactions import Reaction
from gpujobs_trainer.signing import signed
from tests.service.conftest import World, spec

pytestmark = pytest.mark.integration

GRACE = timedelta(hours=24)


@dataclass
class Monotonic:
    """The adapter's cache clock, moved by hand (never the wall clock)."""

    seconds: float = 1000.0

    def __call__(self) -> float:
        return self.seconds

    def advance(self, delta: timedelta) -> None:
        self.seconds += delta.total_seconds()


@dataclass
class Secret:
    client: Any
    arn: str

    def rotate(self) -> datetime:
        """Put a new version (AWSCURRENT moves to it, AWSPREVIOUS to the old one); when it was created."""
        self.client.put_secret_value(SecretId=self.arn, SecretString=f"rotated-{datetime.now().timestamp()}")
        created: datetime = self.client.get_secret_value(SecretId=self.arn)["CreatedDate"]
        return created

    def keys(self, monotonic: Monotonic) -> StackSecretReportKeys:
        """What one Lambda container holds."""
        return StackSecretReportKeys(client=self.client, secret_id=self.arn, grace=GRACE, monotonic=monotonic)


@pytest.fixture
def secret(aws_credentials: None) -> Iterator[Secret]:
    with mock_aws():
        client = boto3.client("secretsmanager", region_name="us-east-1")
        arn = client.create_secret(Name="gpujobs-report-secret", SecretString="the first version")["ARN"]
        yield Secret(client, arn)


def launched(world: World, token: str) -> tuple[Job, bytes]:
    """A running job and the report key its attempt's user data holds."""
    job = world.submit(spec(client_token=token), message_id=token).job
    assert job.state is JobState.RUNNING
    (request,) = [r for r in world.compute.calls if r.job_id == job.job_id]
    return job, bytes.fromhex(json.loads(request.user_data)["report_key"])


def heartbeat(world: World, job: Job, key: bytes, step: int) -> Reaction:
    report = HeartbeatReport(job_id=job.job_id, attempt=1, step=step)
    detail = signed(key, report.DETAIL_TYPE, report.signed_fields(), now=world.clock.now().timestamp())
    return world.reports.receive(SignedReport(report, signed_at=detail["signed_at"], signature=detail["signature"]))


def heartbeat_step(world: World, job: Job) -> int | None:
    attempt = world.store.get(job.job_id).current_attempt
    return attempt.heartbeat_step if attempt else None


def test_an_attempt_launched_before_a_rotation_is_heard_during_the_grace_and_refused_after(secret: Secret) -> None:
    monotonic = Monotonic()
    world = World().rewire(report_keys=secret.keys(monotonic))
    job, old_key = launched(world, "before")

    rotated_at = secret.rotate()
    monotonic.advance(SECRET_MAX_AGE)  # the container's copy is old enough to be read again
    world.clock.current = rotated_at + GRACE - timedelta(minutes=1)
    during = heartbeat(world, job, old_key, step=100)
    world.clock.current = rotated_at + GRACE + timedelta(minutes=1)
    after = heartbeat(world, job, old_key, step=200)

    assert during.outcome is Outcome.HEARTBEAT_RECORDED
    assert after.outcome is Outcome.UNPROVEN_REPORT
    assert after.metrics == {"ForgedReports": 1}
    assert after.detail.endswith("signature does not match")
    assert heartbeat_step(world, job) == 100


def test_a_report_under_an_unknown_key_is_refused_with_its_reason(secret: Secret) -> None:
    world = World().rewire(report_keys=secret.keys(Monotonic()))
    job, _ = launched(world, "honest")
    world.clock.current = secret.rotate() + timedelta(minutes=5)

    refused = heartbeat(world, job, b"a key derived from no version of the secret", step=100)

    assert refused.outcome is Outcome.UNPROVEN_REPORT
    assert refused.detail == f"Training Heartbeat for {job.job_id} attempt 1: signature does not match"
    assert heartbeat_step(world, job) is None


def test_a_container_that_cached_the_old_version_re_reads_it_when_a_newer_attempts_report_arrives(
    secret: Secret,
) -> None:
    stale = Monotonic()
    cached = secret.keys(stale)
    world = World().rewire(report_keys=cached)
    launched(world, "read-the-secret")  # this container has now cached the first version
    rotated_at = secret.rotate()
    world.rewire(report_keys=secret.keys(Monotonic()))  # another container, started after, launches
    job, new_key = launched(world, "after")
    world.rewire(report_keys=cached)  # and its attempt's report reaches the first container
    world.clock.current = rotated_at + timedelta(minutes=1)

    stale.advance(REFRESH_AT_MOST_EVERY / 2)
    too_soon = heartbeat(world, job, new_key, step=100)  # re-read only a minute after the last read
    stale.advance(REFRESH_AT_MOST_EVERY)
    re_read = heartbeat(world, job, new_key, step=200)

    assert too_soon.outcome is Outcome.UNPROVEN_REPORT
    assert re_read.outcome is Outcome.HEARTBEAT_RECORDED
    assert heartbeat_step(world, job) == 200


def test_launches_derive_from_the_new_version_once_the_cached_copy_is_old(secret: Secret) -> None:
    monotonic = Monotonic()
    keys = secret.keys(monotonic)
    before = keys.key_for(job_id="j-0000000000000001", attempt=1)
    secret.rotate()

    cached = keys.key_for(job_id="j-0000000000000001", attempt=1)
    monotonic.advance(SECRET_MAX_AGE)
    refreshed = keys.key_for(job_id="j-0000000000000001", attempt=1)

    assert cached == before
    assert refreshed != before
    assert refreshed == secret.keys(Monotonic()).key_for(job_id="j-0000000000000001", attempt=1)
