"""What a job has cost so far, and how much of the GPU time it paid for did lasting work.

Computed from the job record alone (instance-seconds per pool, `domain.cost`) and the packaged
catalog of instance types (`adapters.catalog`): no AWS call, so `status` and `list` stay one table
read. The record holds no prices, so the figure is exact only as far as the list price is: an
on-demand attempt of a priced type is priced at its us-east-1 list price. A spot attempt is
priced at the on-demand price too (an upper bound; the spot price actually paid is not recorded),
and a type missing from the price table at the highest known price of its family, scaled up by
how much more it holds (`price_erring_high` over the catalog's sizes); either makes the figure an
estimate, shown with `~`. The cost caps err high too.

GPU-hours are shown for ended jobs only: paid counts every GPU of every instance held; useful
counts the time whose work was kept (to each attempt's last committed checkpoint, or to its end
for the attempt that completed the job), so the gap is what interruptions and crashes cost in work
redone, plus time after the last checkpoint of an attempt that failed or was stopped.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime

from gpujobs.adapters.catalog import gpu_counts, instance_sizes, on_demand_prices
from gpujobs.domain.cost import BilledPool, UnpricedError, billed_pools, cost_of, gpu_hours_of, price_erring_high
from gpujobs.domain.job import Job, Market


@dataclass(frozen=True)
class Spend:
    cost_usd: float
    estimated: bool
    """True when any pool was spot or of a type without a list price: the cost is an upper estimate."""
    paid_gpu_hours: float | None = None
    """Set for ended jobs only, like `useful_gpu_hours`."""
    useful_gpu_hours: float | None = None

    def as_json(self) -> dict[str, object]:
        return asdict(self)


def spend_of(job: Job, now: datetime) -> Spend:
    known = on_demand_prices()
    prices: dict[BilledPool, float | None] = {}
    estimated = False
    for pool in billed_pools(job):
        try:
            prices[pool] = price_erring_high(pool.instance_type, known, sizes=instance_sizes())
        except UnpricedError:
            prices[pool] = None
        estimated = estimated or pool.market is Market.SPOT or pool.instance_type not in known
    cost = cost_of(job, now, prices)
    if not job.state.is_terminal:
        return Spend(cost_usd=cost, estimated=estimated)
    default_gpus = job.spec.gpus_per_node if job.spec is not None else 0
    hours = gpu_hours_of(job, now, gpu_counts(), default_gpus=default_gpus)
    return Spend(cost_usd=cost, estimated=estimated, paid_gpu_hours=hours.paid, useful_gpu_hours=hours.useful)


def dollars(spend: Spend) -> str:
    """`$1.23`, or `~$1.23` for an estimate."""
    return f"{'~' if spend.estimated else ''}${spend.cost_usd:,.2f}"
