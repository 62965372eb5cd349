"""An ended job's objects go `CheckpointRetentionDays` after its end; an active job's never (issue 19, item 12).

The bucket's lifecycle rule counted from each object's creation: a `directory` job running for 31
days lost the blobs it had not changed since its first sync, and its `code:` archive, and could not
restore. The reconciler now deletes a job's prefix only once the job has ended and the retention has
passed since its end, and notes it on the record.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpujobs.domain import retention
from gpujobs.domain.job import Job
from gpujobs.domain.job_access import job_prefix
from gpujobs.domain.reports import ExitReport, HeartbeatReport
from gpujobs.domain.states import JobState
from gpujobs.service.repairs import Repair
from tests.service.cloud import MARKETS
from tests.service.conftest import World, spec

DAY = timedelta(days=1)


def store_objects(world: World, job: Job, count: int = 3) -> set[str]:
    """What the CLI and the launcher write under the job's prefix at its start: the `code:` archive, blobs."""
    keys = {f"{job_prefix(job.job_id)}code/abc.tar.gz"} | {
        f"{job_prefix(job.job_id)}ckpt/blobs/{n:04d}" for n in range(count - 1)
    }
    for key in keys:
        world.blobs.put_text(key, "bytes")
    return keys


def a_day_passes(world: World, job: Job, step: int) -> None:
    world.clock.advance(seconds=DAY.total_seconds())
    attempt = world.store.get(job.job_id).current_attempt
    assert attempt is not None
    world.reactions.report(HeartbeatReport(job_id=job.job_id, attempt=attempt.number, step=step))
    world.reconciler.run()


def finish(world: World, job: Job) -> Job:
    attempt = world.store.get(job.job_id).current_attempt
    assert attempt is not None
    (iid,) = attempt.instance_ids
    world.reactions.report(ExitReport(job_id=job.job_id, attempt=attempt.number, exit_code=0, instance_id=iid))
    world.reactions.instance_state(iid, "terminated")
    return world.store.get(job.job_id)


def test_a_job_that_waited_then_ran_37_days_keeps_its_oldest_objects_and_loses_them_30_days_after_its_end(
    world: World,
) -> None:
    pools = [(t, z, m) for t in ("g5.xlarge", "g6.xlarge") for z in ("us-east-1a", "us-east-1b") for m in MARKETS]
    world.compute.refuse.update(dict.fromkeys(pools, "InsufficientInstanceCapacity"))
    job = world.submit(spec(checkpoint="directory", max_runtime_minutes=43_200)).job
    keys = store_objects(world, job)  # the code archive, uploaded before the submission
    world.blobs.put_text(f"outputs/default/{job.job_id}/model.safetensors", "weights")
    for _ in range(12):  # a capacity crunch: QUEUED for 12 days
        world.clock.advance(seconds=DAY.total_seconds())
        world.reconciler.run()
    assert world.store.get(job.job_id).state is JobState.QUEUED
    world.compute.refuse.clear()
    world.reconciler.run()
    for day in range(25):
        a_day_passes(world, job, step=day)

    assert world.store.get(job.job_id).state is JobState.RUNNING
    assert keys <= world.blobs.objects.keys()  # 37 days old, and the job still needs them to restore

    ended = finish(world, job)
    assert ended.state is JobState.SUCCEEDED
    world.clock.advance(seconds=(timedelta(days=10)).total_seconds())
    other = world.submit(spec(checkpoint="directory", name="other"), message_id="msg-2").job
    others = store_objects(world, other)
    assert finish(world, other).state is JobState.SUCCEEDED  # ended 10 days after the first
    world.clock.advance(seconds=(retention.OBJECT_RETENTION - timedelta(days=10, minutes=1)).total_seconds())
    early = world.reconciler.run()
    assert keys <= world.blobs.objects.keys()
    assert early.repairs[Repair.ENDED_JOBS_OBJECTS_DELETED] == 0

    world.clock.advance(minutes=1)
    due = world.reconciler.run()
    again = world.reconciler.run()

    assert due.repairs[Repair.ENDED_JOBS_OBJECTS_DELETED] == 1
    assert not keys & world.blobs.objects.keys()
    assert others <= world.blobs.objects.keys()  # ended 20 days ago: kept 10 days more
    assert f"outputs/default/{job.job_id}/model.safetensors" in world.blobs.objects  # outputs are never swept
    record = world.store.get(job.job_id)
    assert record.state is JobState.SUCCEEDED
    assert record.objects_deleted_at == world.clock.now()
    assert again.repairs[Repair.ENDED_JOBS_OBJECTS_DELETED] == 0
    assert world.blobs.deleted_prefixes == [job_prefix(job.job_id)]  # once: the record took it out of the index


def test_a_prefix_too_big_for_one_run_is_finished_by_the_next(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retention, "KEYS_DELETED_PER_JOB", 4)
    job = world.submit(spec(checkpoint="directory")).job
    keys = store_objects(world, job, count=7)
    finish(world, job)
    world.clock.advance(seconds=retention.OBJECT_RETENTION.total_seconds())

    first = world.reconciler.run()
    left_after_one = keys & world.blobs.objects.keys()
    noted_after_one = world.store.get(job.job_id).objects_deleted_at
    second = world.reconciler.run()

    assert len(left_after_one) == 3
    assert first.repairs[Repair.ENDED_JOBS_OBJECTS_DELETED] == 0
    assert noted_after_one is None  # not noted while objects are left: the next run goes on
    assert second.repairs[Repair.ENDED_JOBS_OBJECTS_DELETED] == 1
    assert world.store.get(job.job_id).objects_deleted_at is not None
    assert not keys & world.blobs.objects.keys()


def test_a_failed_delete_is_counted_and_retried_next_run(world: World) -> None:
    job = world.submit(spec(checkpoint="directory")).job
    keys = store_objects(world, job)
    finish(world, job)
    world.clock.advance(seconds=retention.OBJECT_RETENTION.total_seconds())
    works = world.blobs.delete_prefix

    def refuse(prefix: str, *, max_keys: int) -> bool:
        raise RuntimeError("SlowDown")

    world.blobs.delete_prefix = refuse  # type: ignore[method-assign]
    failed = world.reconciler.run()
    world.blobs.delete_prefix = works  # type: ignore[method-assign]
    retried = world.reconciler.run()

    assert failed.repairs[Repair.ERRORS] == 1
    assert retried.repairs[Repair.ENDED_JOBS_OBJECTS_DELETED] == 1
    assert not keys & world.blobs.objects.keys()
