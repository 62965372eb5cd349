"""Stories of what happens when nobody is watching: spot warnings, instance fate, idle GPUs.

Each story plays the events in the order (or disorder) EventBridge may deliver them and asserts
what a user would look at: the job's state, the instances alive, the checkpoint it resumes from.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpujobs.domain.budget import BudgetMode, BudgetPolicy
from gpujobs.domain.effects import Outcome
from gpujobs.domain.fate import PREEMPTED_EXIT_CODE
from gpujobs.domain.job import Job, Market
from gpujobs.domain.reports import CheckpointReport, ExitReport, HeartbeatReport
from gpujobs.domain.states import JobState, Reason
from tests.service.conftest import World, spec


def running(world: World, **overrides: object) -> Job:
    job = world.submit(spec(**overrides)).job
    assert job.state is JobState.RUNNING
    return job


def attempt_instances(world: World, job_id: str, number: int) -> tuple[str, ...]:
    attempt = world.store.get(job_id).attempt(number)
    assert attempt is not None
    return attempt.instance_ids


def reclaim(world: World, instance_ids: tuple[str, ...]) -> None:
    """EC2 takes the instances away and EventBridge reports it."""
    world.compute.terminate(instance_ids)
    for iid in instance_ids:
        world.reactions.instance_state(iid, "terminated")


# ---- spot interruption -------------------------------------------------------------------------


def test_a_spot_warning_checkpoints_and_resumes_on_a_replacement_in_another_pool(world: World) -> None:
    job = running(world)
    (old,) = attempt_instances(world, job.job_id, 1)
    world.reactions.report(HeartbeatReport(job_id=job.job_id, attempt=1, step=40))

    # when the two-minute warning arrives
    world.clock.advance(seconds=5)
    reaction = world.reactions.spot_warning(old)

    # then the container is told to checkpoint and the replacement boots at once elsewhere
    assert reaction.outcome is Outcome.INTERRUPTED
    assert world.signaller.signals == [((old,), f"gpujobs-{job.job_id}-a1")]
    job = world.store.get(job.job_id)
    assert job.state is JobState.RUNNING
    assert job.interruptions == 1
    replacement = job.current_attempt
    assert replacement is not None
    assert replacement.number == 2
    assert (replacement.instance_type, replacement.zone, replacement.market) == ("g5.xlarge", "us-east-1b", Market.SPOT)
    assert [t[1:] for t in world.transitions(job.job_id)][-3:] == [
        ("INTERRUPTED", "spot-interruption"),
        ("LAUNCHING", "replacement-launching"),
        ("RUNNING", "instances-launched"),
    ]

    # and the old attempt saves step 42, exits "preempted" and is reclaimed
    world.reactions.report(CheckpointReport(job_id=job.job_id, attempt=1, step=42, uri="s3://b/ckpt/step-00000042"))
    world.reactions.report(ExitReport(job_id=job.job_id, attempt=1, instance_id=old, exit_code=PREEMPTED_EXIT_CODE))
    reclaim(world, (old,))
    job = world.store.get(job.job_id)
    assert job.checkpoint_step == 42
    old_attempt = job.attempt(1)
    assert old_attempt is not None
    assert old_attempt.end_reason == "interrupted"

    # the replacement resumes from step 42: its first heartbeat reports the cost of the interruption
    world.clock.advance(seconds=70)
    beat = world.reactions.report(HeartbeatReport(job_id=job.job_id, attempt=2, step=43))
    assert beat.metrics == {"SecondsWarningToResumed": 70.0, "StepsLostToInterruption": 0.0}

    # and finishes
    (new,) = attempt_instances(world, job.job_id, 2)
    world.reactions.report(ExitReport(job_id=job.job_id, attempt=2, instance_id=new, exit_code=0))
    assert world.store.get(job.job_id).state is JobState.SUCCEEDED
    assert job.interruptions == 1


def test_the_same_warning_twice_or_a_warning_after_the_replacement_started_changes_nothing(world: World) -> None:
    job = running(world)
    (old,) = attempt_instances(world, job.job_id, 1)
    world.reactions.spot_warning(old)
    snapshot = world.store.get(job.job_id)

    again = world.reactions.spot_warning(old)

    assert again.ignored
    assert world.store.get(job.job_id).version == snapshot.version
    assert len(world.compute.calls) == 2
    assert len(world.signaller.signals) == 1


def test_a_warning_for_an_instance_that_is_not_ours_is_ignored(world: World) -> None:
    reaction = world.reactions.spot_warning("i-0123456789abcdef0")
    assert reaction.ignored
    assert reaction.outcome is Outcome.NOT_OURS


def test_a_warning_for_any_node_interrupts_the_whole_gang(world: World) -> None:
    job = running(world, nodes=3)
    nodes = attempt_instances(world, job.job_id, 1)

    world.reactions.spot_warning(nodes[2])

    assert world.signaller.signals == [(nodes, f"gpujobs-{job.job_id}-a1")]
    replacement = world.store.get(job.job_id).current_attempt
    assert replacement is not None
    assert len(replacement.instance_ids) == 3


def test_spot_first_goes_on_demand_while_spot_is_volatile_and_never_for_max_interruptions(world: World) -> None:
    """Three reclaims within six hours (`domain.volatility`): the next replacement goes to on-demand;
    two do not, and `max_interruptions` does not count for a spot-first job (issue 21)."""
    job = running(world, max_interruptions=1)
    world.reactions.spot_warning(attempt_instances(world, job.job_id, 1)[0])
    world.reactions.spot_warning(attempt_instances(world, job.job_id, 2)[0])

    third = world.store.get(job.job_id).current_attempt
    assert third is not None
    assert third.market is Market.SPOT  # past its max_interruptions of 1, and still on spot

    world.reactions.spot_warning(attempt_instances(world, job.job_id, 3)[0])
    fourth = world.store.get(job.job_id)
    assert fourth.state is JobState.RUNNING
    assert fourth.current_attempt is not None
    assert fourth.current_attempt.market is Market.ON_DEMAND
    assert fourth.interruptions == 3


def test_a_spot_only_job_interrupted_past_its_limit_fails(world: World) -> None:
    job = running(world, capacity="spot", max_interruptions=0)

    world.reactions.spot_warning(attempt_instances(world, job.job_id, 1)[0])

    failed = world.store.get(job.job_id)
    assert failed.state is JobState.FAILED
    assert failed.history[-1].reason is Reason.INTERRUPTED_TOO_OFTEN


def test_a_preempted_exit_without_any_warning_event_still_leads_to_a_replacement(world: World) -> None:
    job = running(world)
    (old,) = attempt_instances(world, job.job_id, 1)

    world.reactions.report(ExitReport(job_id=job.job_id, attempt=1, instance_id=old, exit_code=PREEMPTED_EXIT_CODE))

    job = world.store.get(job.job_id)
    assert job.interruptions == 1
    assert job.current_attempt is not None
    assert job.current_attempt.number == 2
    assert job.state is JobState.RUNNING


def test_a_rebalance_recommendation_checkpoints_without_relaunching(world: World) -> None:
    job = running(world)
    (iid,) = attempt_instances(world, job.job_id, 1)

    world.reactions.rebalance(iid)
    world.reactions.rebalance(iid)  # moments later: no second signal

    assert len(world.signaller.signals) == 1
    assert len(world.compute.calls) == 1
    assert world.store.get(job.job_id).state is JobState.RUNNING


# ---- reports from the container ------------------------------------------------------------------


def test_the_newest_checkpoint_only_moves_forward(world: World) -> None:
    job = running(world)
    world.reactions.report(CheckpointReport(job_id=job.job_id, attempt=1, step=200, uri="s3://b/step-200"))

    older = world.reactions.report(CheckpointReport(job_id=job.job_id, attempt=1, step=100, uri="s3://b/step-100"))
    duplicate = world.reactions.report(CheckpointReport(job_id=job.job_id, attempt=1, step=200, uri="s3://b/step-200"))

    assert older.ignored
    assert duplicate.ignored
    stored = world.store.get(job.job_id)
    assert (stored.checkpoint_step, stored.checkpoint_uri) == (200, "s3://b/step-200")


def test_a_report_for_an_unknown_job_is_ignored(world: World) -> None:
    assert world.reactions.report(
        CheckpointReport(job_id="j-0000000000000000", attempt=1, step=1, uri="s3://x")
    ).ignored
    assert world.reactions.report(ExitReport(job_id="j-0000000000000000", attempt=1, exit_code=0, node_rank=0)).ignored


# ---- instance fate -----------------------------------------------------------------------------------


def test_every_node_exiting_0_succeeds_the_job_in_whichever_order_events_arrive(world: World) -> None:
    job = running(world, nodes=2)
    nodes = attempt_instances(world, job.job_id, 1)

    reclaim(world, nodes)  # the state changes overtake the exit reports
    assert world.store.get(job.job_id).state is JobState.RUNNING
    world.reactions.report(ExitReport(job_id=job.job_id, attempt=1, node_rank=0, exit_code=0))
    world.reactions.report(ExitReport(job_id=job.job_id, attempt=1, node_rank=1, exit_code=0))
    world.reactions.report(ExitReport(job_id=job.job_id, attempt=1, node_rank=1, exit_code=0))  # twice

    done = world.store.get(job.job_id)
    assert done.state is JobState.SUCCEEDED
    assert world.alarms.alarms == {}


def test_a_crash_on_one_node_terminates_the_gang_and_retries_until_max_attempts(world: World) -> None:
    job = running(world, nodes=2, max_attempts=2)
    first = attempt_instances(world, job.job_id, 1)

    world.reactions.report(ExitReport(job_id=job.job_id, attempt=1, instance_id=first[1], exit_code=1))
    assert first[0] in world.compute.terminated  # the surviving node cannot make progress alone
    reclaim(world, first)
    world.clock.advance(seconds=91)
    world.reactions.settle(job.job_id)

    retried = world.store.get(job.job_id)
    assert retried.state is JobState.RUNNING
    assert retried.crashes == 1
    assert retried.current_attempt is not None
    assert retried.current_attempt.number == 2

    second = attempt_instances(world, job.job_id, 2)
    world.reactions.report(ExitReport(job_id=job.job_id, attempt=2, node_rank=0, exit_code=3))
    world.reactions.report(ExitReport(job_id=job.job_id, attempt=2, node_rank=1, exit_code=3))
    reclaim(world, second)

    failed = world.store.get(job.job_id)
    assert failed.state is JobState.FAILED
    assert failed.history[-1].reason is Reason.CRASHED_TOO_OFTEN
    assert len(world.compute.calls) == 2


def test_instances_that_vanish_without_a_report_are_replaced_after_a_grace(world: World) -> None:
    job = running(world, capacity="on-demand")
    (iid,) = attempt_instances(world, job.job_id, 1)
    world.reactions.report(HeartbeatReport(job_id=job.job_id, attempt=1, step=5))  # booted and training

    reclaim(world, (iid,))
    assert world.store.get(job.job_id).state is JobState.RUNNING  # a report may still be in flight

    world.clock.advance(seconds=91)
    world.reactions.settle(job.job_id)

    relaunched = world.store.get(job.job_id)
    assert relaunched.state is JobState.RUNNING
    assert relaunched.current_attempt is not None
    assert relaunched.current_attempt.number == 2
    assert [e.reason for e in relaunched.history if e.reason == Reason.INSTANCE_LOST] == [Reason.INSTANCE_LOST]


def test_spot_instances_that_vanish_without_a_report_count_as_an_interruption(world: World) -> None:
    job = running(world)
    world.reactions.report(HeartbeatReport(job_id=job.job_id, attempt=1, step=5))  # booted and training
    reclaim(world, attempt_instances(world, job.job_id, 1))
    world.clock.advance(seconds=91)

    world.reactions.settle(job.job_id)

    replaced = world.store.get(job.job_id)
    assert replaced.interruptions == 1
    assert replaced.crashes == 0
    assert replaced.current_attempt is not None
    assert replaced.current_attempt.zone == "us-east-1b"


def test_a_state_change_for_a_finished_job_changes_nothing(world: World) -> None:
    job = running(world)
    (iid,) = attempt_instances(world, job.job_id, 1)
    world.reactions.report(ExitReport(job_id=job.job_id, attempt=1, instance_id=iid, exit_code=0))
    done = world.store.get(job.job_id)

    reclaim(world, (iid,))
    world.reactions.instance_state(iid, "terminated")

    assert world.store.get(job.job_id).version == done.version


# ---- idle GPUs -----------------------------------------------------------------------------------------


def test_each_gpu_instance_gets_an_idle_alarm_with_the_spec_thresholds(world: World) -> None:
    job = running(world, nodes=2, idle={"gpu_util_below_percent": 3, "for_minutes": 20})
    nodes = attempt_instances(world, job.job_id, 1)

    assert world.alarms.alarms == dict.fromkeys(nodes, (job.job_id, 3, 20))


def test_an_idle_spot_job_is_checkpointed_then_terminated_then_stopped(world: World) -> None:
    job = running(world)
    (iid,) = attempt_instances(world, job.job_id, 1)
    world.reactions.report(CheckpointReport(job_id=job.job_id, attempt=1, step=10, uri="s3://b/step-10"))

    asked = world.reactions.idle_alarm(iid)

    assert asked.outcome is Outcome.STOP_REQUESTED
    assert asked.detail.startswith("stop requested (idle)")
    assert world.signaller.signals[-1] == ((iid,), f"gpujobs-{job.job_id}-a1")
    assert world.compute.terminated == []  # nothing goes before the checkpoint is safe

    world.reactions.report(CheckpointReport(job_id=job.job_id, attempt=1, step=11, uri="s3://b/step-11"))
    assert world.compute.terminated == [iid]
    reclaim(world, (iid,))

    stopped = world.store.get(job.job_id)
    assert stopped.state is JobState.STOPPED
    assert stopped.history[-1].reason is Reason.IDLE
    assert stopped.checkpoint_step == 11


def test_an_idle_on_demand_job_is_stopped_not_terminated(world: World) -> None:
    job = running(world, capacity="on-demand")
    (iid,) = attempt_instances(world, job.job_id, 1)

    world.reactions.idle_alarm(iid)
    world.reactions.report(CheckpointReport(job_id=job.job_id, attempt=1, step=5, uri="s3://b/step-5"))
    world.reactions.instance_state(iid, "stopped")

    assert world.compute.stopped == [iid]
    assert world.compute.terminated == []
    assert world.store.get(job.job_id).state is JobState.STOPPED


def test_an_idle_stop_whose_checkpoint_never_comes_stops_at_the_deadline(world: World) -> None:
    job = running(world)
    (iid,) = attempt_instances(world, job.job_id, 1)
    world.reactions.idle_alarm(iid)

    world.clock.advance(minutes=9)
    world.reactions.settle(job.job_id)
    assert world.compute.terminated == []
    world.clock.advance(minutes=2)
    world.reactions.settle(job.job_id)

    assert world.compute.terminated == [iid]


def test_idle_action_ignore_only_records_it(world: World) -> None:
    job = running(world, idle={"action": "ignore"})
    (iid,) = attempt_instances(world, job.job_id, 1)

    world.reactions.idle_alarm(iid)

    kept = world.store.get(job.job_id)
    assert kept.state is JobState.RUNNING
    assert kept.stop_request is None
    assert "idle action: ignore" in kept.status_detail
    assert world.signaller.signals == []


def test_an_alarm_for_an_attempt_that_is_over_is_deleted_and_ignored(world: World) -> None:
    job = running(world)
    (old,) = attempt_instances(world, job.job_id, 1)
    world.reactions.spot_warning(old)

    reaction = world.reactions.idle_alarm(old)

    assert reaction.ignored
    assert old not in world.alarms.alarms


# ---- budgets -----------------------------------------------------------------------------------------------


def test_a_held_budget_keeps_new_jobs_queued_with_the_reason(world: World) -> None:
    world.budgets.set_policy(BudgetPolicy(scope="vision", mode=BudgetMode.HOLD, reason="ACTUAL $120 > $100"))

    job = world.submit(spec(team="vision")).job

    assert job.state is JobState.QUEUED
    assert job.hold_reason is not None
    assert "ACTUAL $120 > $100" in job.hold_reason
    assert world.compute.calls == []


def test_a_forecasted_breach_makes_launches_spot_only(world: World) -> None:
    world.budgets.set_policy(BudgetPolicy(scope="all", mode=BudgetMode.SPOT_ONLY, reason="forecast"))
    world.compute.refuse = {
        (t, z, "spot"): "InsufficientInstanceCapacity"
        for t in ("g5.xlarge", "g6.xlarge")
        for z in ("us-east-1a", "us-east-1b")
    }

    job = world.submit(spec()).job

    assert job.state is JobState.QUEUED
    assert all(c.market is Market.SPOT for c in world.compute.calls)


@pytest.mark.parametrize("state", ["pending", "running"])
def test_states_that_are_not_an_end_change_nothing(world: World, state: str) -> None:
    job = running(world)
    (iid,) = attempt_instances(world, job.job_id, 1)
    assert world.reactions.instance_state(iid, state).ignored
    assert world.store.get(job.job_id).current_attempt == job.current_attempt


def test_reports_may_come_from_both_the_trainer_and_the_bootstrap(world: World) -> None:
    job = running(world)
    (iid,) = attempt_instances(world, job.job_id, 1)

    world.reactions.report(ExitReport(job_id=job.job_id, attempt=1, node_rank=0, exit_code=0))
    second = world.reactions.report(ExitReport(job_id=job.job_id, attempt=1, instance_id=iid, exit_code=0))

    assert second.ignored
    assert world.store.get(job.job_id).state is JobState.SUCCEEDED


def test_warning_then_late_success_of_the_reclaimed_attempt_does_not_end_the_replacement(world: World) -> None:
    job = running(world)
    (old,) = attempt_instances(world, job.job_id, 1)
    world.reactions.spot_warning(old)

    world.reactions.report(ExitReport(job_id=job.job_id, attempt=1, instance_id=old, exit_code=0))

    job = world.store.get(job.job_id)
    assert job.state is JobState.RUNNING
    assert job.current_attempt is not None
    assert job.current_attempt.number == 2
    assert world.clock.now() - job.updated_at < timedelta(seconds=1)


# ---- budget alerts ----------------------------------------------------------------------------------

ACTUAL_TEXT = (
    "AWS Budget Notification November 29, 2026\nAWS Account 123456789012\n\nDear AWS Customer,\n\n"
    "You requested that we alert you when the ACTUAL Cost associated with your gpujobs-gpujobs-team-vision "
    "budget is greater than $100.00 for the current month. The ACTUAL Cost associated with this budget is "
    "$120.59.\n\nBudget Name: gpujobs-gpujobs-team-vision\nBudget Type: Cost\nBudgeted Amount: $100.00\n"
    "Alert Type: ACTUAL\nAlert Threshold: > $100.00\nACTUAL Amount: $120.59\n"
)


def test_an_actual_breach_holds_the_team_and_stops_its_running_jobs_after_a_checkpoint(world: World) -> None:

    vision = world.submit(spec(team="vision"), message_id="m-v").job
    other = world.submit(spec(team="speech"), message_id="m-s").job
    book = world.budget_reactions

    reaction = book.budget_notification(
        subject="AWS Budgets: gpujobs-gpujobs-team-vision has exceeded", message=ACTUAL_TEXT
    )

    assert "1 running job(s)" in reaction.detail
    assert world.store.get(vision.job_id).stop_request is not None
    assert world.store.get(other.job_id).stop_request is None
    assert world.compute.terminated == []  # the checkpoint comes first
    assert world.publisher.notices[-1][0] == "GPU Budget Hold"
    held = world.submit(spec(team="vision"), message_id="m-v2").job
    assert held.state is JobState.QUEUED
    assert world.submit(spec(team="speech"), message_id="m-s2").job.state is JobState.RUNNING


def test_budget_text_that_cannot_be_parsed_is_counted_never_a_breach(world: World) -> None:

    running(world)
    reaction = world.budget_reactions.budget_notification(subject="hello", message="Your invoice is ready")

    assert reaction.ignored
    assert reaction.metrics == {"BudgetNotificationsUnparsed": 1}
    assert world.budgets.held_scopes() == []


def test_a_milder_alert_keeps_a_hold_within_its_month_and_replaces_it_after(world: World) -> None:

    book = world.budget_reactions
    book.apply("vision", BudgetMode.HOLD, "ACTUAL $120 > $100")

    book.apply("vision", BudgetMode.SPOT_ONLY, "FORECASTED $130 > $100")
    assert world.budgets.policy_for("vision").mode is BudgetMode.HOLD
    world.clock.advance(days=3)  # 2026-12-02: November's hold has lapsed
    book.apply("vision", BudgetMode.SPOT_ONLY, "FORECASTED $90 > $80")

    assert world.budgets.policy_for("vision") == BudgetPolicy(
        scope="vision",
        mode=BudgetMode.SPOT_ONLY,
        reason="FORECASTED $90 > $80",
        period="2026-12",
        since=world.clock.now(),
    )


def test_the_replacement_is_told_to_wait_for_the_reclaimed_attempt(world: World) -> None:
    import json

    job = running(world)
    (old,) = attempt_instances(world, job.job_id, 1)

    world.reactions.spot_warning(old)

    first, replacement = (json.loads(c.user_data) for c in world.compute.calls)
    assert first["wait_for_attempt"] is None
    assert replacement["attempt"] == 2
    assert replacement["wait_for_attempt"] == 1


def test_a_checkpoint_report_after_the_job_ended_changes_its_state_not_at_all(world: World) -> None:
    job = running(world)
    (iid,) = attempt_instances(world, job.job_id, 1)
    world.reactions.report(ExitReport(job_id=job.job_id, attempt=1, instance_id=iid, exit_code=0))

    world.reactions.report(CheckpointReport(job_id=job.job_id, attempt=1, step=600, uri="s3://b/step-600"))

    done = world.store.get(job.job_id)
    assert done.state is JobState.SUCCEEDED
    assert done.checkpoint_step == 600  # where a later resubmission would resume from
    assert len(world.compute.calls) == 1  # nothing relaunched
