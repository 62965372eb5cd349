"""What an attempt's end means for its job: a pure judgement over what has been observed.

Observations arrive as events in any order, twice, or not at all: `Job Exited` reports from each
node, instance state changes, spot warnings. They are recorded on the attempt first; then
`judge_attempt` reads the whole record and answers with a verdict. Because the verdict depends
only on the record, running it again (a duplicate event, the reconciler a minute later) gives the
same answer, and a report that arrives after the instances are gone still counts if it arrives
within the grace period.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from gpujobs.contract import ExitCode
from gpujobs.domain.attempts import UNHEALTHY_END_REASONS, ended_in_a_row
from gpujobs.domain.job import Attempt, Job, Market
from gpujobs.domain.spec import Capacity
from gpujobs.domain.states import JobState, Reason

PREEMPTED_EXIT_CODE = ExitCode.PREEMPTED
"""The trainer's "preempted, checkpoint saved, resume me" exit code (EX_TEMPFAIL)."""
REPORT_GRACE = timedelta(seconds=90)
"""How long to wait, after an attempt's instances are gone, for exit reports still in flight."""
STOP_CHECKPOINT_DEADLINE = timedelta(minutes=10)
PREEMPTION_GRACE = timedelta(minutes=2)
"""How long a preempted job gets to commit its checkpoint (`domain.admission`): a spot warning's
window (`gangs.SPOT_WARNING_WINDOW`), so a preemption loses no more than a spot interruption."""
"""How long a policy stop waits for the checkpoint it asked for before stopping anyway."""
BOOT_WINDOW = timedelta(minutes=15)
"""An attempt whose instances were all gone this soon after its launch, with no report of any kind,
died at boot: an EBS key the instance may not use, an AMI that does not boot, a broken instance
profile end an instance in its first minutes. A trainer reclaimed later without a word is a loss."""
BOOT_DEATH_LIMIT = 2
"""Attempts in a row whose instances died at boot before the job fails: a pool that kills every
launch is not retried forever (nor counted as spot interruptions, which would relaunch it ~8 times)."""
BOOT_DEATH_CAUSES = (
    "likely causes: the account's default EBS key is a customer managed KMS key the stack may not use"
    " (EbsKmsKeyArn and its grants), an AMI that does not boot this type, or the instance profile"
)
UNHEALTHY_LIMIT = 3
"""Attempts in a row ended by a node's failed GPU check, a hardware fault or a slow interconnect
before the job fails: each relaunch goes to other hosts (and a scored-down pool), so three bad gangs
in a row say the pools, the AMI, the driver or the job's own check are broken, and an unhealthy
report never relaunches a job forever."""
HARDWARE_EXIT_CODES = {ExitCode.UNHEALTHY_NODE: "unhealthy-node", ExitCode.HARDWARE_FAULT: "hardware-fault"}
"""The bootstrap's codes for a node whose hardware failed (`gpujobs.instance.gpu_health`) -> the verdict."""
MISCONFIGURED_EXIT_CODES = frozenset({ExitCode.CONFIG_ERROR, 2, 126, 127})
"""Exit codes that name a configuration error when no step was made: 78 (EX_CONFIG, the trainer's
and any script's "misconfigured"), 2 (a usage error; Python's `can't open file`), 126 and 127 (a
shell's or `docker run`'s "not executable" and "not found"). The bootstrap's own failures (a pull,
a rendezvous timeout) exit `ExitCode.BOOTSTRAP_FAILED`, never one of these: they may pass."""


class Verdict(StrEnum):
    WAIT = "wait"
    """Not enough is known yet."""
    TERMINATE_GANG = "terminate-gang"
    """A node crashed: the rest of the gang cannot make progress; terminate it, then judge."""
    SUCCEEDED = "succeeded"
    INTERRUPTED = "interrupted"
    """Reclaimed (spot warning, preempted exit or spot loss): replace, counted as an interruption."""
    CRASHED = "crashed"
    """Failed: retry while attempts remain."""
    SYNC_FAILED = "sync-failed"
    """The script ended well, its folder's last sync did not (`ExitCode.SYNC_FAILED` and no other
    failure): relaunch from the sync before, while attempts remain."""
    MISCONFIGURED = "misconfigured"
    """Failed with a configuration error before its first step: a retry would fail the same way."""
    LOST = "lost"
    """Gone without a report and not spot: relaunch, counted against max_attempts."""
    DIED_AT_BOOT = "died-at-boot"
    """Gone within `BOOT_WINDOW` of the launch before the bootstrap reported anything (no heartbeat,
    checkpoint or exit report) and without a spot warning: relaunch until `BOOT_DEATH_LIMIT` in a row."""
    STOPPED = "stopped"
    """A policy stop completed."""
    UNHEALTHY_NODE = "unhealthy-node"
    """A node's GPU check failed before training (`ExitCode.UNHEALTHY_NODE`): the gang is relaunched on
    other hosts, counted neither as a crash (no attempt spent) nor as an interruption, until
    `UNHEALTHY_LIMIT` in a row."""
    HARDWARE_FAULT = "hardware-fault"
    """The workload failed and its node logged new hardware XIDs (`ExitCode.HARDWARE_FAULT`): relaunched
    like an unhealthy node, never judged the job's crash."""
    SLOW_INTERCONNECT = "slow-interconnect"
    """The gang's all-reduce, measured by the launcher before any of the job's code ran, was below the
    type's floor (`ExitCode.SLOW_INTERCONNECT`, and the gang made no progress: `slow_interconnect`):
    relaunched on other hosts like an unhealthy node, but its pool is never scored down (the figure
    is the job's container's claim, and a job must not steer other jobs' placement)."""


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    detail: str = ""


def judge_attempt(job: Job, attempt: Attempt, *, now: datetime) -> Judgement:
    """The verdict for one attempt, from what has been recorded on it."""
    codes = attempt.exit_codes
    crashed = {i: c for i, c in codes.items() if c not in (0, PREEMPTED_EXIT_CODE)}
    preempted = [i for i, c in codes.items() if c == PREEMPTED_EXIT_CODE]
    grace_over = attempt.gone_at is not None and now - attempt.gone_at >= REPORT_GRACE
    kept = bool(crashed) and fails_and_keeps(job, attempt, crashed)
    # Instances that a policy stop took away need no grace: we know why they are gone. A crash that
    # fails a job keeping its gang ends the attempt at once: the gang stays up as it is, hung ranks too.
    settled = attempt.all_reported or kept or (attempt.all_gone and (grace_over or job.stop_request is not None))
    if crashed and not settled and not attempt.all_gone:
        return Judgement(Verdict.TERMINATE_GANG, _codes(crashed))
    vanished = [i for i in attempt.gone if i not in codes]
    broken_for = now - attempt.first_gone_at if attempt.first_gone_at is not None else None
    unwarned = attempt.interrupted_at is None  # a reclaimed gang's survivors get the warning window (gangs.py)
    if (
        vanished
        and unwarned
        and not kept
        and not attempt.all_gone
        and broken_for is not None
        and broken_for >= REPORT_GRACE
    ):
        # A node went without a word (no warning, no exit report): the rest of the gang cannot make
        # progress and may hang in a collective forever. One gang per attempt: end this one.
        return Judgement(Verdict.TERMINATE_GANG, f"node(s) gone without a report: {', '.join(vanished)}")
    if not settled:
        return Judgement(Verdict.WAIT)
    if job.stop_request is not None and not crashed:
        return Judgement(Verdict.STOPPED, job.stop_request.detail or job.stop_request.reason.value)
    hardware = sorted({code for code in crashed.values() if code in HARDWARE_EXIT_CODES})
    if hardware:  # a node's hardware ended the gang: what the other nodes then exited with follows from it
        return Judgement(Verdict(HARDWARE_EXIT_CODES[ExitCode(hardware[-1])]), _unhealthy(attempt, crashed))
    slow = slow_interconnect(attempt, crashed)
    if slow:  # the gang's check failed before the job's code ran: the other nodes' exits follow from it
        return Judgement(Verdict.SLOW_INTERCONNECT, _slow_interconnect(attempt, slow))
    if crashed and all(code == ExitCode.SYNC_FAILED for code in crashed.values()):
        return Judgement(Verdict.SYNC_FAILED, f"the last sync of the checkpoint folder failed ({_codes(crashed)})")
    if crashed and misconfigured(job, crashed):
        return Judgement(Verdict.MISCONFIGURED, _config_error(attempt, crashed))
    if crashed:
        return Judgement(Verdict.CRASHED, _codes(crashed))
    if codes and all(c == 0 for c in codes.values()) and attempt.all_reported:
        return Judgement(Verdict.SUCCEEDED, f"{len(codes)} node(s) exited 0")
    if preempted or attempt.interrupted_at is not None:
        return Judgement(Verdict.INTERRUPTED, "checkpoint saved on preemption" if preempted else "reclaimed")
    missing = [i for i in attempt.instance_ids if i not in codes]
    if died_at_boot(attempt):
        return Judgement(Verdict.DIED_AT_BOOT, _boot_death(attempt, missing))
    if attempt.market is Market.SPOT:
        return Judgement(Verdict.INTERRUPTED, f"spot instances gone without a report: {', '.join(missing)}")
    return Judgement(Verdict.LOST, f"instances gone without a report: {', '.join(missing)}")


def misconfigured(job: Job, crashed: dict[str, int]) -> bool:
    """A node exited with a configuration error's code and the job never made progress in any
    attempt (`made_progress`). Decided on codes and progress, never on log text. After progress the
    same code is a crash, retried while attempts remain: the configuration once worked, so what
    failed (a store briefly unreachable, a file a replacement could not read) may pass."""
    return not made_progress(job) and any(code in MISCONFIGURED_EXIT_CODES for code in crashed.values())


def fails_and_keeps(job: Job, attempt: Attempt, crashed: dict[str, int]) -> bool:
    """A crash of the running job's current attempt that fails the job (a configuration error, or
    its last attempt) where the spec keeps a failed gang up (`keep_on_failure`, `domain.keep`): the
    gang is not terminated, whether or not every node has reported."""
    spec = job.spec
    if spec is None or spec.keep_on_failure is None or job.state is not JobState.RUNNING:
        return False
    if not job.is_current(attempt) or job.stop_request is not None or attempt.interrupted_at is not None:
        return False
    if attempt.waits_for_replacement:
        return False
    if any(code in HARDWARE_EXIT_CODES for code in crashed.values()) or slow_interconnect(attempt, crashed):
        return False  # a node's hardware or the gang's network ended it: relaunched on other hosts, never kept
    return misconfigured(job, crashed) or job.crashes + 1 >= spec.max_attempts


def slow_interconnect(attempt: Attempt, crashed: dict[str, int]) -> list[str]:
    """The nodes that exited `ExitCode.SLOW_INTERCONNECT`, where that is believed: the launcher checks
    the gang's all-reduce before `requirements:`, `setup:` and the workload, so the gang as it is now
    (since its launch, or since a regroup's replacements joined it) has made no progress: no heartbeat,
    no checkpoint commit and no directory sync recorded. After progress the code is the workload's own
    exit, judged like any crash (none here). Decided on the record, never on the message."""
    slow = [i for i, code in sorted(crashed.items()) if code == ExitCode.SLOW_INTERCONNECT]
    return slow if slow and not progressed_in_gang(attempt) else []


def progressed_in_gang(attempt: Attempt) -> bool:
    """A heartbeat or a checkpoint (a commit, or a `directory` job's sync) recorded on the attempt since
    its gang formed: its launch, or the newest regroup's replacements' launch."""
    regroup = attempt.regroup
    formed = regroup.launched_at if regroup is not None and regroup.launched_at is not None else attempt.started_at
    heard = (attempt.last_heartbeat_at, attempt.checkpoint_at if attempt.checkpoint_step is not None else None)
    return any(at is not None and at >= formed for at in heard)


def made_progress(job: Job) -> bool:
    """Whether any attempt of the job, the retired ones included, ever made progress: a committed
    checkpoint or a heartbeat (a trainer's step; for a script without the library, the launcher's
    heartbeat, sent once the script has run for a heartbeat period, is its time trained)."""
    if job.checkpoint_step is not None or job.retired.progressed:
        return True
    return any(a.last_heartbeat_at is not None or a.checkpoint_step is not None for a in job.attempts)


def died_at_boot(attempt: Attempt) -> bool:
    """Every instance gone soon after the launch, and nothing ever heard from the attempt: no report
    (heartbeat, checkpoint, exit) and no spot warning. Decided on the record alone."""
    heard = attempt.exit_codes or attempt.last_heartbeat_at is not None or attempt.checkpoint_step is not None
    if heard or attempt.interrupted_at is not None or not attempt.all_gone or attempt.first_gone_at is None:
        return False
    return attempt.first_gone_at - attempt.started_at <= BOOT_WINDOW


def boot_deaths_in_a_row(job: Job) -> int:
    """Attempts that launched instances and ended died-at-boot, newest first, until one that did not
    (attempts that launched nothing, a walk that found no capacity, do not break the row; one that
    launched and has not ended, such as a gang still being reclaimed after its warning, does)."""
    count, whole = ended_in_a_row(job.attempts, (Verdict.DIED_AT_BOOT.value,))
    return count + (job.retired.boot_deaths_in_a_row if whole else 0)


def _boot_death(attempt: Attempt, missing: list[str]) -> str:
    said = "; ".join(f"{i}: {r}" for i, r in sorted(attempt.gone_reasons.items()) if i in missing)
    ec2 = f"; EC2 said {said}" if said else ""
    return (
        f"instances died at boot, before the bootstrap's first report ({', '.join(missing)}){ec2}; {BOOT_DEATH_CAUSES}"
    )


def unhealthy_in_a_row(job: Job) -> int:
    """Attempts ended by their hosts (`UNHEALTHY_NODE`, `HARDWARE_FAULT`, `SLOW_INTERCONNECT`), newest first, until
    one that ended otherwise (attempts that launched nothing do not break the row)."""
    count, whole = ended_in_a_row(job.attempts, UNHEALTHY_END_REASONS)
    return count + (job.retired.unhealthy_in_a_row if whole else 0)


def _unhealthy(attempt: Attempt, crashed: dict[str, int]) -> str:
    found = [i for i, code in sorted(crashed.items()) if code in HARDWARE_EXIT_CODES]
    said = "; ".join(f"{i}: {attempt.unhealthy[i]}" if attempt.unhealthy.get(i) else i for i in found)
    return f"unhealthy node(s), replaced without spending an attempt: {said}"


def _slow_interconnect(attempt: Attempt, slow: list[str]) -> str:
    """The nodes and what they said they measured; a gang's nodes report the same figure, said once."""
    by_said: dict[str, list[str]] = {}
    for iid in slow:
        by_said.setdefault(attempt.slow_interconnect.get(iid, ""), []).append(iid)
    said = "; ".join(f"{', '.join(ids)}: {s}" if s else ", ".join(ids) for s, ids in by_said.items())
    return f"slow interconnect, relaunched on other hosts without spending an attempt: {said}"


def _config_error(attempt: Attempt, crashed: dict[str, int]) -> str:
    line = f": {attempt.error_line}" if attempt.error_line else ""
    return f"configuration error before the first step ({_codes(crashed)}){line}"


def _codes(crashed: dict[str, int]) -> str:
    return "exit " + ", ".join(f"{code} on {iid}" for iid, code in sorted(crashed.items()))


@dataclass(frozen=True)
class Move:
    """The transitions that follow a verdict on the job's current attempt, in order."""

    steps: tuple[tuple[JobState, Reason], ...]
    relaunch: bool
    counts_interruption: bool = False
    counts_crash: bool = False


def moves_for(job: Job, judgement: Judgement) -> Move | None:
    """How the job moves once its current attempt has ended with this verdict (None: it doesn't)."""
    spec = job.require_spec()
    state = job.state
    if state not in (JobState.RUNNING, JobState.INTERRUPTED):
        return None
    verdict = judgement.verdict
    if verdict is Verdict.SUCCEEDED:
        return Move(((JobState.SUCCEEDED, Reason.COMPLETED),), relaunch=False)
    if verdict is Verdict.STOPPED or job.stop_request is not None:
        # A policy stop under way ends the job whatever took the instances: a reclaim, a crash.
        assert job.stop_request is not None
        if job.stop_request.reason is Reason.PREEMPTED:  # it gave its borrowed GPUs back: it waits again
            return Move(((JobState.QUEUED, Reason.PREEMPTED),), relaunch=False)
        return Move(((JobState.STOPPED, job.stop_request.reason),), relaunch=False)
    attempt = job.current_attempt
    regrouping = attempt is not None and attempt.waits_for_replacement
    if verdict is Verdict.INTERRUPTED or state is JobState.INTERRUPTED or regrouping:
        # An attempt already being reclaimed (a warning, or a node's whose replacement the gang
        # waits for) that then crashes or vanishes is still a reclaim.
        return interruption_moves(job, already_counted=state is JobState.INTERRUPTED)
    if verdict is Verdict.MISCONFIGURED:
        return Move(((JobState.FAILED, Reason.CONFIG_ERROR),), relaunch=False, counts_crash=True)
    if verdict is Verdict.CRASHED:
        if job.crashes + 1 >= spec.max_attempts:
            return Move(((JobState.FAILED, Reason.CRASHED_TOO_OFTEN),), relaunch=False, counts_crash=True)
        return Move(((JobState.QUEUED, Reason.CRASHED_RETRYING),), relaunch=True, counts_crash=True)
    if verdict is Verdict.SYNC_FAILED:
        ends = JobState.FAILED if job.crashes + 1 >= spec.max_attempts else JobState.QUEUED
        return Move(((ends, Reason.SYNC_FAILED),), relaunch=ends is JobState.QUEUED, counts_crash=True)
    if verdict is Verdict.DIED_AT_BOOT:
        if boot_deaths_in_a_row(job) >= BOOT_DEATH_LIMIT:
            return Move(((JobState.FAILED, Reason.DIED_AT_BOOT),), relaunch=False)
        return Move(((JobState.QUEUED, Reason.DIED_AT_BOOT),), relaunch=True)
    if verdict in (Verdict.UNHEALTHY_NODE, Verdict.HARDWARE_FAULT, Verdict.SLOW_INTERCONNECT):
        reason = Reason(verdict.value)
        if unhealthy_in_a_row(job) >= UNHEALTHY_LIMIT:
            return Move(((JobState.FAILED, reason),), relaunch=False)
        return Move(((JobState.QUEUED, reason),), relaunch=True)
    if verdict is Verdict.LOST:
        if job.crashes + 1 >= spec.max_attempts:
            return Move(((JobState.FAILED, Reason.INSTANCE_LOST),), relaunch=False, counts_crash=True)
        return Move(((JobState.QUEUED, Reason.INSTANCE_LOST),), relaunch=True, counts_crash=True)
    return None


def interruption_moves(job: Job, *, already_counted: bool = False) -> Move:
    """RUNNING -> INTERRUPTED, then a replacement, unless a spot-only job is past its limit. A gang
    that ended while it waited for a node's replacement (`domain.regroup`) is the reclaim its
    warning counted already: it is replaced whole, not counted again."""
    spec = job.require_spec()
    attempt = job.current_attempt
    regrouping = attempt is not None and attempt.waits_for_replacement
    already_counted = already_counted or regrouping  # the node's reclaim was counted at its warning
    interruptions = job.interruptions + (0 if already_counted else 1)
    steps: list[tuple[JobState, Reason]] = []
    if job.state is JobState.RUNNING:
        steps.append((JobState.INTERRUPTED, Reason.NO_ROOM_FOR_NODE if regrouping else Reason.SPOT_INTERRUPTION))
    if spec.capacity is Capacity.SPOT and interruptions > spec.max_interruptions:
        steps.append((JobState.FAILED, Reason.INTERRUPTED_TOO_OFTEN))
        return Move(tuple(steps), relaunch=False, counts_interruption=not already_counted)
    return Move(tuple(steps), relaunch=True, counts_interruption=not already_counted)


def stop_is_due(job: Job, *, now: datetime) -> bool:
    """A policy stop may take the instances now: its checkpoint arrived, its deadline passed, or the
    job takes no checkpoint requests (nothing to wait for; `directory` saves on the stop's SIGTERM)."""
    request = job.stop_request
    if request is None:
        return False
    if not job.require_spec().checkpoint.takes_checkpoint_requests:
        return True
    newer = job.checkpoint_step is not None and (
        request.checkpoint_step_at_request is None or job.checkpoint_step > request.checkpoint_step_at_request
    )
    return newer or now >= request.deadline
