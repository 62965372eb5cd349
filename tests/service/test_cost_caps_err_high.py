"""A cost cap errs high: a job on a type missing from the price table is stopped in time, and a
cap that could not be enforced is refused at submit, and a cap counts the stack region's own price.

Stories: a job capped at $3 runs on g6.xlarge, which the price table lacks; it counts at the
highest g6.* price known ($2/h), so it is asked to stop after 90 minutes rather than never. A
submission whose `max_cost_usd` covers a type without a price is recorded REJECTED, naming the field.
"""

from __future__ import annotations

import dataclasses

from gpujobs.adapters.price_list import PriceListOnDemand
from gpujobs.adapters.prices import Ec2Prices
from gpujobs.domain.states import JobState
from gpujobs_fakes.memory import TablePrices
from tests.service.conftest import World, spec, stopped_for_cost_after
from tests.unit.test_price_list import FakePricing, NoSpotPrices, product


def test_a_job_on_a_type_missing_from_the_price_table_is_stopped_at_its_familys_highest_price(world: World) -> None:
    world.rewire(
        prices=TablePrices(
            {("g5.xlarge", "on-demand"): 1.0, ("g6.2xlarge", "on-demand"): 2.0, ("p4d.24xlarge", "on-demand"): 21.96}
        )
    )
    job = world.submit(spec(instance_types=["g6.xlarge"], capacity="on-demand", max_cost_usd=3.0)).job
    assert job.state is JobState.RUNNING

    assert stopped_for_cost_after(world, job.job_id, minutes=90)


def test_a_cost_cap_over_a_type_without_a_known_price_is_rejected_at_submit(world: World) -> None:
    world.rewire(config=dataclasses.replace(world.service.config, priced_instance_types=frozenset({"g5.xlarge"})))

    rejected = world.submit(spec(instance_types=["g5.xlarge", "g6.xlarge"], max_cost_usd=50.0), message_id="m-1").job
    uncapped = world.submit(spec(instance_types=["g5.xlarge", "g6.xlarge"]), message_id="m-2").job

    assert rejected.state is JobState.REJECTED
    assert any(p.startswith("max_cost_usd: ") and "g6.xlarge" in p for p in rejected.problems)
    assert world.compute.calls[0].job_id == uncapped.job_id
    assert uncapped.state is JobState.RUNNING


def test_a_cap_is_reached_at_the_price_list_price_of_the_stacks_region_not_the_us_east_1_table(world: World) -> None:
    """eu-west-1 lists g5.xlarge at $1.50/h (the packaged us-east-1 price is $1.006): a $3 cap is
    reached after two hours, not three."""
    pricing = FakePricing({"g5.xlarge": [product("g5.xlarge", "1.5")]})
    on_demand = PriceListOnDemand(client=pricing, region="eu-west-1", clock=world.clock)
    world.rewire(prices=Ec2Prices(client=NoSpotPrices(), clock=world.clock, on_demand=on_demand))  # type: ignore[arg-type]
    job = world.submit(spec(instance_types=["g5.xlarge"], capacity="on-demand", max_cost_usd=3.0)).job

    assert stopped_for_cost_after(world, job.job_id, minutes=120)
    assert len(pricing.requests) == 1  # asked once, kept for the day
