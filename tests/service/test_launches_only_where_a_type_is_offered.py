"""Issue 21: a type a zone does not offer is never tried there (EC2's DescribeInstanceTypeOfferings,
through the offerings port), and a job whose types no zone of the stack offers fails at once with a
reason that names them, instead of walking rungs that answer `Unsupported`."""

from __future__ import annotations

from gpujobs.domain.job import Market
from gpujobs.domain.states import JobState, Reason
from gpujobs_fakes.offerings import FakeOfferings
from tests.service.conftest import World, spec


def test_a_zone_that_does_not_offer_a_type_is_skipped(world: World) -> None:
    offerings = FakeOfferings()
    offerings.offer("g5.xlarge", "us-east-1b")  # g6.xlarge: undescribed, so every zone is tried
    world.rewire(offerings=offerings)
    world.compute.refuse[("g5.xlarge", "us-east-1b", "spot")] = "InsufficientInstanceCapacity"

    job = world.submit(spec()).job

    tried = [(c.instance_type, c.subnet.zone, c.market) for c in world.compute.calls]
    assert ("g5.xlarge", "us-east-1a", Market.SPOT) not in tried
    assert tried[:2] == [("g5.xlarge", "us-east-1b", Market.SPOT), ("g6.xlarge", "us-east-1a", Market.SPOT)]
    running = world.store.get(job.job_id)
    assert running.state is JobState.RUNNING
    assert running.current_attempt is not None
    assert running.current_attempt.instance_type == "g6.xlarge"
    assert offerings.asked == [frozenset({"g5.xlarge", "g6.xlarge"})]


def test_types_offered_in_no_zone_of_the_stack_fail_the_job_with_a_reason_that_names_them(world: World) -> None:
    offerings = FakeOfferings()
    offerings.offer("g5.xlarge")
    offerings.offer("g6.xlarge", "us-west-2a")
    world.rewire(offerings=offerings)

    job = world.submit(spec()).job

    failed = world.store.get(job.job_id)
    assert failed.state is JobState.FAILED
    assert failed.history[-1].reason is Reason.LAUNCH_FAILED
    assert "g5.xlarge, g6.xlarge: not offered in any zone of the stack's subnets (us-east-1a, us-east-1b)" in (
        failed.status_detail
    )
    assert world.compute.calls == []
