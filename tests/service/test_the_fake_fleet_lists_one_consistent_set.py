"""The fake EC2's listings are snapshots that threads racing launches cannot break.

The ledger's race test lists instances on one thread while others launch. ``list(d.items())`` is
not atomic: building the list allocates, a garbage collection may run, its callbacks (hypothesis
installs one) run Python, and another thread may add an instance mid-copy: "dictionary changed
size during iteration" turned a CI run red. Here a GC callback yields on every collection, which
makes that interleaving frequent rather than rare (the fake without its lock failed 2 runs of 5 of
this test; with it, none can).
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator

import pytest

from gpujobs.domain.job import Market
from gpujobs.service.ports import LaunchRequest, Subnet
from gpujobs_fakes.memory import FakeCompute


@pytest.fixture
def collections_yield() -> Iterator[None]:
    def yield_the_gil(_phase: str, _info: dict[str, int]) -> None:
        time.sleep(0.0002)

    gc.callbacks.append(yield_the_gil)
    try:
        yield
    finally:
        gc.callbacks.remove(yield_the_gil)


def _request(n: int) -> LaunchRequest:
    return LaunchRequest(
        job_id=f"j-{n:016x}",
        attempt=1,
        team="t",
        name="n",
        count=1,
        instance_type="g5.xlarge",
        subnet=Subnet("subnet-a", "us-east-1a"),
        market=Market.SPOT,
        client_token=f"token-{n}",
        user_data="",
        security_group_id=f"sg-{n:016x}",
    )


@pytest.mark.usefixtures("collections_yield")
def test_listings_taken_while_another_thread_launches_never_fail_and_never_shrink() -> None:
    compute = FakeCompute()
    for n in range(200):
        compute.run_instances(_request(n))

    def launch() -> None:
        for n in range(200, 3000):
            compute.run_instances(_request(n))
            compute.job_security_group(f"j-{n:016x}")

    launcher = threading.Thread(target=launch)
    launcher.start()
    seen = [200]
    while launcher.is_alive():
        listed = compute.list_instances()
        assert len(listed) >= seen[-1]  # instances are only ever added here
        seen.append(len(listed))
        assert len(compute.job_security_groups()) <= 3000  # listing them races the launches too
    launcher.join()
    assert len(compute.list_instances()) == 3000
    assert len(set(seen)) > 2  # the listings really raced the launches
