"""One job record this release cannot read never stops the reconciler's pass.

After a rollback the table may hold a record a newer release wrote with a value this release has no
name for. Before, the listing raised on it and the whole run failed every minute: no lost state
change was repaired, no queued job launched, for any job. Now the item is skipped, logged with its
key and counted (`RepairsUnreadableRecordsSkipped`), its instances are left alone (nothing here can
tell whether its job still runs them), and every other job is reconciled as usual.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest

from gpujobs.domain.job import Job
from gpujobs.domain.states import JobState
from gpujobs.service.ports import UnreadableJobError
from gpujobs.service.repairs import Repair
from gpujobs.service.sweeps import ORPHAN_GRACE
from tests.service.conftest import World, spec


def running(world: World, message_id: str) -> Job:
    job = world.submit(spec(capacity="on-demand", client_token=message_id), message_id=message_id).job
    assert job.state is JobState.RUNNING
    return job


def test_the_pass_skips_the_unreadable_job_and_repairs_every_other(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    unreadable, other = running(world, "newer"), running(world, "ours")
    (other_instance,) = other.instance_ids
    world.store.make_unreadable(unreadable.job_id, "history.3.reason: 'first-heartbeat-overdue' is no Reason")
    world.compute.terminate([other_instance])  # EC2 took it; the event never arrived
    world.clock.advance(seconds=ORPHAN_GRACE.total_seconds() + 60)

    with caplog.at_level(logging.ERROR):
        first = world.reconciler.run()
    world.clock.advance(seconds=91)
    world.reconciler.run()

    assert first.repairs[Repair.UNREADABLE_RECORDS_SKIPPED] == 1
    assert first.repairs[Repair.LOST_STATE_CHANGES_REPAIRED] == 1
    assert first.repairs[Repair.ERRORS] == 0
    assert any(unreadable.job_id in r.getMessage() for r in caplog.records)
    relaunched = world.store.get(other.job_id)
    assert relaunched.current_attempt is not None
    assert relaunched.current_attempt.number == 2
    assert relaunched.state is JobState.RUNNING
    (kept,) = unreadable.instance_ids
    assert kept in [i.instance_id for i in world.compute.list_instances()]  # never taken for an orphan


def test_a_listing_without_an_observer_names_the_unreadable_item() -> None:
    world = World()
    job = running(world, "newer")
    world.store.make_unreadable(job.job_id, "state: 'PAUSED' is no JobState")

    with pytest.raises(UnreadableJobError, match=job.job_id):
        world.store.list_by_state(JobState.RUNNING)
    assert world.store.list_by_state(JobState.RUNNING, on_unreadable=lambda _: None) == []


def test_a_queued_job_still_launches_while_another_record_is_unreadable(world: World) -> None:
    blocked = running(world, "newer")
    world.store.make_unreadable(blocked.job_id, "attempts.0.market: 'capacity-block' is no Market")
    world.compute.refuse[("g5.xlarge", "us-east-1a", "on-demand")] = "InsufficientInstanceCapacity"
    world.compute.refuse[("g5.xlarge", "us-east-1b", "on-demand")] = "InsufficientInstanceCapacity"
    world.compute.refuse[("g6.xlarge", "us-east-1a", "on-demand")] = "InsufficientInstanceCapacity"
    world.compute.refuse[("g6.xlarge", "us-east-1b", "on-demand")] = "InsufficientInstanceCapacity"
    waiting = world.submit(spec(capacity="on-demand", client_token="waits"), message_id="waits").job
    assert waiting.state is JobState.QUEUED
    world.compute.refuse.clear()
    world.clock.advance(seconds=timedelta(hours=1).total_seconds())

    report = world.reconciler.run()

    assert report.repairs[Repair.UNREADABLE_RECORDS_SKIPPED] == 1
    assert world.store.get(waiting.job_id).state is JobState.RUNNING
