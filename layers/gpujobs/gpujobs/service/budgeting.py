"""Budget alerts: AWS Budgets notifications (plain text over SNS) and Cost Anomaly Detection.

A forecasted breach (or a significant cost anomaly) makes the scope's launches spot-only and
publishes a warning; an actual breach holds the scope's launches (jobs stay QUEUED, reason budget)
and asks each of its running jobs to stop, which checkpoints before any instance goes. Text that is
not a budget notification we understand is counted and logged, never treated as a breach. Holds
are released by the reconciler when the period rolls over or the budget has room again.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpujobs.domain.budget import (
    AnomalyDetail,
    UnparsedAlert,
    anomaly_is_significant,
    anomaly_reason,
    decide_budget_mode,
    parse_budget_notification,
    period_of,
    scope_of_budget,
)
from gpujobs.domain.effects import Outcome
from gpujobs.domain.states import JobState, Reason
from gpujobs.service.ports import BudgetMode, BudgetPolicy
from gpujobs.service.reactions import Reaction, Reactions

NOTICE_FOR_MODE = {BudgetMode.SPOT_ONLY: "GPU Budget Warning", BudgetMode.HOLD: "GPU Budget Hold"}


@dataclass
class BudgetReactions:
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
        return self.apply(scope, BudgetMode(mode), reason)

    def cost_anomaly(self, detail: AnomalyDetail) -> Reaction:
        if not anomaly_is_significant(detail):
            return Reaction(Outcome.BELOW_THRESHOLD, detail=anomaly_reason(detail))
        return self.apply("all", BudgetMode.SPOT_ONLY, anomaly_reason(detail))

    def apply(self, scope: str, mode: BudgetMode, reason: str) -> Reaction:
        jobs = self.reactions.jobs
        now = jobs.clock.now()
        period = period_of(now.date())
        existing = next((p for p in jobs.budgets.held_scopes() if p.scope == scope), None)
        if existing is not None and existing.period == period and existing.mode is BudgetMode.HOLD:
            mode = BudgetMode.HOLD  # never relax a hold within its period on a later, milder alert
        jobs.budgets.set_policy(BudgetPolicy(scope=scope, mode=mode, reason=reason, period=period, since=now))
        jobs.publisher.publish_notice(
            NOTICE_FOR_MODE[mode], {"scope": scope, "mode": mode.value, "reason": reason, "period": period}
        )
        stopping = 0
        if mode is BudgetMode.HOLD:
            for job in jobs.store.list_by_state(JobState.RUNNING, limit=5000):
                if scope in ("all", job.team):
                    asked = self.reactions.request_stop(job.job_id, Reason.BUDGET_EXCEEDED, detail=f"budget: {reason}")
                    stopping += 0 if asked.ignored else 1
        metric = "BudgetHolds" if mode is BudgetMode.HOLD else "BudgetWarnings"
        return Reaction(
            Outcome.BUDGET_APPLIED,
            None,
            {metric: 1},
            f"budget {mode.value} for {scope}: {reason}; {stopping} running job(s) checkpointing to stop",
        )
