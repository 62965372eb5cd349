"""State changes go out from the record itself (issue 19, item 8: the outbox gap, closed).

Handlers only write jobs; the table's stream hands every write (old and new image) to the
Publisher function's outbox, which publishes the transitions the write added. Before, a handler
published after its write: one that died between the two, or whose PutEvents failed, lost those
events for good. These stories fail on that code: the event never arrives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from gpujobs.domain.states import JobState
from gpujobs.service.outbox import Outbox, StreamedWrite, UnreadableWrite
from gpujobs.service.ports import StateChanged
from gpujobs_fakes.memory import RecordingPublisher
from tests.service.conftest import World, spec
from tests.service.faults import FaultPlan, InjectedFaultError, When, wrap_ports


@dataclass
class DownPublisher(RecordingPublisher):
    """EventBridge refusing PutEvents `down` more times, then taking them."""

    down: int = 0
    refused: list[Sequence[StateChanged]] = field(default_factory=list)

    def publish(self, events: Sequence[StateChanged]) -> None:
        if self.down > 0:
            self.down -= 1
            self.refused.append(events)
            raise RuntimeError("EventBridge refused 1 events: ThrottlingException")
        super().publish(events)


def _published(world: World, job_id: str) -> list[tuple[str | None, str, int]]:
    events = [e for e in world.publisher.events if e.job_id == job_id]
    return [(e.source.value if e.source else None, e.target.value, e.sequence) for e in events]


def _history(world: World, job_id: str) -> list[tuple[str | None, str, int]]:
    job = world.store.get(job_id)
    first = job.history_dropped + 1
    return [(h.source.value if h.source else None, h.target.value, first + i) for i, h in enumerate(job.history)]


def test_a_handler_that_dies_right_after_its_write_still_has_its_state_change_published(world: World) -> None:
    # Given a running job, and a spot function that will die right after its write commits
    job = world.submit(spec(capacity="spot")).job
    plan = FaultPlan()
    world.rewire(**wrap_ports(world.ports, plan, is_port=lambda port: port is world.store))
    plan.arm("store", "save", When.AFTER)

    # When the spot warning's handler writes the interruption and dies before anything else
    with pytest.raises(InjectedFaultError):
        world.reactions.spot_warning(job.instance_ids[0])

    # Then the transition it wrote is on the bus all the same, in the job's order
    assert plan.fired
    assert ("RUNNING", "INTERRUPTED", 4) in _published(world, job.job_id)
    assert _published(world, job.job_id) == _history(world, job.job_id)


def test_a_refused_put_events_goes_out_with_the_next_read_of_the_stream_and_nothing_overtakes_it(world: World) -> None:
    # Given EventBridge refusing the next two PutEvents
    down = DownPublisher(down=2)
    world.publisher = down
    world.rewire(publisher=down)

    # When a job is submitted (its creation and launch are written while the bus refuses them)
    job = world.submit(spec()).job
    assert len(down.refused) == 2
    assert _published(world, job.job_id)[:1] == [(None, "QUEUED", 1)]  # the third write's read put all three

    # Then every transition is published once the bus takes them, in the job's order, none lost
    world.reactions.spot_warning(job.instance_ids[0])
    assert _published(world, job.job_id) == _history(world, job.job_id)
    assert world.store.stream.unread == 0


def test_while_the_bus_is_down_the_stream_keeps_every_write_and_a_later_read_publishes_them_in_order(
    world: World,
) -> None:
    # Given the Publisher function down (nobody reads the stream) while a job launches and is replaced
    world.store.stream.reads_on_write = False
    job = world.submit(spec()).job
    world.reactions.spot_warning(job.instance_ids[0])
    assert world.publisher.events == []
    assert world.store.stream.unread >= 4

    # When it comes back
    done = world.store.stream.read()

    # Then everything the record says happened is on the bus, in order, each once
    assert done.failed_at is None
    assert _published(world, job.job_id) == _history(world, job.job_id)
    assert done.events == len(_history(world, job.job_id))


# ---- the outbox on its own: a batch in stream order ---------------------------------------------------


def _writes_of_two_jobs(world: World) -> list[StreamedWrite]:
    world.store.stream.reads_on_write = False
    world.submit(spec(name="first"), message_id="m-1")
    world.submit(spec(name="second"), message_id="m-2")
    return list(world.store.stream.records)


def test_a_batch_stops_at_the_first_record_it_could_not_publish_and_names_it(world: World) -> None:
    records = _writes_of_two_jobs(world)
    down = DownPublisher()
    outbox = Outbox(down)
    outbox.publish(records[:1])  # the first record goes out
    down.down = 1  # then EventBridge refuses one PutEvents

    done = outbox.publish(records[1:])

    assert done.failed_at == records[1].position  # Lambda starts the batch again from this record
    assert down.refused  # and nothing after it went out before it
    assert [e.job_id for e in down.events] == [records[0].after.job_id]


def test_an_unreadable_record_is_skipped_and_counted_and_the_batch_goes_on(world: World) -> None:
    records = _writes_of_two_jobs(world)
    publisher = RecordingPublisher()
    unreadable = UnreadableWrite(records[0].position, "JOB#j-0000000000000000", "state: 'PAUSED' is not a state")

    done = Outbox(publisher).publish([unreadable, None, *records[1:]])

    assert (done.unreadable, done.failed_at) == (1, None)
    assert done.events == len(publisher.events) > 0
    assert {e.job_id for e in publisher.events} == {r.after.job_id for r in records[1:]}


def test_a_write_that_changes_no_state_publishes_nothing(world: World) -> None:
    job = world.submit(spec()).job
    before = len(world.publisher.events)
    stored = world.store.get(job.job_id)

    world.store.save(stored.model_copy(update={"status_detail": "a detail, no transition"}))

    assert len(world.publisher.events) == before
    assert world.store.get(job.job_id).state is JobState.RUNNING
