"""A job's `trainer:` settings travel to its instances, and its hang limits are its own."""

from __future__ import annotations

import json

from gpujobs.domain.job import Job
from gpujobs.domain.reports import HeartbeatReport
from gpujobs.domain.states import JobState
from tests.service.conftest import World, dumped_then_killed, spec


def running(world: World, **overrides: object) -> Job:
    job = world.submit(spec(**overrides)).job
    assert job.state is JobState.RUNNING
    return job


def test_the_run_document_carries_the_settings_the_job_changed(world: World) -> None:
    running(world, trainer={"collective_timeout_seconds": 900, "compile": True, "heartbeat_overdue_minutes": 60})

    document = json.loads(world.compute.calls[0].user_data)
    assert document["trainer_env"] == {"GPUJOBS_COLLECTIVE_TIMEOUT_SECONDS": "900", "GPUJOBS_COMPILE": "1"}


def test_a_job_with_a_longer_overdue_limit_is_not_taken_for_hung_before_it(world: World) -> None:
    job = running(world, trainer={"heartbeat_overdue_minutes": 45})
    (iid,) = world.store.get(job.job_id).instance_ids
    world.reactions.report(HeartbeatReport(job_id=job.job_id, attempt=1, step=10))

    world.clock.advance(minutes=16)  # past the default limit of 15 minutes
    assert world.reconciler.run().repairs["hung attempts terminated"] == 0
    world.clock.advance(minutes=30)
    report = dumped_then_killed(world)

    assert report.repairs["hung attempts terminated"] == 1
    assert iid in world.compute.terminated


def test_heartbeats_at_the_same_step_keep_a_long_evaluation_alive(world: World) -> None:
    job = running(world)
    (iid,) = world.store.get(job.job_id).instance_ids
    world.reactions.report(HeartbeatReport(job_id=job.job_id, attempt=1, step=10))

    for _ in range(4):  # 40 minutes inside run.busy(): the keep-alive repeats step 10
        world.clock.advance(minutes=10)
        world.reactions.report(HeartbeatReport(job_id=job.job_id, attempt=1, step=10))
        world.reconciler.run()

    assert iid not in world.compute.terminated
    assert world.store.get(job.job_id).state is JobState.RUNNING


# ---- the first heartbeat: a trainer stuck before training began (NCCL/EFA initialisation) ----------
def test_an_attempt_that_never_sends_its_first_heartbeat_is_replaced_after_the_jobs_limit(world: World) -> None:
    job = running(world, trainer={"first_heartbeat_minutes": 20}, max_runtime_minutes=1440)
    (iid,) = world.store.get(job.job_id).instance_ids

    world.clock.advance(minutes=19)
    assert world.reconciler.run().repairs["hung attempts terminated"] == 0
    assert iid not in world.compute.terminated
    world.clock.advance(minutes=1)
    report = dumped_then_killed(world)

    assert report.repairs["hung attempts terminated"] == 1
    assert iid in world.compute.terminated
    world.reactions.instance_state(iid, "terminated")  # then, as for any hang, the lost gang is replaced
    world.clock.advance(minutes=4)
    world.reconciler.run()
    replaced = world.store.get(job.job_id)
    assert replaced.state is JobState.RUNNING
    assert [a.is_over for a in replaced.attempts] == [True, False]
    assert iid not in replaced.instance_ids


def test_the_first_heartbeat_limit_defaults_to_thirty_minutes_and_a_heartbeat_lifts_it(world: World) -> None:
    silent = running(world)
    (silent_iid,) = world.store.get(silent.job_id).instance_ids
    started = world.submit(spec(name="started"), message_id="msg-2").job
    (started_iid,) = world.store.get(started.job_id).instance_ids

    world.clock.advance(minutes=29)
    world.reactions.report(HeartbeatReport(job_id=started.job_id, attempt=1, step=1))
    assert world.reconciler.run().repairs["hung attempts terminated"] == 0
    world.clock.advance(minutes=2)  # 31 minutes in: past the first-heartbeat limit, not the overdue one
    report = dumped_then_killed(world)

    assert report.repairs["hung attempts terminated"] == 1
    assert silent_iid in world.compute.terminated
    assert started_iid not in world.compute.terminated


def test_a_script_without_the_trainer_library_is_never_judged_by_its_first_heartbeat(world: World) -> None:
    job = running(world, checkpoint="directory")
    (iid,) = world.store.get(job.job_id).instance_ids

    world.clock.advance(minutes=120)
    world.reconciler.run()

    assert iid not in world.compute.terminated
    assert world.store.get(job.job_id).state is JobState.RUNNING
