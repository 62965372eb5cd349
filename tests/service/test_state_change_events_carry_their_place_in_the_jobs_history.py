"""Each `GPU Job State Change` names its transition's place in the job's history (issue 19, item 8's
event id): `sequence` from 1 and `event_id` `<job_id>:<sequence>`. A consumer that may see one
transition twice (the stream read again after a failed batch) de-duplicates on the id and orders a
job's events by the sequence, which goes on counting past the transitions the record lets go."""

from __future__ import annotations

import json

from gpujobs.adapters.eventbus import state_change_detail
from gpujobs.domain.job import MAX_HISTORY_KEPT
from tests.service.conftest import World, spec


def _sequences(world: World, job_id: str) -> list[int]:
    return [e.sequence for e in world.publisher.events if e.job_id == job_id]


def test_a_jobs_events_are_numbered_by_their_transitions_in_order(world: World) -> None:
    job = world.submit(spec()).job
    world.reactions.spot_warning(job.instance_ids[0])
    stored = world.store.get(job.job_id)

    sequences = _sequences(world, job.job_id)
    assert sequences == list(range(1, stored.history_count + 1))
    published = [e for e in world.publisher.events if e.job_id == job.job_id]
    assert [(e.source, e.target, e.reason) for e in published] == [
        (h.source, h.target, h.reason.value) for h in stored.history
    ]
    detail = state_change_detail(published[-1])
    assert detail["event_id"] == f"{job.job_id}:{stored.history_count}"
    assert detail["sequence"] == stored.history_count
    assert json.loads(json.dumps(detail, default=str))["event_id"] == detail["event_id"]


def test_a_transition_published_again_carries_the_same_id(world: World) -> None:
    job = world.store.get(world.submit(spec()).job.job_id)
    first = [state_change_detail(e)["event_id"] for e in world.publisher.events if e.job_id == job.job_id]

    world.store.stream.replay(since=0)  # the stream read again from its start, as after a failed batch
    world.store.stream.read()

    again = [state_change_detail(e)["event_id"] for e in world.publisher.events if e.job_id == job.job_id]
    assert again == first + first
    assert len(set(again)) == len(first)


def test_the_sequence_counts_on_past_the_transitions_the_record_lets_go(world: World) -> None:
    job = world.submit(spec()).job
    for _ in range(MAX_HISTORY_KEPT):  # each reclaim adds three transitions: interrupted, launching, running
        current = world.store.get(job.job_id)
        world.reactions.spot_warning(current.instance_ids[0])
    stored = world.store.get(job.job_id)
    assert stored.history_dropped > 0

    sequences = _sequences(world, job.job_id)
    assert sequences == list(range(1, stored.history_count + 1))
