"""AWS's Price List Query API for moto, which implements none of it (its server answers 500, which
botocore retries for seconds on the reconciler's first cost check).

Answered through a botocore hook, in the Price List's shape (`PriceList`: a JSON document per
product, the hourly USD price under `terms.OnDemand.*.priceDimensions.*`): a request for one
`instanceType` in this region gets the packaged table's us-east-1 list price, the only prices the
local cloud knows; a type the table lacks, or another region, gets no product.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpujobs.adapters.catalog import on_demand_prices
from gpujobs_local.placement_groups import PARAMS_KEY, Hook, keep_params, ok


@dataclass
class PriceList:
    region: str
    asked: int = 0

    def install(self, register: Callable[[str, Hook], None]) -> None:
        register("before-parameter-build.pricing.GetProducts", keep_params)
        register("before-call.pricing.GetProducts", self._products)

    def _products(self, context: dict[str, Any], **_: Any) -> tuple[Any, dict[str, Any]]:
        self.asked += 1
        matches = {f["Field"]: f["Value"] for f in context[PARAMS_KEY].get("Filters", [])}
        instance_type, region = matches.get("instanceType"), matches.get("regionCode", self.region)
        price = on_demand_prices().get(instance_type or "") if region == self.region else None
        documents = [] if price is None or instance_type is None else [_document(instance_type, region, price)]
        return ok({"FormatVersion": "aws_v1", "PriceList": documents})


def _document(instance_type: str, region: str, usd: float) -> str:
    sku, term, rate = f"LOCAL{instance_type}", "JRTCKXETXF", "6YS6EN2CT7"
    return json.dumps(
        {
            "product": {
                "productFamily": "Compute Instance",
                "sku": sku,
                "attributes": {
                    "instanceType": instance_type,
                    "regionCode": region,
                    "operatingSystem": "Linux",
                    "tenancy": "Shared",
                    "preInstalledSw": "NA",
                    "capacitystatus": "Used",
                },
            },
            "serviceCode": "AmazonEC2",
            "terms": {
                "OnDemand": {
                    f"{sku}.{term}": {
                        "offerTermCode": term,
                        "sku": sku,
                        "priceDimensions": {
                            f"{sku}.{term}.{rate}": {
                                "unit": "Hrs",
                                "pricePerUnit": {"USD": f"{usd:.10f}"},
                                "description": f"${usd} per On Demand Linux {instance_type} Instance Hour",
                            }
                        },
                    }
                }
            },
        }
    )
