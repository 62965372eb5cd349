"""One gang per attempt: an attempt never holds a broken gang, nor outlives its replacement for long.

Stories: a launcher crashes after RunInstances and a node of its unrecorded gang dies before the
takeover, so the takeover terminates the survivors and launches a whole gang as a new attempt;
spot reclaims one node of a gang and the other nodes' trainers hang instead of exiting, so the
reconciler terminates them once the warning window and a grace have passed.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from gpujobs.domain.fate import REPORT_GRACE
from gpujobs.domain.gangs import RECLAIM_GRACE, SPOT_WARNING_WINDOW
from gpujobs.domain.launching import LAUNCH_LEASE
from gpujobs.domain.states import JobState
from tests.service.conftest import World, spec


class CrashAfterLaunchError(Exception):
    pass


def test_a_takeover_that_finds_a_partial_gang_terminates_it_and_launches_a_whole_one(world: World) -> None:
    original = world.store.save

    def crashing_save(job: Any) -> Any:
        if job.state is JobState.RUNNING:
            raise CrashAfterLaunchError
        return original(job)

    world.store.save = crashing_save  # type: ignore[method-assign]
    with pytest.raises(CrashAfterLaunchError):
        world.submit(spec(nodes=4), message_id="m-1")
    world.store.save = original  # type: ignore[method-assign]
    first_gang = [f.instance.instance_id for f in world.compute.live()]
    world.compute.terminate(first_gang[:1])  # one node is reclaimed before anyone recorded the gang

    world.clock.current += LAUNCH_LEASE + timedelta(minutes=1)
    job = world.submit(spec(nodes=4), message_id="m-1").job

    assert job.state is JobState.RUNNING
    assert len(job.instance_ids) == 4
    assert not set(job.instance_ids) & set(first_gang)
    assert {f.instance.instance_id for f in world.compute.live()} == set(job.instance_ids)
    broken = job.attempt(1)
    assert broken is not None
    assert broken.is_over
    assert set(broken.instance_ids) == set(first_gang[1:])


def test_the_survivors_of_a_reclaimed_gang_are_terminated_after_the_warning_window_and_a_grace(world: World) -> None:
    # a `directory` script's gang is replaced whole (it cannot regroup in place: `domain.regroup`)
    job = world.store.get(world.submit(spec(nodes=4, checkpoint="directory")).job.job_id)
    old_gang = job.instance_ids
    world.reactions.spot_warning(old_gang[0])
    world.clock.advance(minutes=2)
    world.compute.terminate(old_gang[:1])  # spot takes the warned node; the other trainers hang
    world.reactions.instance_state(old_gang[0], "terminated")
    replacement = world.store.get(job.job_id)
    assert replacement.state is JobState.RUNNING
    assert replacement.attempt_count == 2

    world.reconciler.run()
    assert {f.instance.instance_id for f in world.compute.live()} >= set(old_gang[1:])  # still in their window

    first = replacement.attempt(1)
    assert first is not None
    assert first.interrupted_at is not None
    world.clock.current = first.interrupted_at + SPOT_WARNING_WINDOW + RECLAIM_GRACE
    report = world.reconciler.run()

    assert report.repairs["reclaimed survivors terminated"] == 3
    assert {f.instance.instance_id for f in world.compute.live()} == set(replacement.instance_ids)
    for iid in old_gang[1:]:
        world.reactions.instance_state(iid, "terminated")
    world.clock.advance(minutes=2)
    world.reconciler.run()
    after = world.store.get(job.job_id)
    reclaimed = after.attempt(1)
    assert reclaimed is not None
    assert reclaimed.is_over
    assert after.state is JobState.RUNNING


def test_a_node_that_vanishes_without_a_word_ends_its_gang_and_the_job_is_relaunched(world: World) -> None:
    # Given a running 4-node spot gang
    job = world.store.get(world.submit(spec(nodes=4)).job.job_id)
    gang = job.instance_ids
    # When one node is gone with no warning and no exit report, and the others' trainers hang
    world.compute.terminate(gang[:1])
    world.reactions.instance_state(gang[0], "terminated")
    world.reconciler.run()
    assert {f.instance.instance_id for f in world.compute.live()} >= set(gang[1:])  # reports may be in flight

    # Then once the report grace is over the rest of the gang is terminated
    world.clock.current += REPORT_GRACE
    world.reconciler.run()
    assert not {f.instance.instance_id for f in world.compute.live()} & set(gang)
    for iid in gang[1:]:
        world.reactions.instance_state(iid, "terminated")
    world.clock.current += REPORT_GRACE
    world.reconciler.run()

    # and a whole new gang runs the job
    after = world.store.get(job.job_id)
    assert after.state is JobState.RUNNING
    assert after.attempt_count == 2
    assert len(after.instance_ids) == 4
    assert not set(after.instance_ids) & set(gang)
