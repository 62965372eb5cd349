"""Budget alerts, read as data: which budget overspent, and what mode follows.

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
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date
from decimal import Decimal, InvalidOperation
from typing import Literal

from gpujobs.domain.budget import BudgetMode

AlertType = Literal["ACTUAL", "FORECASTED"]

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


# ---- what mode follows ---------------------------------------------------------------------


def decide_budget_mode(alert: BudgetAlert) -> tuple[BudgetMode, str]:
    """HOLD for money already spent, SPOT_ONLY for money forecast to be spent; with a short reason."""
    mode = BudgetMode.HOLD if alert.alert_type == "ACTUAL" else BudgetMode.SPOT_ONLY
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
