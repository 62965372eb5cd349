"""A cost cap errs high: a job on a type missing from the price table is stopped in time, and a
cap that could not be enforced is refused at submit.

Stories: a job capped at $3 runs on g6.xlarge, which the price table lacks; it counts at the
highest g6.* price known ($2/h), so it is asked to stop after 90 minutes rather than never. A
submission whose `max_cost_usd` covers a type without a price is recorded REJECTED, naming the field.
"""

from __future__ import annotations

import dataclasses

from gpujobs.domain.states import JobState, Reason
from gpujobs_fakes.memory import TablePrices
from tests.service.conftest import World, spec


def test_a_job_on_a_type_missing_from_the_price_table_is_stopped_at_its_familys_highest_price(world: World) -> None:
    world.rewire(
        prices=TablePrices(
            {("g5.xlarge", "on-demand"): 1.0, ("g6.2xlarge", "on-demand"): 2.0, ("p4d.24xlarge", "on-demand"): 21.96}
        )
    )
    job = world.submit(spec(instance_types=["g6.xlarge"], capacity="on-demand", max_cost_usd=3.0)).job
    assert job.state is JobState.RUNNING

    world.clock.advance(minutes=89)
    world.reconciler.run()
    assert world.store.get(job.job_id).stop_request is None
    world.clock.advance(minutes=2)
    world.reconciler.run()

    request = world.store.get(job.job_id).stop_request
    assert request is not None
    assert request.reason is Reason.MAX_COST


def test_a_cost_cap_over_a_type_without_a_known_price_is_rejected_at_submit(world: World) -> None:
    world.rewire(config=dataclasses.replace(world.service.config, priced_instance_types=frozenset({"g5.xlarge"})))

    rejected = world.submit(spec(instance_types=["g5.xlarge", "g6.xlarge"], max_cost_usd=50.0), message_id="m-1").job
    uncapped = world.submit(spec(instance_types=["g5.xlarge", "g6.xlarge"]), message_id="m-2").job

    assert rejected.state is JobState.REJECTED
    assert any(p.startswith("max_cost_usd: ") and "g6.xlarge" in p for p in rejected.problems)
    assert world.compute.calls[0].job_id == uncapped.job_id
    assert uncapped.state is JobState.RUNNING
