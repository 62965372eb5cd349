"""Cost caps err high: a type missing from the price table is never counted as free.

Stories: a missing type counts at the highest known price of its family, else at the highest known
price of all; with nothing known at all there is no guess; and a spec whose `max_cost_usd` covers
a type without a known price is refused with a reason naming the field.
"""

from __future__ import annotations

import pytest

from gpujobs.domain.cost import UnpricedError, price_erring_high
from gpujobs.domain.spec import validate_spec
from gpujobs.domain.spec_errors import SpecError

KNOWN = {"g5.xlarge": 1.006, "g5.2xlarge": 1.212, "p4d.24xlarge": 21.96, "p5.4xlarge": 6.88, "p5e.48xlarge": 70.0}


def test_a_known_type_counts_at_its_own_price() -> None:
    assert price_erring_high("g5.xlarge", KNOWN) == 1.006


def test_a_missing_type_counts_at_the_highest_price_of_its_family() -> None:
    assert price_erring_high("p5.48xlarge", KNOWN) == 6.88  # p5.*, not p5e.*
    assert price_erring_high("g5.48xlarge", KNOWN) == 1.212


def test_a_missing_type_of_an_unknown_family_counts_at_the_highest_known_price() -> None:
    assert price_erring_high("x99.mega", KNOWN) == 70.0


def test_with_no_price_known_at_all_there_is_no_guess() -> None:
    with pytest.raises(UnpricedError):
        price_erring_high("g5.xlarge", {})


SPEC = {"name": "digits", "image": "train:1", "command": ["python", "train.py"]}


def test_a_cost_cap_over_a_type_without_a_known_price_is_refused_naming_the_field() -> None:
    document = {**SPEC, "instance_types": ["g5.xlarge", "p5.48xlarge"], "max_cost_usd": 500}

    with pytest.raises(SpecError) as refused:
        validate_spec(document, priced_instance_types=KNOWN)

    assert len(refused.value.problems) == 1
    problem = refused.value.problems[0]
    assert problem.startswith("max_cost_usd: ")
    assert "p5.48xlarge" in problem
    assert "g5.xlarge" not in problem


def test_a_spec_without_a_cost_cap_or_with_priced_types_is_accepted() -> None:
    uncapped = validate_spec({**SPEC, "instance_types": ["p5.48xlarge"]}, priced_instance_types=KNOWN)
    capped = validate_spec({**SPEC, "instance_types": ["g5.xlarge"], "max_cost_usd": 5}, priced_instance_types=KNOWN)

    assert uncapped.max_cost_usd is None
    assert capped.max_cost_usd == 5
