"""A GPU job whose idle alarms get no GPU metric (the CloudWatch agent is not publishing) is told so
while it runs: once per attempt, in its status and as a `GPU Idle Detection Off` event, after a
grace for boot and the agent's start. The job itself goes on running; nothing is stopped."""

from __future__ import annotations

from gpujobs.contract import IDLE_DETECTION_OFF
from gpujobs.domain.idle_detection import GPU_METRIC_GRACE
from gpujobs.domain.job import Job
from gpujobs.domain.states import JobState
from tests.service.conftest import World, spec


def running(world: World, message_id: str = "msg-1", **overrides: object) -> tuple[Job, str]:
    job = world.submit(spec(**overrides), message_id=message_id).job
    assert job.state is JobState.RUNNING
    (iid,) = job.instance_ids
    return job, iid


def notices(world: World) -> list[dict[str, object]]:
    return [detail for kind, detail in world.publisher.notices if kind == IDLE_DETECTION_OFF]


def test_a_job_whose_gpu_metric_never_arrives_is_told_once_after_the_grace(world: World) -> None:
    job, iid = running(world)
    world.alarms.silent(iid)

    world.clock.advance(minutes=GPU_METRIC_GRACE.seconds // 60 - 1)
    assert world.reconciler.run().repairs["idle detection off noted"] == 0
    world.clock.advance(minutes=1)
    first = world.reconciler.run()
    world.clock.advance(minutes=5)
    again = world.reconciler.run()

    noted = world.store.get(job.job_id)
    assert (first.repairs["idle detection off noted"], again.repairs["idle detection off noted"]) == (1, 0)
    assert noted.state is JobState.RUNNING
    assert noted.status_detail.startswith(f"idle detection is off for this job: no GPU metric from {iid} since ")
    assert "2026-11-29 12:00 UTC" in noted.status_detail  # the attempt's start
    [notice] = notices(world)
    assert (notice["job_id"], notice["attempt"], notice["instance_ids"]) == (job.job_id, 1, [iid])
    assert world.compute.instances[iid].state == "running"


def test_a_job_whose_alarm_is_fed_or_not_yet_evaluated_is_not_told(world: World) -> None:
    fed, fed_iid = running(world)
    unevaluated, _ = running(world, "msg-2", name="fresh")  # its alarm has no evaluation yet (just recreated, say)
    world.alarms.fed(fed_iid)

    world.clock.advance(minutes=60)
    world.reconciler.run()

    assert notices(world) == []
    assert "idle detection" not in world.store.get(fed.job_id).status_detail
    assert "idle detection" not in world.store.get(unevaluated.job_id).status_detail
    assert unevaluated.job_id != fed.job_id


def test_a_replacement_attempt_is_judged_afresh(world: World) -> None:
    job, iid = running(world)
    world.alarms.silent(iid)
    world.clock.advance(minutes=20)
    world.reconciler.run()

    world.reactions.spot_warning(iid)
    world.reactions.instance_state(iid, "terminated")
    world.clock.advance(minutes=5)
    world.reconciler.run()
    replaced = world.store.get(job.job_id)
    (new_iid,) = replaced.instance_ids
    world.alarms.silent(new_iid)
    world.clock.advance(minutes=20)
    world.reconciler.run()

    assert [n["attempt"] for n in notices(world)] == [1, 2]


def test_a_cpu_job_has_no_idle_detection_to_report(world: World) -> None:
    job, iid = running(world, gpus_per_node=0, instance_types=["c7i.large"], capacity="on-demand")
    world.alarms.alarms[iid] = (job.job_id, 5, 30)  # an alarm it should not have, fed nothing
    world.alarms.silent(iid)

    world.clock.advance(minutes=30)
    world.reconciler.run()

    assert notices(world) == []
