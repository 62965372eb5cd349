"""On-demand prices from AWS's Price List (`adapters.price_list`): one request per type, checked
against botocore's own model of GetProducts; the highest hourly price of the products that match;
answers fresh for a day; while a price is unconfirmed (no answer, a failed ask, a type not listed)
it errs high: the higher of the last answer and the packaged us-east-1 price, marked up outside
us-east-1; a failed ask is not repeated for an hour, and nothing raises."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError
from botocore.validate import validate_parameters

from gpujobs.adapters.price_list import (
    PRICE_LIST_TTL,
    RETRY_AFTER,
    UNCONFIRMED_MARKUP,
    PriceListOnDemand,
    price_list_region,
)
from gpujobs.adapters.prices import Ec2Prices
from gpujobs.domain.job import Market
from gpujobs_fakes.memory import FixedClock

_MODEL = boto3.session.Session().client("pricing", region_name="us-east-1").meta.service_model
PACKAGED = {"g5.xlarge": 1.006, "g6.xlarge": 0.8048}


def product(instance_type: str, *usd: str, unit: str = "Hrs") -> str:
    """A Price List product document as GetProducts returns it (a JSON string)."""
    sku = f"SKU{instance_type}{'-'.join(usd)}"
    dimensions = {f"{sku}.T.R{i}": {"unit": unit, "pricePerUnit": {"USD": price}} for i, price in enumerate(usd)}
    return json.dumps(
        {
            "product": {"sku": sku, "attributes": {"instanceType": instance_type, "regionCode": "eu-west-1"}},
            "terms": {"OnDemand": {f"{sku}.T": {"priceDimensions": dimensions}}},
        }
    )


class FakePricing:
    """GetProducts from `products` (type -> documents), a page at a time, each request validated
    against botocore's model; `fail` makes the next calls raise it."""

    def __init__(self, products: dict[str, list[str]]) -> None:
        self.products = products
        self.requests: list[dict[str, Any]] = []
        self.fail: Exception | None = None

    def get_products(self, **request: Any) -> dict[str, Any]:
        validate_parameters(request, _MODEL.operation_model("GetProducts").input_shape)
        self.requests.append(request)
        if self.fail is not None:
            raise self.fail
        wanted = {f["Field"]: f["Value"] for f in request["Filters"]}
        documents = self.products.get(wanted["instanceType"], [])
        start = int(request.get("NextToken", "0"))
        page: dict[str, Any] = {"FormatVersion": "aws_v1", "PriceList": documents[start : start + 1]}
        if start + 1 < len(documents):
            page["NextToken"] = str(start + 1)
        return page


class NoSpotPrices:
    """EC2 knowing no spot price for any pool."""

    def describe_spot_price_history(self, **_: Any) -> dict[str, Any]:
        return {"SpotPriceHistory": []}


class SpotPrices:
    """EC2 knowing one spot price for every pool."""

    def __init__(self, usd: str) -> None:
        self.usd = usd

    def describe_spot_price_history(self, **_: Any) -> dict[str, Any]:
        return {"SpotPriceHistory": [{"SpotPrice": self.usd}]}


def prices(pricing: FakePricing, region: str = "eu-west-1", clock: FixedClock | None = None) -> PriceListOnDemand:
    return PriceListOnDemand(client=pricing, region=region, clock=clock or FixedClock(), packaged=lambda: PACKAGED)


def test_the_price_is_the_stack_regions_highest_hourly_price_of_the_matching_products() -> None:
    pricing = FakePricing({"g5.xlarge": [product("g5.xlarge", "1.2120000000"), product("g5.xlarge", "1.3", "0")]})

    assert prices(pricing).usd("g5.xlarge") == 1.3

    first = pricing.requests[0]
    assert first["ServiceCode"] == "AmazonEC2"
    filters = {f["Field"]: (f["Type"], f["Value"]) for f in first["Filters"]}
    assert filters["instanceType"] == ("TERM_MATCH", "g5.xlarge")
    assert filters["regionCode"] == ("TERM_MATCH", "eu-west-1")
    assert filters["operatingSystem"] == ("TERM_MATCH", "Linux")
    assert filters["tenancy"] == ("TERM_MATCH", "Shared")
    assert filters["preInstalledSw"] == ("TERM_MATCH", "NA")
    assert filters["capacitystatus"] == ("TERM_MATCH", "Used")
    assert len(pricing.requests) == 2  # two products, a page each: the second page was asked for


def test_an_answer_is_kept_a_day_then_asked_again() -> None:
    pricing = FakePricing({"g5.xlarge": [product("g5.xlarge", "1.212")]})
    clock = FixedClock()
    source = prices(pricing, clock=clock)
    assert source.usd("g5.xlarge") == 1.212

    clock.advance(seconds=PRICE_LIST_TTL.total_seconds() - 1)
    pricing.products = {"g5.xlarge": [product("g5.xlarge", "1.1")]}
    assert source.usd("g5.xlarge") == 1.212
    assert len(pricing.requests) == 1
    clock.advance(seconds=1)
    assert source.usd("g5.xlarge") == 1.1


@pytest.mark.parametrize(
    "failure",
    [
        ClientError({"Error": {"Code": "ThrottlingException", "Message": "slow"}}, "GetProducts"),
        ClientError({"Error": {"Code": "AccessDeniedException", "Message": "no"}}, "GetProducts"),
        EndpointConnectionError(endpoint_url="https://api.pricing.us-east-1.amazonaws.com"),
    ],
)
def test_without_an_answer_a_price_errs_high_and_the_price_list_is_not_asked_again_for_an_hour(
    failure: Exception,
) -> None:
    pricing = FakePricing({})
    pricing.fail = failure
    clock = FixedClock()
    abroad, home = prices(pricing, "eu-west-1", clock), prices(pricing, "us-east-1", clock)

    assert abroad.usd("g5.xlarge") == pytest.approx(1.006 * UNCONFIRMED_MARKUP)  # us-east-1's price, marked up
    assert home.usd("g5.xlarge") == 1.006  # the table's own region: its price as is
    assert abroad.usd("p5.48xlarge") is None  # nothing known: the caller errs high by family (domain.cost)
    asked = len(pricing.requests)

    clock.advance(seconds=RETRY_AFTER.total_seconds() - 1)
    assert abroad.usd("g5.xlarge") == pytest.approx(1.509)
    assert len(pricing.requests) == asked
    clock.advance(seconds=1)
    pricing.fail = None
    pricing.products = {"g5.xlarge": [product("g5.xlarge", "1.212")]}
    assert abroad.usd("g5.xlarge") == 1.212


def test_a_stale_answer_counts_at_the_higher_of_itself_and_the_marked_up_table() -> None:
    pricing = FakePricing({"g5.xlarge": [product("g5.xlarge", "1.9")], "g6.xlarge": [product("g6.xlarge", "0.9")]})
    clock = FixedClock()
    source = prices(pricing, clock=clock)
    assert (source.usd("g5.xlarge"), source.usd("g6.xlarge")) == (1.9, 0.9)

    clock.advance(seconds=PRICE_LIST_TTL.total_seconds())
    pricing.fail = ClientError({"Error": {"Code": "ServiceUnavailableException", "Message": "x"}}, "GetProducts")
    assert source.usd("g5.xlarge") == 1.9  # above 1.006 x 1.5
    assert source.usd("g6.xlarge") == pytest.approx(0.8048 * UNCONFIRMED_MARKUP)  # above 0.9


def test_a_type_the_price_list_does_not_list_here_is_unconfirmed() -> None:
    pricing = FakePricing({"g6.xlarge": [product("g5.xlarge", "9.0"), product("g6.xlarge", "0.5", unit="Quantity")]})
    source = prices(pricing, "us-east-1")

    assert source.usd("g6.xlarge") == 0.8048  # another type's document and a non-hourly price are not its price
    assert source.usd("g4dn.xlarge") is None


def test_the_table_answers_without_asking_the_price_lists_answers_first_and_marks_nothing_up() -> None:
    """The table is the best estimate (what a job cost its team); only a cap's price errs high."""
    pricing = FakePricing({"g5.xlarge": [product("g5.xlarge", "1.212")], "p5.48xlarge": [product("p5.48xlarge", "60")]})
    source = prices(pricing)
    assert source.table() == PACKAGED
    assert pricing.requests == []

    source.usd("g5.xlarge")
    source.usd("p5.48xlarge")
    assert source.table() == {"g5.xlarge": 1.212, "g6.xlarge": 0.8048, "p5.48xlarge": 60.0}


def test_the_cost_caps_price_on_demand_from_the_price_list_and_spot_falls_back_to_it() -> None:
    pricing = FakePricing({"g5.xlarge": [product("g5.xlarge", "1.212")]})
    both = Ec2Prices(client=NoSpotPrices(), clock=FixedClock(), on_demand=prices(pricing))  # type: ignore[arg-type]

    assert both.hourly_usd(instance_type="g5.xlarge", market=Market.ON_DEMAND, zone=None) == 1.212
    assert both.hourly_usd(instance_type="g5.xlarge", market=Market.SPOT, zone="eu-west-1a") == 1.212
    assert both.on_demand_table["g5.xlarge"] == 1.212


def test_a_spot_pool_with_a_spot_price_does_not_ask_the_price_list() -> None:
    pricing = FakePricing({"g5.xlarge": [product("g5.xlarge", "1.212")]})
    spot = Ec2Prices(client=SpotPrices("0.39"), clock=FixedClock(), on_demand=prices(pricing))  # type: ignore[arg-type]

    assert spot.hourly_usd(instance_type="g5.xlarge", market=Market.SPOT, zone="eu-west-1a") == 0.39
    assert pricing.requests == []
    assert spot.hourly_usd(instance_type="g5.xlarge", market=Market.ON_DEMAND, zone="eu-west-1a") == 1.212
    assert len(pricing.requests) == 1


@pytest.mark.parametrize(
    ("region", "endpoint"),
    [
        ("us-west-2", "us-east-1"),
        ("eu-west-1", "eu-central-1"),
        ("ap-northeast-1", "ap-south-1"),
        ("sa-east-1", "us-east-1"),
    ],
)
def test_the_price_list_is_asked_at_the_endpoint_nearest_the_stack(region: str, endpoint: str) -> None:
    assert price_list_region(region) == endpoint
    assert endpoint in boto3.session.Session().get_available_regions("pricing")
