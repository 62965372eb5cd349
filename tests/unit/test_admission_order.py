"""Who starts, in which order, and what is preempted for whom (`domain.admission`), decided purely
on records, the ledger and the team configuration."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from gpujobs.domain.admission import AGING_STEP, Blocked, admit_at_once, effective_rank, plan
from gpujobs.domain.job import Admission, Attempt, Job, StopRequest
from gpujobs.domain.ledger import Ledger, truth
from gpujobs.domain.spec import validate_spec
from gpujobs.domain.states import JobState, Reason
from gpujobs.domain.teams import TeamDirectory, parse_team_config

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
PRINCIPAL = "AROAEXAMPLEID1234567"


def directory(teams: dict[str, dict[str, Any]], fleet: dict[str, Any] | None = None) -> TeamDirectory:
    document: dict[str, Any] = {"teams": {t: {"principals": [PRINCIPAL], **q} for t, q in teams.items()}}
    if fleet is not None:
        document["fleet"] = fleet
    return parse_team_config(json.dumps(document))


def job(
    n: int, team: str, *, gpus: int = 8, priority: str = "normal", age: timedelta = timedelta(minutes=1), **extra: Any
) -> Job:
    spec = validate_spec(
        {
            "name": f"j{n}",
            "image": "img:1",
            "command": ["python", "train.py"],
            "instance_types": ["p4d.24xlarge"],
            "gpus_per_node": gpus if gpus <= 8 else 8,
            "nodes": max(1, gpus // 8),
            "team": team,
            "priority": priority,
            **extra,
        }
    )
    return Job.submitted(job_id=f"j-{n:016x}", spec=spec, now=NOW - age, message_id=f"m-{n}")


def running(n: int, team: str, *, gpus: int = 8, borrowed: int = 0, priority: str = "normal", **kw: Any) -> Job:
    waiting = job(n, team, gpus=gpus, priority=priority)
    checkpoint_at = kw.get("checkpoint_at")
    attempt = Attempt(number=1, started_at=NOW, instance_ids=(f"i-{n}",), instance_type="p4d.24xlarge")
    if checkpoint_at is not None:
        attempt = attempt.model_copy(update={"checkpoint_at": checkpoint_at, "checkpoint_step": 100})
    admitted_at = kw.get("admitted_at", NOW - timedelta(hours=1))
    return waiting.model_copy(
        update={
            "state": JobState.RUNNING,
            "admission": Admission(at=admitted_at, borrowed=borrowed),
            "attempts": (attempt,),
        }
    )


def ids(pairs: Sequence[tuple[str, Admission]]) -> list[str]:
    return [job_id for job_id, _ in pairs]


# ---- admission at submission ---------------------------------------------------------------------
def test_a_job_that_fits_its_teams_quota_with_nobody_waiting_is_admitted_at_once() -> None:
    new = job(1, "vision")
    ledger = truth([running(2, "vision"), new])

    granted = admit_at_once(new, ledger, directory({"vision": {"gpus": 16}}), NOW)

    assert isinstance(granted, Admission)
    assert granted.borrowed == 0
    assert granted.team_ceiling == 16 - 8  # the write requires the team to hold at most 8 GPUs
    assert "vision holds 8 GPU(s) of its 16" in granted.detail


def test_a_job_over_its_teams_quota_waits_naming_the_teams_use_and_quota() -> None:
    new = job(1, "vision")
    ledger = truth([running(2, "vision"), running(3, "vision"), new])

    waiting = admit_at_once(new, ledger, directory({"vision": {"gpus": 16}}), NOW)

    assert not isinstance(waiting, Admission)
    assert waiting.blocked is Blocked.TEAM_QUOTA
    assert "vision holds 16 of its 16 GPU(s), it asks 8" in waiting.detail


def test_a_job_never_overtakes_a_job_of_its_team_that_already_waits() -> None:
    earlier, new = job(1, "vision", age=timedelta(hours=1)), job(2, "vision")
    ledger = truth([earlier, new])

    waiting = admit_at_once(new, ledger, directory({"vision": {"gpus": 16}}), NOW)

    assert not isinstance(waiting, Admission)
    assert waiting.blocked is Blocked.BEHIND


def test_a_paused_team_and_a_drained_fleet_admit_nothing() -> None:
    new = job(1, "vision")
    paused = admit_at_once(new, truth([new]), directory({"vision": {"gpus": 16, "paused": True}}), NOW)
    drained = admit_at_once(new, truth([new]), directory({"vision": {"gpus": 16}}, {"drain": True}), NOW)

    assert not isinstance(paused, Admission)
    assert paused.blocked is Blocked.PAUSED
    assert not isinstance(drained, Admission)
    assert drained.blocked is Blocked.DRAINED


# ---- the plan: order ----------------------------------------------------------------------------------
def test_teams_are_admitted_by_weighted_share_until_the_fleet_is_full() -> None:
    """vision has twice the weight of speech: of 48 GPUs, vision gets 32 and speech 16."""
    waiting = [job(n, "vision") for n in range(6)] + [job(10 + n, "speech") for n in range(6)]
    teams = directory({"vision": {"gpus": 48, "weight": 2}, "speech": {"gpus": 48, "weight": 1}}, {"max_gpus": 48})

    decided = plan(waiting, [], truth(waiting), teams, NOW)

    admitted = [j for j in waiting if j.job_id in ids(decided.admit)]
    assert sum(8 for j in admitted if j.team == "vision") == 32
    assert sum(8 for j in admitted if j.team == "speech") == 16
    assert all(w.blocked in (Blocked.FLEET_CAP, Blocked.BEHIND) for w in decided.waiting.values())


def test_within_a_team_higher_priority_goes_first_then_submission_order() -> None:
    low, normal, high = (
        job(1, "vision", priority="low", age=timedelta(hours=3)),
        job(2, "vision"),
        job(3, "vision", priority="high"),
    )
    older = job(4, "vision", age=timedelta(hours=2))

    decided = plan(
        [low, normal, high, older], [], truth([low, normal, high, older]), directory({"vision": {"gpus": 16}}), NOW
    )

    assert ids(decided.admit) == [high.job_id, older.job_id]
    assert decided.order[2:] == (normal.job_id, low.job_id)


def test_a_low_priority_job_waiting_twice_the_aging_step_is_ordered_as_high() -> None:
    """No starvation by priority: a flood of new high jobs cannot keep an aged low job out for good."""
    aged = job(1, "vision", priority="low", age=2 * AGING_STEP)
    flood = [job(10 + n, "vision", priority="high") for n in range(20)]

    decided = plan([*flood, aged], [], truth([*flood, aged]), directory({"vision": {"gpus": 8}}), NOW)

    assert effective_rank(aged, NOW) == effective_rank(flood[0], NOW)
    assert ids(decided.admit) == [aged.job_id]  # the same class, and submitted before all of them


def test_a_head_the_fleets_cap_cannot_take_is_overtaken_by_nobody() -> None:
    big = job(1, "vision", gpus=32, age=timedelta(hours=1))
    small = job(2, "speech", gpus=8)
    holders = [running(3, "speech", gpus=8)]
    teams = directory({"vision": {"gpus": 32}, "speech": {"gpus": 32}}, {"max_gpus": 32})

    decided = plan([big, small], holders, truth([*holders, big, small]), teams, NOW)

    assert decided.admit == ()
    assert decided.waiting[big.job_id].blocked is Blocked.FLEET_CAP
    assert decided.waiting[small.job_id].blocked is Blocked.BEHIND


def test_a_head_its_own_quota_cannot_take_does_not_hold_other_teams_up() -> None:
    full = [running(1, "vision"), running(2, "vision")]
    blocked, other = job(3, "vision", age=timedelta(hours=1)), job(4, "speech")
    teams = directory({"vision": {"gpus": 16}, "speech": {"gpus": 16}})

    decided = plan([blocked, other], full, truth([*full, blocked, other]), teams, NOW)

    assert ids(decided.admit) == [other.job_id]
    assert decided.waiting[blocked.job_id].blocked is Blocked.TEAM_QUOTA


# ---- borrowing and preemption -------------------------------------------------------------------
def test_a_team_that_may_borrow_runs_on_another_teams_idle_quota_and_it_is_recorded_as_borrowed() -> None:
    mine = [running(1, "speech")]
    extra = job(2, "speech")
    teams = directory({"vision": {"gpus": 16}, "speech": {"gpus": 8, "borrow": True}})

    decided = plan([extra], mine, truth([*mine, extra]), teams, NOW)

    ((job_id, admission),) = decided.admit
    assert job_id == extra.job_id
    assert admission.borrowed == 8
    assert "borrows 8" in admission.detail


def test_a_lenders_own_job_goes_before_a_borrowers_whatever_their_shares() -> None:
    """Both fit the fleet only one at a time: the lender's job is within its own quota, the
    borrower's would borrow, so the lender is never beaten to its own GPUs (no preemption ping-pong)."""
    lender, borrower = job(1, "vision"), job(2, "speech", age=timedelta(hours=5))
    holders = [running(3, "vision")]
    teams = directory({"vision": {"gpus": 16}, "speech": {"gpus": 0, "borrow": True}}, {"max_gpus": 16})

    decided = plan([lender, borrower], holders, truth([*holders, lender, borrower]), teams, NOW)

    assert ids(decided.admit) == [lender.job_id]
    assert decided.waiting[borrower.job_id].blocked is Blocked.FLEET_CAP


def test_a_borrower_borrows_only_other_teams_idle_quota_never_its_own() -> None:
    """Found by the randomized proof: a team's own idle quota counted in the pool it borrows from let a
    job that needs 2 of a 1-GPU quota start with nothing lent, and the next tick preempted it again."""
    lenders = [running(1, "ml", gpus=1), running(2, "ml", gpus=1), running(3, "ml", gpus=1)]
    asks_two = job(4, "default", gpus=2)
    teams = directory({"default": {"gpus": 1, "borrow": True}, "ml": {"gpus": 3}})

    decided = plan([asks_two], lenders, truth([*lenders, asks_two]), teams, NOW)

    assert decided.admit == ()
    assert decided.waiting[asks_two.job_id].blocked is Blocked.POOL
    assert decided.preempt == ()


def test_a_team_that_may_not_borrow_waits_whatever_lies_idle() -> None:
    mine = [running(1, "speech")]
    extra = job(2, "speech")
    teams = directory({"vision": {"gpus": 16}, "speech": {"gpus": 8}})

    decided = plan([extra], mine, truth([*mine, extra]), teams, NOW)

    assert decided.admit == ()
    assert decided.waiting[extra.job_id].blocked is Blocked.TEAM_QUOTA


def test_a_lender_that_wants_its_quota_back_preempts_the_borrowed_work_on_it() -> None:
    """The fleet is full: speech borrowed 16 of vision's idle quota. vision's own job fits its quota:
    speech's borrowed jobs go, the cheapest to lose first."""
    borrowed = [
        running(1, "speech", borrowed=8, checkpoint_at=NOW - timedelta(minutes=50)),
        running(2, "speech", borrowed=8, checkpoint_at=NOW - timedelta(minutes=1)),
    ]
    own = [running(3, "speech")]
    wants = job(4, "vision")
    teams = directory({"vision": {"gpus": 16}, "speech": {"gpus": 8, "borrow": True}}, {"max_gpus": 24})

    decided = plan([wants], [*borrowed, *own], truth([*borrowed, *own, wants]), teams, NOW)

    assert decided.admit == ()
    assert decided.preempt == (borrowed[1].job_id,)  # the newest checkpoint loses the least


def test_a_higher_class_job_that_must_borrow_preempts_only_lower_class_borrowed_work() -> None:
    lent = [running(1, "speech", borrowed=8, priority="low"), running(2, "nlp", borrowed=8, priority="high")]
    urgent = job(3, "vision", priority="high")
    owners = [running(4, "vision"), running(5, "owner", gpus=0)]
    teams = directory(
        {
            "vision": {"gpus": 8, "borrow": True},
            "speech": {"gpus": 0, "borrow": True},
            "nlp": {"gpus": 0, "borrow": True},
            "owner": {"gpus": 16},
        }
    )

    decided = plan([urgent], [*lent, *owners], truth([*lent, *owners, urgent]), teams, NOW)

    assert decided.admit == ()
    assert decided.waiting[urgent.job_id].blocked is Blocked.POOL
    assert decided.preempt == (lent[0].job_id,)  # never the high one


def test_victims_already_being_preempted_are_counted_as_freeing_their_gpus() -> None:
    borrowed = [running(1, "speech", borrowed=8), running(2, "speech", borrowed=8)]
    being_preempted = StopRequest(reason=Reason.PREEMPTED, requested_at=NOW, deadline=NOW + timedelta(minutes=2))
    asked = borrowed[0].model_copy(update={"stop_request": being_preempted})
    wants = job(3, "vision")
    teams = directory({"vision": {"gpus": 16}, "speech": {"gpus": 0, "borrow": True}}, {"max_gpus": 16})

    decided = plan([wants], [asked, borrowed[1]], truth([asked, borrowed[1], wants]), teams, NOW)

    assert decided.preempt == ()  # the one being preempted frees the 8 it needs


def test_the_ledger_a_plan_reads_is_what_the_records_stand_for() -> None:
    jobs = [running(1, "vision"), running(2, "speech", borrowed=8), job(3, "vision")]

    ledger = truth(jobs)

    assert ledger == Ledger(
        {
            "gpus": 16,
            "gpus/vision": 8,
            "gpus/speech": 8,
            "borrowed/speech": 8,
            "gpus/vision/p4d": 8,
            "gpus/speech/p4d": 8,
            "waiting": 1,
            "waiting/vision": 1,
        }
    )
