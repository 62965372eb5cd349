"""Budget alerts arrive as plain English over SNS: read what AWS wrote, and never guess a breach.

Cost anomalies arrive as JSON over EventBridge; budget modes follow from the alert type and lapse
when the monthly period rolls over.
"""

from __future__ import annotations

import json
from datetime import date
from decimal import Decimal

import pytest
from pydantic import ValidationError

from gpujobs.adapters.inbound_anomaly import AnomalyDetail
from gpujobs.domain.budget import period_of, period_rolled_over, scope_of_budget
from gpujobs.domain.budget_alerts import BudgetAlert, UnparsedAlert, decide_budget_mode, parse_budget_notification
from gpujobs.domain.cost_anomaly import anomaly_is_significant, anomaly_reason

SUBJECT = "AWS Budgets: Test Budget has exceeded your alert threshold"
# The SNS Message of the real notification in aws-contracts.md §1.6, verbatim.
EXAMPLE = (
    "AWS Budget Notification September 26, 2022\nAWS Account 017790921725\n\nDear AWS Customer,\n\n"
    "You requested that we alert you when the ACTUAL Cost associated with your Test Budget budget is greater than "
    "$0.16 for the current month. The ACTUAL Cost associated with this budget is $0.59. You can find additional "
    "details below and by accessing the AWS Budgets dashboard [1].\n\nBudget Name: Test Budget\nBudget Type: Cost\n"
    "Budgeted Amount: $0.20\nAlert Type: ACTUAL\nAlert Threshold: > $0.16\nACTUAL Amount: $0.59\n\n"
    "[1] https://console.aws.amazon.com/billing/home#/budgets\n"
)


def notification(
    *,
    name: str = "gpujobs-prod-all",
    alert_type: str = "ACTUAL",
    budgeted: str = "$1,000.00",
    threshold: str = "> $800.00",
    amount: str = "$850.00",
    period: str = "for the current month",
) -> str:
    return (
        "AWS Budget Notification November 3, 2026\nAWS Account 123456789012\n\nDear AWS Customer,\n\n"
        f"You requested that we alert you when the {alert_type} Cost associated with your {name} budget is "
        f"greater than {threshold.lstrip('> ')} {period}. The {alert_type} Cost associated with this budget is "
        f"{amount}.\n\nBudget Name: {name}\nBudget Type: Cost\nBudgeted Amount: {budgeted}\n"
        f"Alert Type: {alert_type}\nAlert Threshold: {threshold}\n{alert_type} Amount: {amount}\n\n"
        "[1] https://console.aws.amazon.com/billing/home#/budgets\n"
    )


def parsed(subject: str | None, message: str) -> BudgetAlert:
    result = parse_budget_notification(subject, message)
    assert isinstance(result, BudgetAlert), result
    return result


# ---- what AWS writes is read -------------------------------------------------------------


def test_the_documented_example_is_an_actual_breach_of_test_budget() -> None:
    alert = parsed(SUBJECT, EXAMPLE)

    assert alert == BudgetAlert(
        budget_name="Test Budget",
        alert_type="ACTUAL",
        threshold_text="> $0.16",
        threshold_percent=None,
        threshold_amount=Decimal("0.16"),
        amount=Decimal("0.59"),
        budgeted_amount=Decimal("0.20"),
        currency="$",
        budget_type="Cost",
        notified_on=date(2022, 9, 26),
    )


def test_the_header_alone_is_enough_anchor_when_the_subject_is_lost() -> None:
    assert parsed(None, EXAMPLE).amount == Decimal("0.59")


def test_the_subject_alone_is_enough_anchor_when_the_header_is_missing() -> None:
    body = EXAMPLE.split("\n", 1)[1]

    alert = parsed(SUBJECT, body)

    assert alert.budget_name == "Test Budget"
    assert alert.notified_on is None


def test_a_forecasted_alert_reads_the_forecasted_amount() -> None:
    alert = parsed(None, notification(alert_type="FORECASTED", amount="$1,200.00"))

    assert alert.alert_type == "FORECASTED"
    assert alert.amount == Decimal("1200.00")


@pytest.mark.parametrize(
    ("threshold", "percent", "threshold_amount"),
    [
        pytest.param("> 80.0%", 80.0, None, id="percent"),
        pytest.param("> $800.00 (80.0% of your budget)", 80.0, Decimal("800.00"), id="amount-with-percent-of-budget"),
        pytest.param("> 80% ($800.00)", 80.0, Decimal("800.00"), id="percent-with-amount"),
        pytest.param(">= $800.00", None, Decimal("800.00"), id="greater-or-equal"),
    ],
)
def test_threshold_variants_keep_the_percent_and_the_amount(
    threshold: str, percent: float | None, threshold_amount: Decimal | None
) -> None:
    alert = parsed(None, notification(threshold=threshold))

    assert alert.threshold_percent == percent
    assert alert.threshold_amount == threshold_amount
    assert alert.threshold_text == threshold


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        pytest.param(
            notification(period="per day", threshold="> $40.00 per day", budgeted="$50.00 per day", amount="$45.10"),
            (Decimal("45.10"), Decimal("40.00"), Decimal("50.00"), "$"),
            id="daily-budget-per-day",
        ),
        pytest.param(
            notification(budgeted="$12,345.67", threshold="> $10,000", amount="$1,234,567.89"),
            (Decimal("1234567.89"), Decimal("10000"), Decimal("12345.67"), "$"),
            id="thousands-separators",
        ),
        pytest.param(
            notification().replace("\n", "\r\n"),
            (Decimal("850.00"), Decimal("800.00"), Decimal("1000.00"), "$"),
            id="crlf",
        ),
        pytest.param(
            notification().replace("\n", "\r"),
            (Decimal("850.00"), Decimal("800.00"), Decimal("1000.00"), "$"),
            id="bare-cr",
        ),
        pytest.param(
            notification()
            .replace("Budget Name: ", "   Budget  Name :\t ")
            .replace("Alert Threshold: > ", "Alert Threshold:   >    ")
            .replace("ACTUAL Amount: $850.00", "\tACTUAL Amount:  $850.00   "),
            (Decimal("850.00"), Decimal("800.00"), Decimal("1000.00"), "$"),
            id="extra-whitespace",
        ),
        pytest.param(
            notification().replace("Alert Type: ACTUAL", "alert type: actual"),
            (Decimal("850.00"), Decimal("800.00"), Decimal("1000.00"), "$"),
            id="lower-case",
        ),
        pytest.param(
            notification(budgeted="€1,000.00", threshold="> €800.00", amount="€850.50"),
            (Decimal("850.50"), Decimal("800.00"), Decimal("1000.00"), "€"),
            id="euro-symbol",
        ),
        pytest.param(
            notification(budgeted="1,000.00 EUR", threshold="> 800.00 EUR", amount="850.00 EUR"),
            (Decimal("850.00"), Decimal("800.00"), Decimal("1000.00"), "EUR"),
            id="iso-code-after",
        ),
    ],
)
def test_wording_and_layout_variants_parse_to_the_same_numbers(
    message: str, expected: tuple[Decimal, Decimal, Decimal, str]
) -> None:
    alert = parsed(None, message)

    assert (alert.amount, alert.threshold_amount, alert.budgeted_amount, alert.currency) == expected
    assert alert.budget_name == "gpujobs-prod-all"
    assert alert.alert_type == "ACTUAL"


def test_whitespace_inside_the_threshold_is_collapsed() -> None:
    message = notification().replace("Alert Threshold: > $800.00", "Alert Threshold:   >    $800.00  ")

    assert parsed(None, message).threshold_text == "> $800.00"


def test_an_alert_without_amount_lines_still_names_the_breach() -> None:
    message = notification().replace("Budgeted Amount: $1,000.00\n", "").replace("ACTUAL Amount: $850.00\n", "")

    alert = parsed(None, message)

    assert (alert.amount, alert.budgeted_amount, alert.threshold_amount) == (None, None, Decimal("800.00"))


def test_an_odd_notification_date_is_dropped_not_fatal() -> None:
    message = notification().replace("November 3, 2026", "Smarch 41, 2026")

    assert parsed(None, message).notified_on is None


# ---- what cannot be read is never a breach ------------------------------------------------

CLOUDWATCH_ALARM_SNS = json.dumps(
    {
        "AlarmName": "gpu-idle",
        "NewStateValue": "ALARM",
        "NewStateReason": "Threshold Crossed",
        "Trigger": {"MetricName": "nvidia_smi_utilization_gpu", "Namespace": "CWAgent", "Dimensions": []},
    }
)
HTML_EMAIL = (
    "<html><body><h1>AWS Budget Notification September 26, 2022</h1>"
    "<table><tr><td>Budget Name:</td><td>Test Budget</td></tr>"
    "<tr><td>Alert Type:</td><td>ACTUAL</td></tr></table></body></html>"
)


@pytest.mark.parametrize(
    ("subject", "message", "reason_names"),
    [
        pytest.param(None, "", "AWS Budget Notification", id="empty"),
        pytest.param(SUBJECT, "", "Budget Name", id="subject-only"),
        pytest.param("hello", "Just a note on the topic, nothing to see.", "AWS Budget Notification", id="random-sns"),
        pytest.param("ALARM: gpu-idle", CLOUDWATCH_ALARM_SNS, "AWS Budget Notification", id="cloudwatch-alarm-json"),
        pytest.param(None, HTML_EMAIL, "AWS Budget Notification", id="html-email"),
        pytest.param(SUBJECT, HTML_EMAIL, "Budget Name", id="html-email-with-subject"),
        pytest.param(None, notification().replace("Alert Type: ACTUAL\n", ""), "Alert Type", id="missing-alert-type"),
        pytest.param(None, notification(alert_type="MAYBE"), "MAYBE", id="unknown-alert-type"),
        pytest.param(None, notification().replace("Budget Name: gpujobs-prod-all\n", ""), "Budget Name", id="no-name"),
        pytest.param(
            None,
            notification().replace("Budget Name: gpujobs-prod-all", "Budget Name:"),
            "Budget Name",
            id="empty-name",
        ),
        pytest.param(None, notification(amount="$abc"), "ACTUAL Amount", id="amount-not-a-number"),
        pytest.param(None, notification(budgeted="1,000.00"), "Budgeted Amount", id="amount-without-currency"),
        pytest.param(None, notification(budgeted="$1.000,00"), "Budgeted Amount", id="european-decimal-comma"),
        pytest.param(None, EXAMPLE[: EXAMPLE.index("Alert Type")], "Alert Type", id="truncated-before-alert-type"),
        pytest.param(
            None, EXAMPLE[: EXAMPLE.index("Alert Threshold") + 12], "Alert Threshold", id="truncated-mid-line"
        ),
        pytest.param(None, notification(threshold="< $800.00"), "greater-than", id="less-than-threshold"),
        pytest.param(None, notification(threshold="> soon"), "Alert Threshold", id="threshold-gibberish"),
        pytest.param(None, notification(threshold="> 80% (90%)"), "Alert Threshold", id="threshold-two-percents"),
        pytest.param(None, notification(threshold="> €800.00"), "currencies", id="mixed-currencies"),
        pytest.param(
            None, notification() + "Budget Name: someone-else\n", "conflicting Budget Name", id="two-budget-names"
        ),
        pytest.param(
            None,
            notification().replace("Budget Name: gpujobs-prod-all", "Budget Name: Test Budget</td>"),
            "Budget Name",
            id="markup-in-name",
        ),
        pytest.param(
            "Re: AWS Budgets: Test Budget has exceeded your alert threshold",
            EXAMPLE.split("\n", 1)[1],
            "AWS Budget Notification",
            id="forwarded-subject-is-no-anchor",
        ),
    ],
)
def test_unreadable_text_is_unparsed_with_a_reason_and_never_a_breach(
    subject: str | None, message: str, reason_names: str
) -> None:
    result = parse_budget_notification(subject, message)

    assert isinstance(result, UnparsedAlert)
    assert not isinstance(result, BudgetAlert)
    assert reason_names in result.reason


def test_an_unparsed_alert_carries_an_excerpt_for_the_human() -> None:
    result = parse_budget_notification(None, "line one\r\n   line two\n" + "x" * 1000)

    assert isinstance(result, UnparsedAlert)
    assert result.excerpt.startswith("line one line two x")
    assert len(result.excerpt) == 200


def test_the_parser_does_not_raise_even_on_text_of_the_wrong_type() -> None:
    for message in (None, b"AWS Budget Notification", 42):
        result = parse_budget_notification(None, message)  # type: ignore[arg-type]

        assert isinstance(result, UnparsedAlert)


# ---- whose budget it is --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("budget_name", "scope"),
    [
        pytest.param("gpujobs-prod-all", "all", id="stack-wide"),
        pytest.param("gpujobs-prod-team-vision", "vision", id="team"),
        pytest.param("gpujobs-prod-team-nlp-2", "nlp-2", id="team-with-dash-and-digit"),
        pytest.param("gpujobs-prod-team-" + "a" * 63, "a" * 63, id="team-63-chars"),
        pytest.param("Test Budget", None, id="foreign"),
        pytest.param("gpujobs-staging-all", None, id="other-stack"),
        pytest.param("gpujobs-staging-team-vision", None, id="other-stacks-team"),
        pytest.param("gpujobs-prod-team-Vision", None, id="team-upper-case"),
        pytest.param("gpujobs-prod-team-vision_ml", None, id="team-underscore"),
        pytest.param("gpujobs-prod-team-", None, id="team-empty"),
        pytest.param("gpujobs-prod-team-" + "a" * 64, None, id="team-too-long"),
        pytest.param("gpujobs-prod-team-all", None, id="team-called-all"),
        pytest.param("gpujobs-prod-vision", None, id="no-team-prefix"),
        pytest.param("gpujobs-prod-all-extra", None, id="all-with-suffix"),
        pytest.param("xgpujobs-prod-all", None, id="prefix-not-at-start"),
    ],
)
def test_only_this_stacks_budgets_have_a_scope(budget_name: str, scope: str | None) -> None:
    assert scope_of_budget(budget_name, stack_name="prod") == scope


def test_an_empty_stack_name_owns_no_budgets() -> None:
    assert scope_of_budget("gpujobs--all", stack_name="") is None


# ---- what mode follows ---------------------------------------------------------------------


def test_money_already_spent_holds_the_scope() -> None:
    mode, reason = decide_budget_mode(parsed(None, EXAMPLE.replace("Test Budget", "gpujobs-x-all")))

    assert mode == "hold"
    assert reason == "ACTUAL $0.59 > $0.16 (budget gpujobs-x-all)"


def test_money_forecast_to_be_spent_allows_spot_only() -> None:
    alert = parsed(None, notification(alert_type="FORECASTED", threshold="> 80.0%", amount="$1,200.00"))

    mode, reason = decide_budget_mode(alert)

    assert mode == "spot-only"
    assert reason == "FORECASTED $1,200.00 > 80.0% of $1,000.00 (budget gpujobs-prod-all)"


def test_a_reason_in_an_iso_currency_puts_the_code_after_the_amount() -> None:
    alert = parsed(None, notification(budgeted="1,000.00 EUR", threshold="> 800.00 EUR", amount="850.00 EUR"))

    assert decide_budget_mode(alert)[1] == "ACTUAL 850.00 EUR > 800.00 EUR (budget gpujobs-prod-all)"


def test_a_reason_without_an_amount_still_names_threshold_and_budget() -> None:
    alert = parsed(None, notification().replace("ACTUAL Amount: $850.00\n", ""))

    assert decide_budget_mode(alert) == ("hold", "ACTUAL > $800.00 (budget gpujobs-prod-all)")


# ---- cost anomalies ------------------------------------------------------------------------

# aws-contracts.md §1.7's example, with the placeholders filled in and the comments removed.
ANOMALY_EVENT = {
    "version": "0",
    "id": "7bf73129-1428-4cd3-a780-95db273d1602",
    "source": "aws.ce",
    "detail-type": "Anomaly Detected",
    "account": "123456789012",
    "region": "us-east-1",
    "time": "2021-05-25T12:00:00Z",
    "resources": ["arn:aws:ce::123456789012:anomalymonitor/abcdef12-1234-4ea0-84cc-918a97d736ef"],
    "detail": {
        "accountName": "research",
        "anomalyEndDate": "2021-05-25T00:00:00Z",
        "anomalyId": "12345678-abcd-ef12-3456-987654321a12",
        "anomalyScore": {"currentScore": 0.47, "maxScore": 0.47},
        "anomalyStartDate": "2021-05-25T00:00:00Z",
        "dimensionValue": "Amazon Elastic Compute Cloud - Compute",
        "feedback": "string",
        "impact": {
            "maxImpact": 151,
            "totalActualSpend": 1301,
            "totalExpectedSpend": 300,
            "totalImpact": 1001,
            "totalImpactPercentage": 333.67,
        },
        "rootCauses": [
            {
                "linkedAccount": "123456789012",
                "linkedAccountName": "research",
                "region": "us-east-1",
                "service": "Amazon Elastic Compute Cloud - Compute",
                "usageType": "SpotUsage:g5.12xlarge",
                "impact": {"contribution": 601},
            }
        ],
        "accountId": "123456789012",
        "monitorArn": "arn:aws:ce::123456789012:anomalymonitor/abcdef12-1234-4ea0-84cc-918a97d736ef",
        "monitorName": "gpujobs-prod",
        "anomalyDetailsLink": "https://console.aws.amazon.com/cost-management/home#/anomaly-detection/monitors/x/anomalies/y",
    },
}


def anomaly(**impact: float) -> AnomalyDetail:
    detail = json.loads(json.dumps(ANOMALY_EVENT["detail"]))
    detail["impact"].update(impact)
    return AnomalyDetail.model_validate(detail)


def test_the_documented_anomaly_detail_is_read() -> None:
    detail = anomaly()

    assert detail.anomaly_id == "12345678-abcd-ef12-3456-987654321a12"
    assert detail.impact.total_impact == 1001.0
    assert isinstance(detail.impact.total_impact, float)
    assert detail.root_causes[0].usage_type == "SpotUsage:g5.12xlarge"
    assert detail.root_causes[0].impact is not None
    assert detail.root_causes[0].impact.contribution == 601.0
    assert detail.anomaly_start_date is not None
    assert detail.anomaly_start_date.date() == date(2021, 5, 25)
    assert detail.monitor_name == "gpujobs-prod"


def test_an_anomaly_with_only_id_and_impact_and_unknown_fields_is_read() -> None:
    detail = AnomalyDetail.model_validate(
        {"anomalyId": "a-1", "impact": {"totalImpact": "12.5"}, "somethingNew": {"x": 1}}
    )

    assert detail.impact.total_impact == 12.5
    assert detail.root_causes == []
    assert anomaly_reason(detail.cost_anomaly()) == "cost anomaly a-1: $12.50 above expected"


def test_an_anomaly_without_a_total_impact_is_rejected() -> None:
    with pytest.raises(ValidationError):
        AnomalyDetail.model_validate({"anomalyId": "a-1", "impact": {"maxImpact": 151}})


@pytest.mark.parametrize(
    ("total_impact", "minimum", "significant"),
    [
        pytest.param(1001, 100.0, True, id="well-above"),
        pytest.param(100, 100.0, True, id="at-the-minimum"),
        pytest.param(99.99, 100.0, False, id="just-below"),
        pytest.param(1001, 5000.0, False, id="below-a-raised-minimum"),
    ],
)
def test_an_anomaly_is_significant_from_its_total_impact(
    total_impact: float, minimum: float, significant: bool
) -> None:
    assert (
        anomaly_is_significant(anomaly(totalImpact=total_impact).cost_anomaly(), min_total_impact_usd=minimum)
        is significant
    )


def test_an_anomaly_reason_says_how_much_and_where() -> None:
    assert anomaly_reason(anomaly().cost_anomaly()) == (
        "cost anomaly 12345678-abcd-ef12-3456-987654321a12: $1,001.00 above expected (+333.7%); "
        "Amazon Elastic Compute Cloud - Compute / SpotUsage:g5.12xlarge / us-east-1; monitor gpujobs-prod"
    )


# ---- budget periods ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("day", "period"),
    [(date(2026, 11, 30), "2026-11"), (date(2026, 1, 1), "2026-01"), (date(999, 12, 31), "0999-12")],
)
def test_the_budget_period_is_the_calendar_month(day: date, period: str) -> None:
    assert period_of(day) == period


@pytest.mark.parametrize(
    ("policy_period", "today", "rolled"),
    [
        pytest.param("2026-11", date(2026, 11, 30), False, id="same-month"),
        pytest.param("2026-11", date(2026, 12, 1), True, id="next-month"),
        pytest.param("2026-12", date(2027, 1, 1), True, id="next-year"),
        pytest.param("2026-11", date(2026, 10, 31), False, id="clock-behind"),
        pytest.param("", date(2030, 1, 1), False, id="no-period-never-lapses"),
    ],
)
def test_a_policy_lapses_when_the_month_rolls_over(policy_period: str, today: date, rolled: bool) -> None:
    assert period_rolled_over(policy_period, today) is rolled


@pytest.mark.parametrize("bad", ["2026-13", "2026-1", "November", "2026-11-01"])
def test_a_malformed_period_is_an_error_not_a_guess(bad: str) -> None:
    with pytest.raises(ValueError, match="YYYY-MM"):
        period_rolled_over(bad, date(2026, 11, 1))
