"""Issue 22: a spot warning whose reclaim never comes (a drill whose experiment was stopped, or a
warning sent by hand) must not leave the replaced instance running and paid.

The control plane acts on the warning as on any: the job's replacement launches at once. Nothing
else ever takes the warned instance, so the reconciler does once the warning's two minutes and the
grace are over: a single node's attempt as a reclaimed attempt's survivors, a node that left its
gang in a regroup as an orphan.
"""

from __future__ import annotations

from datetime import timedelta

from gpujobs.domain.gangs import RECLAIM_GRACE, SPOT_WARNING_WINDOW
from gpujobs.domain.reports import CheckpointReport, HeartbeatReport
from gpujobs.domain.states import JobState
from tests.service.conftest import World, spec


def live(world: World) -> set[str]:
    return {f.instance.instance_id for f in world.compute.live()}


def test_a_warned_single_node_that_spot_never_takes_is_terminated_after_the_window_and_the_grace(
    world: World,
) -> None:
    # Given a running spot job, warned by hand: its replacement is up beside it
    job = world.store.get(world.submit(spec()).job.job_id)
    (warned,) = job.instance_ids
    world.reactions.spot_warning(warned)
    replaced = world.store.get(job.job_id)
    assert replaced.attempt_count == 2
    assert live(world) == {warned, *replaced.instance_ids}

    # When EC2 never reclaims it: still there within the warning's window and the grace
    world.clock.advance(minutes=4)
    world.reconciler.run()
    assert warned in live(world)

    # Then the reconciler terminates it once they are over, and the replacement trains on
    world.clock.current += SPOT_WARNING_WINDOW + RECLAIM_GRACE
    report = world.reconciler.run()

    assert live(world) == set(replaced.instance_ids)
    assert report.repairs["reclaimed survivors terminated"] == 1
    assert world.store.get(job.job_id).state is JobState.RUNNING


def test_a_gangs_warned_node_that_spot_never_takes_goes_once_its_replacement_has_joined(world: World) -> None:
    # Given a two-node gang that has trained half an hour, one node warned by hand
    job = world.submit(spec(nodes=2, instance_types=["g5.xlarge"], capacity="spot-first")).job
    world.reactions.report(HeartbeatReport(job_id=job.job_id, attempt=1, step=100))
    world.reactions.report(CheckpointReport(job_id=job.job_id, attempt=1, step=100, uri="s3://ckpt-bucket/x/100"))
    world.clock.advance(minutes=30)
    warned = world.store.get(job.job_id).instance_ids[1]
    world.reactions.spot_warning(warned)
    regrouped = world.store.get(job.job_id)
    assert regrouped.current_attempt is not None
    assert regrouped.current_attempt.left == (warned,)
    assert live(world) == {warned, *regrouped.instance_ids}

    # When the window and the grace pass and EC2 has not taken it
    world.clock.current += SPOT_WARNING_WINDOW + RECLAIM_GRACE + timedelta(seconds=1)
    report = world.reconciler.run()

    # Then the node that left the gang is terminated; the regrouped gang stays whole
    assert live(world) == set(regrouped.instance_ids)
    assert report.repairs["orphans terminated"] == 1
    assert world.store.get(job.job_id).state is JobState.RUNNING
