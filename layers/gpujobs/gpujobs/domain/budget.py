"""Budget alerts and cost anomalies, read as data: which scope overspent, and what mode follows.

AWS Budgets does not publish threshold breaches to EventBridge. It sends them to one SNS topic as
**plain English text**, in a format that AWS does not document and has changed over the years:
daily budgets say "per day", some versions add "(80.0% of your budget)" after the threshold, mail
clients and relays add CRLFs and stray spaces. So the parser is tolerant in layout: it reads the
`Key: value` lines wherever they are, in any case, with any whitespace, and with thousands
separators and other currency symbols in the amounts.

It is strict in meaning. A HOLD stops running jobs, so a misread alert costs real work. The text
must carry a positive anchor (the `AWS Budget Notification` header, or the Budgets subject line),
and each line it relies on must say exactly one thing the parser understands. When it cannot read
the text it returns `UnparsedAlert` with the reason, and never a guessed breach. The caller tells a
human, who knows better than a regex. The parser never raises, for the same reason: a crashed
handler would be retried by SNS and then dropped without anyone being told.

Cost Anomaly Detection, by contrast, does publish JSON to EventBridge (`aws.ce`, `Anomaly
Detected`); `AnomalyDetail` models its `detail`, leniently, since only the impact matters here.

Modes are returned as the strings "hold" and "spot-only", which are the values of the service's
`BudgetMode`. This keeps the domain below the service layer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpujobs.domain.spec import TEAM_PATTERN

AlertType = Literal["ACTUAL", "FORECASTED"]
BudgetModeName = Literal["hold", "spot-only"]

HOLD: BudgetModeName = "hold"
"""An actual overspend: no launches, running jobs of the scope are checkpointed and stopped."""
SPOT_ONLY: BudgetModeName = "spot-only"
"""A forecast overspend: launches may use spot only."""
ALL_SCOPE = "all"

_EXCERPT_CHARS = 200


@dataclass(frozen=True)
class BudgetAlert:
    """One Budgets threshold notification, as far as the text said it."""

    budget_name: str
    alert_type: AlertType
    threshold_text: str
    """The threshold as written, whitespace collapsed: `> $0.16`, `> 80.0%`."""
    threshold_percent: float | None = None
    threshold_amount: Decimal | None = None
    amount: Decimal | None = None
    """The ACTUAL or FORECASTED spend, whichever the alert is about."""
    budgeted_amount: Decimal | None = None
    currency: str | None = None
    """The symbol or code the amounts were written with (`$`, `€`, `EUR`); None if there was none."""
    budget_type: str | None = None
    notified_on: date | None = None


@dataclass(frozen=True)
class UnparsedAlert:
    """Text that could not be read as a budget alert. Never a breach: a human should look at it."""

    reason: str
    excerpt: str = ""


# ---- Budgets SNS text ---------------------------------------------------------------------

_HEADER = re.compile(r"^[ \t]*AWS[ \t]+Budget[ \t]+Notification\b[ \t]*(?P<rest>.*)$", re.IGNORECASE | re.MULTILINE)
_SUBJECT = re.compile(
    r"^\s*AWS Budgets:\s*\S.*?\s(?:has exceeded|exceeded|is forecasted to exceed)\s+your alert threshold\b",
    re.IGNORECASE,
)
_DATE = re.compile(r"(?P<month>[A-Za-z]{3,9})\.?\s+(?P<day>\d{1,2}),?\s+(?P<year>\d{4})\b")
_MONTHS = (
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
)
_MONEY = re.compile(
    r"(?:(?P<pre>[A-Z]{0,3}[^\w\s.,%()<>=+\-]|[A-Z]{3})\s?)?"
    r"(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)"
    r"(?:\s?(?P<post>[A-Z]{3}))?"
)
_PERCENT = re.compile(r"(?P<pct>\d+(?:\.\d+)?)\s?%(?:\s+of\s+(?:your|the)\s+budget(?:ed\s+amount)?)?", re.IGNORECASE)
_PERIOD_SUFFIX = re.compile(
    r"\s+(?:per\s+(?:day|month|quarter|year)|for\s+the\s+current\s+(?:day|month|quarter|year))$", re.IGNORECASE
)
_GREATER = re.compile(r"(?P<op>>=?|≥|greater\s+than(?:\s+or\s+equal\s+to)?)\s*(?P<rest>.*)", re.IGNORECASE)
_PAREN = re.compile(r"(?P<main>[^()]*?)\s*\((?P<paren>[^()]*)\)")
_BUDGET_NAME = re.compile(r"[^:\\<>]{1,100}")
"""AWS forbids `:` and `\\` in budget names; `<`/`>` here means HTML markup leaked into the value."""


class _UnreadableError(Exception):
    """Internal: the text cannot be read; the message is the reason."""


def parse_budget_notification(subject: str | None, message: str) -> BudgetAlert | UnparsedAlert:
    """Read a Budgets SNS notification; UnparsedAlert (with the reason) for anything else."""
    excerpt = ""
    try:
        text = (message or "").replace("\r\n", "\n").replace("\r", "\n").replace("\u00a0", " ")
        excerpt = " ".join(text.split())[:_EXCERPT_CHARS]
        return _parse(subject or "", text)
    except _UnreadableError as unreadable:
        return UnparsedAlert(reason=str(unreadable), excerpt=excerpt)
    except Exception as bug:  # never raise: a crashed handler would be retried, then dropped silently
        return UnparsedAlert(reason=f"parser error {type(bug).__name__}: {bug}", excerpt=excerpt)


def _parse(subject: str, text: str) -> BudgetAlert:
    header = _HEADER.search(text)
    if header is None and _SUBJECT.match(subject) is None:
        raise _UnreadableError("no 'AWS Budget Notification' header and no 'AWS Budgets: ... alert threshold' subject")
    name = _required(text, "Budget Name")
    if _BUDGET_NAME.fullmatch(name) is None:
        raise _UnreadableError(f"Budget Name {name!r} is not a budget name")
    alert_type = _required(text, "Alert Type").upper()
    if alert_type not in ("ACTUAL", "FORECASTED"):
        raise _UnreadableError(f"Alert Type {alert_type!r} is neither ACTUAL nor FORECASTED")
    threshold_text = " ".join(_required(text, "Alert Threshold").split())
    percent, threshold_money = _threshold(threshold_text)
    amount = _optional_money(text, f"{alert_type} Amount")
    budgeted = _optional_money(text, "Budgeted Amount")
    currencies = {m[1] for m in (threshold_money, amount, budgeted) if m is not None}
    if len(currencies) > 1:
        raise _UnreadableError(f"amounts are in different currencies: {', '.join(sorted(currencies))}")
    return BudgetAlert(
        budget_name=name,
        alert_type="ACTUAL" if alert_type == "ACTUAL" else "FORECASTED",
        threshold_text=threshold_text,
        threshold_percent=percent,
        threshold_amount=threshold_money[0] if threshold_money else None,
        amount=amount[0] if amount else None,
        budgeted_amount=budgeted[0] if budgeted else None,
        currency=currencies.pop() if currencies else None,
        budget_type=_field(text, "Budget Type"),
        notified_on=_notified_on(header.group("rest")) if header else None,
    )


def _field(text: str, label: str) -> str | None:
    """The value of the `label:` line; None if absent. Two lines that disagree are unreadable."""
    words = r"[ \t]+".join(re.escape(word) for word in label.split())
    pattern = re.compile(rf"^[ \t]*{words}[ \t]*:[ \t]*(?P<value>.*?)[ \t]*$", re.IGNORECASE | re.MULTILINE)
    values = {m.group("value") for m in pattern.finditer(text)}
    if len(values) > 1:
        raise _UnreadableError(f"conflicting {label} lines: {sorted(values)}")
    return values.pop() if values else None


def _required(text: str, label: str) -> str:
    value = _field(text, label)
    if not value:
        raise _UnreadableError(f"missing {label} line" if value is None else f"empty {label} line")
    return value


def _optional_money(text: str, label: str) -> tuple[Decimal, str] | None:
    value = _field(text, label)
    if value is None:
        return None
    money = _money(_PERIOD_SUFFIX.sub("", value))
    if money is None:
        raise _UnreadableError(f"{label} {value!r} is not a money amount")
    return money


def _money(text: str) -> tuple[Decimal, str] | None:
    """`$1,234.56`, `€12.00`, `US$3`, `12.00 EUR` -> (amount, currency). A bare number is not money."""
    m = _MONEY.fullmatch(text.strip())
    if m is None or (m.group("pre") is None) == (m.group("post") is None):
        return None
    try:
        return Decimal(m.group("num").replace(",", "")), (m.group("pre") or m.group("post")).strip()
    except InvalidOperation:
        return None


def _threshold(text: str) -> tuple[float | None, tuple[Decimal, str] | None]:
    """`> $0.16`, `> 80.0%`, `> $160.00 (80.0% of your budget)` -> (percent, money)."""
    greater = _GREATER.fullmatch(text)
    if greater is None:
        raise _UnreadableError(f"Alert Threshold {text!r} is not a greater-than threshold")
    rest = greater.group("rest")
    parts = _PAREN.fullmatch(rest)
    main, extra = (parts.group("main"), parts.group("paren")) if parts else (rest, None)
    percent: float | None = None
    money: tuple[Decimal, str] | None = None
    for raw in (main, extra):
        if raw is None:
            continue
        part = _PERIOD_SUFFIX.sub("", raw.strip())
        pct = _PERCENT.fullmatch(part)
        if pct is not None and percent is None:
            percent = float(pct.group("pct"))
        elif pct is None and money is None and (found := _money(part)) is not None:
            money = found
        else:
            raise _UnreadableError(f"Alert Threshold {text!r} is not an amount or a percentage")
    return percent, money


def _notified_on(rest: str) -> date | None:
    """`September 26, 2022` after the header. Only informative, so an odd date is just None."""
    m = _DATE.search(rest)
    if m is None:
        return None
    word = m.group("month").lower()
    months = [i for i, full in enumerate(_MONTHS, start=1) if full.startswith(word)]
    try:
        return date(int(m.group("year")), months[0], int(m.group("day"))) if months else None
    except ValueError:
        return None


# ---- scopes and modes ---------------------------------------------------------------------


def scope_of_budget(budget_name: str, *, stack_name: str) -> str | None:
    """The scope a budget governs in this stack: "all", a team, or None for budgets not ours.

    The stack names its budgets `gpujobs-<stack>-all` and `gpujobs-<stack>-team-<team>`. Anything
    else (another stack's, the account's own) is ignored. A team called "all" is refused, so that
    a team's budget can never set the stack-wide policy.
    """
    prefix = f"gpujobs-{stack_name}-"
    if not stack_name or not budget_name.startswith(prefix):
        return None
    rest = budget_name[len(prefix) :]
    if rest == ALL_SCOPE:
        return ALL_SCOPE
    team = rest.removeprefix("team-")
    if team in (rest, ALL_SCOPE) or re.fullmatch(TEAM_PATTERN, team) is None:
        return None
    return team


def decide_budget_mode(alert: BudgetAlert) -> tuple[BudgetModeName, str]:
    """HOLD for money already spent, SPOT_ONLY for money forecast to be spent; with a short reason."""
    mode = HOLD if alert.alert_type == "ACTUAL" else SPOT_ONLY
    spent = f" {_show(alert.amount, alert.currency)}" if alert.amount is not None else ""
    of_budget = ""
    if alert.threshold_amount is None and alert.budgeted_amount is not None and "(" not in alert.threshold_text:
        of_budget = f" of {_show(alert.budgeted_amount, alert.currency)}"
    reason = f"{alert.alert_type}{spent} {alert.threshold_text}{of_budget} (budget {alert.budget_name})"
    return mode, reason


def _show(amount: Decimal, currency: str | None) -> str:
    if currency is None:
        return f"{amount:,}"
    return f"{amount:,} {currency}" if currency.isalpha() else f"{currency}{amount:,}"


# ---- Cost Anomaly Detection ---------------------------------------------------------------


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)


class AnomalyScore(_Lenient):
    current_score: float | None = Field(default=None, alias="currentScore")
    max_score: float | None = Field(default=None, alias="maxScore")


class AnomalyImpact(_Lenient):
    total_impact: float = Field(alias="totalImpact")
    """Spend above what was expected, in USD: the one number significance is judged on."""
    max_impact: float | None = Field(default=None, alias="maxImpact")
    total_actual_spend: float | None = Field(default=None, alias="totalActualSpend")
    total_expected_spend: float | None = Field(default=None, alias="totalExpectedSpend")
    total_impact_percentage: float | None = Field(default=None, alias="totalImpactPercentage")


class RootCauseImpact(_Lenient):
    contribution: float | None = None


class RootCause(_Lenient):
    linked_account: str | None = Field(default=None, alias="linkedAccount")
    linked_account_name: str | None = Field(default=None, alias="linkedAccountName")
    region: str | None = None
    service: str | None = None
    usage_type: str | None = Field(default=None, alias="usageType")
    impact: RootCauseImpact | None = None


class AnomalyDetail(_Lenient):
    """The `detail` of an `aws.ce` `Anomaly Detected` event; only the id and total impact are required."""

    anomaly_id: str = Field(alias="anomalyId")
    impact: AnomalyImpact
    account_id: str | None = Field(default=None, alias="accountId")
    account_name: str | None = Field(default=None, alias="accountName")
    anomaly_start_date: datetime | None = Field(default=None, alias="anomalyStartDate")
    anomaly_end_date: datetime | None = Field(default=None, alias="anomalyEndDate")
    anomaly_score: AnomalyScore | None = Field(default=None, alias="anomalyScore")
    dimension_value: str | None = Field(default=None, alias="dimensionValue")
    feedback: str | None = None
    root_causes: list[RootCause] = Field(default_factory=list, alias="rootCauses")
    monitor_arn: str | None = Field(default=None, alias="monitorArn")
    monitor_name: str | None = Field(default=None, alias="monitorName")
    anomaly_details_link: str | None = Field(default=None, alias="anomalyDetailsLink")


def anomaly_is_significant(detail: AnomalyDetail, *, min_total_impact_usd: float = 100.0) -> bool:
    """Worth acting on: at least `min_total_impact_usd` spent above what was expected."""
    return detail.impact.total_impact >= min_total_impact_usd


def anomaly_reason(detail: AnomalyDetail) -> str:
    """A one-line account for a human: how much, how unusual, where from."""
    impact = detail.impact
    text = f"cost anomaly {detail.anomaly_id}: ${impact.total_impact:,.2f} above expected"
    if impact.total_impact_percentage is not None:
        text += f" (+{impact.total_impact_percentage:.1f}%)"
    if detail.root_causes:
        cause = detail.root_causes[0]
        where = [p for p in (cause.service, cause.usage_type, cause.region) if p]
        if where:
            text += f"; {' / '.join(where)}"
    if detail.monitor_name:
        text += f"; monitor {detail.monitor_name}"
    return text


# ---- budget periods -----------------------------------------------------------------------

_PERIOD = re.compile(r"(?P<year>\d{4})-(?P<month>0[1-9]|1[0-2])")


def period_of(d: date) -> str:
    """The monthly budget period a (UTC) day falls in: `2026-11`."""
    return f"{d.year:04d}-{d.month:02d}"


def period_rolled_over(policy_period: str, today: date) -> bool:
    """Whether `today` is in a later period than the policy's, so the policy has lapsed.

    A policy without a period never lapses by the calendar. A malformed period is a ValueError,
    not a guess either way: lifting a hold and keeping one forever are both wrong.
    """
    if not policy_period:
        return False
    if _PERIOD.fullmatch(policy_period) is None:
        raise ValueError(f"budget period {policy_period!r} is not YYYY-MM")
    return period_of(today) > policy_period
