"""Budget alerts: AWS Budgets notifications (plain text over SNS) and Cost Anomaly Detection.

A forecasted breach (or a significant cost anomaly) makes the scope's launches spot-only and
publishes a warning; an actual breach holds the scope's launches (jobs stay QUEUED, reason budget)
and asks each of its running jobs to stop, which checkpoints before any instance goes; the
reconciler enforces a hold on every run too, so a job that was launching at the moment of the
alert is stopped once it runs. Text that is not a budget notification we understand is counted
and logged, never treated as a breach. A hold is released by the reconciler when the period rolls
over or the budget has room again; spot-only lasts until the period rolls over.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gpujobs.contract import BUDGET_HOLD, BUDGET_WARNING
from gpujobs.domain.budget import ALL_SCOPE, BudgetMode, BudgetPolicy, hold_over, period_of, scope_of_budget
from gpujobs.domain.budget_alerts import UnparsedAlert, decide_budget_mode, parse_budget_notification
from gpujobs.domain.cost_anomaly import CostAnomaly, anomaly_is_significant, anomaly_reason
from gpujobs.domain.effects import Outcome
from gpujobs.domain.states import MAX_ACTIVE_JOBS, JobState, Reason
from gpujobs.service.ports import Ports, UnreadableJobError
from gpujobs.service.reactions import Reaction, Reactions

log = logging.getLogger(__name__)

NOTICE_FOR_MODE = {BudgetMode.SPOT_ONLY: BUDGET_WARNING, BudgetMode.HOLD: BUDGET_HOLD}


@dataclass
class BudgetReactions:
    ports: Ports
    reactions: Reactions
    stack_name: str

    def budget_notification(self, *, subject: str | None, message: str) -> Reaction:
        alert = parse_budget_notification(subject, message)
        if isinstance(alert, UnparsedAlert):
            return Reaction(Outcome.NOT_A_BUDGET_ALERT, None, {"BudgetNotificationsUnparsed": 1}, alert.reason)
        scope = scope_of_budget(alert.budget_name, stack_name=self.stack_name)
        if scope is None:
            return Reaction(Outcome.NOT_THIS_STACK, detail=f"budget {alert.budget_name!r}")
        mode, reason = decide_budget_mode(alert)
        return self.apply(scope, mode, reason)

    def cost_anomaly(self, anomaly: CostAnomaly) -> Reaction:
        if not anomaly_is_significant(anomaly):
            return Reaction(Outcome.BELOW_THRESHOLD, detail=anomaly_reason(anomaly))
        return self.apply(ALL_SCOPE, BudgetMode.SPOT_ONLY, anomaly_reason(anomaly))

    def apply(self, scope: str, mode: BudgetMode, reason: str) -> Reaction:
        ports = self.ports
        now = ports.clock.now()
        period = period_of(now.date())
        # One conditional write: a milder alert never relaxes a hold within its period, even when
        # another budget function writes the hold between this alert's arrival and this write.
        policy = ports.budgets.tighten(BudgetPolicy(scope=scope, mode=mode, reason=reason, period=period, since=now))
        ports.publisher.publish_notice(
            NOTICE_FOR_MODE[policy.mode],
            {"scope": scope, "mode": policy.mode.value, "reason": policy.reason, "period": policy.period},
        )
        stopping = 0
        if policy.mode is BudgetMode.HOLD:
            for job in ports.store.list_by_state(
                JobState.RUNNING, limit=MAX_ACTIVE_JOBS, on_unreadable=_skip_unreadable
            ):
                if hold_over(job.team, [policy]) is not None:
                    asked = self.reactions.request_stop(
                        job.job_id, Reason.BUDGET_EXCEEDED, detail=f"budget: {policy.reason}"
                    )
                    stopping += 1 if asked.outcome is Outcome.STOP_REQUESTED else 0
        metric = "BudgetHolds" if policy.mode is BudgetMode.HOLD else "BudgetWarnings"
        return Reaction(
            Outcome.BUDGET_APPLIED,
            None,
            {metric: 1},
            f"budget {policy.mode.value} for {scope}: {policy.reason}; {stopping} running job(s) checkpointing to stop",
        )


def _skip_unreadable(error: UnreadableJobError) -> None:
    """A record this release cannot read is no reason to leave every other job running past the hold."""
    log.error("budget hold: skipping the unreadable record of %s: %s", error.job_id, error.problem)
