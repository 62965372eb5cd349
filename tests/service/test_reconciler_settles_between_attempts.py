"""An attempt left unfinished while its job waits for the next one is still judged by the reconciler."""

from __future__ import annotations

from gpujobs.domain.budget import BudgetMode, BudgetPolicy
from gpujobs.domain.states import JobState, Reason
from tests.service.conftest import World, spec


def test_an_attempt_interrupted_just_before_a_hold_ends_and_loses_its_alarm_while_the_job_waits(world: World) -> None:
    # given a running GPU job with its idle alarm, and a budget hold that arrives before its spot warning
    job = world.submit(spec()).job
    (old,) = world.store.get(job.job_id).instance_ids
    assert old in world.alarms.alarms
    world.budgets.set_policy(BudgetPolicy(scope="default", mode=BudgetMode.HOLD, reason="ACTUAL > budget"))

    # when the warning sends the job back to the queue, and EC2 takes the instance without a word
    world.reactions.spot_warning(old)
    assert world.store.get(job.job_id).state is JobState.QUEUED
    world.compute.terminate([old])
    world.reconciler.run()
    world.clock.advance(minutes=2)
    world.reconciler.run()

    # then the reclaimed attempt is over and its alarm gone, while the job waits out the hold
    waiting = world.store.get(job.job_id)
    attempt = waiting.attempt(1)
    assert attempt is not None
    assert attempt.is_over
    assert attempt.end_reason == "interrupted"
    assert world.alarms.alarms == {}
    assert waiting.state is JobState.QUEUED
    assert waiting.history[-1].reason is Reason.BUDGET_HOLD
    assert world.compute.live() == []
