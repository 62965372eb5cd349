"""Cost caps err high: a type missing from the price table is never counted as free.

Stories: a missing type counts at the highest known price of its family, else at the highest known
price of all; with nothing known at all there is no guess; and a spec whose `max_cost_usd` covers
a type without a known price is refused with a reason naming the field. With the catalog's sizes,
a known price is scaled up by how much more the missing type holds, so a bigger size or a newer
family (p6-b200, p5en) is not counted at a smaller type's price: taking out any priced type, the
estimate for it from the others is never below its real price.
"""

from __future__ import annotations

import pytest

from gpujobs.adapters.catalog import instance_sizes, on_demand_prices
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


def test_a_bigger_size_of_a_family_priced_only_small_counts_as_bigger() -> None:
    known = on_demand_prices()

    plain = price_erring_high("g6e.12xlarge", known)
    scaled = price_erring_high("g6e.12xlarge", known, sizes=instance_sizes())

    assert plain == known["g6e.xlarge"]  # the family's only price: a twelfth of the vCPUs and memory
    assert scaled == pytest.approx(12 * known["g6e.xlarge"])


def test_a_new_family_counts_at_least_as_the_dearest_type_scaled_by_what_it_holds_more() -> None:
    known, sizes = on_demand_prices(), instance_sizes()

    b200 = price_erring_high("p6-b200.48xlarge", known, sizes=sizes)
    p5en = price_erring_high("p5en.48xlarge", known, sizes=sizes)

    assert price_erring_high("p6-b200.48xlarge", known) == known["p5.48xlarge"]  # unscaled: the dearest type
    assert b200 >= known["p5.48xlarge"] * sizes["p6-b200.48xlarge"].gpu_memory_mib / sizes["p5.48xlarge"].gpu_memory_mib
    assert p5en > known["p5.48xlarge"]


@pytest.mark.parametrize("instance_type", sorted(on_demand_prices()))
def test_a_priced_type_taken_out_is_estimated_at_no_less_than_its_price(instance_type: str) -> None:
    known = on_demand_prices()
    others = {name: price for name, price in known.items() if name != instance_type}

    assert price_erring_high(instance_type, others, sizes=instance_sizes()) >= known[instance_type]
