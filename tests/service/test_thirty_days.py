"""A month in the life of one job, in simulated time: the record stays bounded and the job keeps going.

Several failures only show after hours or days (a record that grows with every refusal, every
interruption, every heartbeat), which no event-by-event test reaches. This soak runs one spot-first
(spot-only) job for 30 days on the fakes in five-minute ticks: capacity comes and goes pool by pool (with whole
crunches when every pool refuses, each refusal carrying EC2's real ~250-character message), spot
warnings arrive every eight hours or so and reclaim the instance two minutes later, trainers heartbeat
every tick and checkpoint every half hour, and the reconciler runs on every tick.
"""

from __future__ import annotations

import json
import random
from datetime import timedelta

import pytest

from gpujobs.adapters.dynamodb import MAX_ITEM_BYTES
from gpujobs.domain.job import MAX_ATTEMPTS_KEPT, MAX_HISTORY_KEPT, MAX_TRIES_KEPT
from gpujobs.domain.states import JobState
from tests.service.cloud import RECONCILE_EVERY, SimulatedCloud, item_bytes
from tests.service.conftest import spec

DAYS = 30
TICKS_PER_HOUR = int(timedelta(hours=1) / RECONCILE_EVERY)
INSTANCE_TYPES = ["g5.xlarge", "g6.xlarge", "p4d.24xlarge"]
POOLS = [(t, z, m) for t in INSTANCE_TYPES for z in ("us-east-1a", "us-east-1b") for m in ("spot", "on-demand")]
ITEM_BOUND_BYTES = MAX_ITEM_BYTES // 8
"""Far under DynamoDB's 400 KB: a month of churn must not bring a job anywhere near the limit."""


@pytest.mark.slow
def test_one_job_for_thirty_days_of_refusals_and_interruptions_stays_bounded_and_keeps_training() -> None:
    rng = random.Random(30)
    cloud = SimulatedCloud()
    body = spec(
        capacity="spot",
        max_interruptions=100,
        max_runtime_minutes=DAYS * 24 * 60,
        instance_types=INSTANCE_TYPES,
        idle={"action": "ignore"},
    )
    assert cloud.submit(json.dumps(body), "month-long")
    (job,) = cloud.jobs()
    end = cloud.now + timedelta(days=DAYS)
    progress_by_day: list[int] = []
    largest = 0

    tick = 0
    while cloud.now < end:
        if tick % (2 * TICKS_PER_HOUR) == 0:  # capacity changes every two hours; one window in five is a crunch
            crunch = rng.random() < 0.2
            for pool in POOLS:
                cloud.set_capacity(pool, available=not crunch and rng.random() < 0.5)
        for gang, nodes in cloud.gangs().items():
            if gang not in cloud.steps:
                cloud.heartbeat(gang)  # a new trainer's first heartbeat; later ones come with every tick
            if tick % (TICKS_PER_HOUR // 2) == 0:
                cloud.checkpoint(gang)
            spot = cloud.world.compute.instances[nodes[0]].request.market.value == "spot"
            if spot and rng.random() < 1 / (8 * TICKS_PER_HOUR):
                cloud.warn(nodes[0])
        cloud.deliver_all()
        cloud.advance(RECONCILE_EVERY)
        tick += 1
        if tick % TICKS_PER_HOUR == 0:
            assert cloud.violations() == []
            largest = max(largest, item_bytes(cloud.world.store.get(job.job_id)))
        if tick % (24 * TICKS_PER_HOUR) == 0:
            progress_by_day.append(cloud.world.store.get(job.job_id).checkpoint_step or 0)

    cloud.quiet()
    final = cloud.world.store.get(job.job_id)
    assert cloud.violations() == []
    assert cloud.unhealthy() == []
    assert final.state is JobState.RUNNING
    assert 50 <= final.interruptions <= 100
    assert progress_by_day[-1] > progress_by_day[-2] > progress_by_day[0] > 0  # still training on the last day
    assert largest < ITEM_BOUND_BYTES, f"the job's item reached {largest} bytes"
    assert len(final.history) <= MAX_HISTORY_KEPT < final.history_count  # bounded, yet every transition counted
    assert len(final.attempts) <= MAX_ATTEMPTS_KEPT + 1
    assert all(len(attempt.tries) <= MAX_TRIES_KEPT for attempt in final.attempts)
