"""Generate gpujobs' catalog of instance types from EC2's own data, as moto bundles it.

`layers/gpujobs/gpujobs/data/instance_types.json` is what `gpujobs validate`, the launcher's EFA and
instance-store decisions and the cost estimates read about an instance type: GPUs, their model and
memory, vCPUs, memory, EFA interfaces, network cards, instance store, architectures, and per region
the zones that offer it. Nobody types it: this script writes it from moto's copy of EC2's
DescribeInstanceTypes (`moto/ec2/resources/instance_types.json.gz`) and DescribeInstanceTypeOfferings
(`moto/ec2/resources/instance_type_offerings/availability-zone/<region>.json.gz`, checked against
`.../region/<region>.json.gz`), for every type with GPUs (`GpuInfo`) and every type the price table
(`ondemand_prices.json`) names, so a CPU type priced for smoke jobs (c7i.large) is catalogued too.
No network is needed; moto is a dev dependency.

The output is deterministic (sorted keys, no timestamp): the same moto release gives the same bytes,
so `--check` (and tests/unit/test_instance_catalog_is_ec2s_data.py) fails when the file was edited by
hand or moto's data moved on. Upgrading moto and running this script is how the catalog is refreshed.

    .venv/bin/python scripts/generate_catalog.py          # rewrite the bundled file
    .venv/bin/python scripts/generate_catalog.py --check  # exit 1 when it differs from what this writes
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Iterable, Mapping
from importlib import metadata, resources
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "layers" / "gpujobs" / "gpujobs" / "data"
OUTPUT = DATA / "instance_types.json"
PRICES = DATA / "ondemand_prices.json"
GENERATED_BY = "scripts/generate_catalog.py"
NOTE = (
    "Generated, never edited by hand: run `python scripts/generate_catalog.py` (moto's data moves with moto's "
    "release; `--check` says when this file is stale). Per type: `gpus` is the GPUs the instance shows its OS "
    "(a fractional type, `gpu_partition` < 1, shows one), `gpu_memory_mib` their total memory, `efa_interfaces` "
    "NetworkInfo.EfaInfo.MaximumEfaInterfaces (0: no EFA), `instance_store_gb` the NVMe instance store (0: none), "
    "`network_gbps` the sum of its network cards' BaselineBandwidthInGbps. "
    "`zones`: per region, the availability zones DescribeInstanceTypeOfferings listed for the type; the launcher "
    "asks EC2 itself at run time and falls back to these. Prices are not here: ondemand_prices.json."
)


def moto_resources() -> Any:
    """moto's EC2 data folder (a Traversable), found through the installed package, not a path."""
    return resources.files("moto").joinpath("ec2", "resources")


def read_gz_json(path: Any) -> Any:
    return json.loads(gzip.decompress(path.read_bytes()))


def priced_types(prices: Path = PRICES) -> list[str]:
    return sorted(json.loads(prices.read_text(encoding="utf-8"))["prices"])


def type_facts(described: Mapping[str, Any]) -> dict[str, Any]:
    """One DescribeInstanceTypes entry as the catalog keeps it."""
    gpu_info = described.get("GpuInfo") or {}
    gpus = gpu_info.get("Gpus") or []
    network = described["NetworkInfo"]
    facts: dict[str, Any] = {
        "architectures": sorted(described["ProcessorInfo"]["SupportedArchitectures"]),
        "efa_interfaces": int((network.get("EfaInfo") or {}).get("MaximumEfaInterfaces", 0)),
        "gpu_manufacturer": "+".join(sorted({g["Manufacturer"] for g in gpus})) or None,
        "gpu_memory_mib": int(gpu_info.get("TotalGpuMemoryInMiB", 0)),
        "gpu_model": "+".join(sorted({g["Name"] for g in gpus})) or None,
        "gpus": sum(int(g.get("LogicalGpuCount", g["Count"])) for g in gpus),
        "instance_store_gb": int((described.get("InstanceStorageInfo") or {}).get("TotalSizeInGB", 0)),
        "memory_mib": int(described["MemoryInfo"]["SizeInMiB"]),
        "network_cards": int(network.get("MaximumNetworkCards", 1)),
        "network_gbps": round(
            sum(float(c.get("BaselineBandwidthInGbps", 0)) for c in network.get("NetworkCards") or []), 3
        ),
        "vcpus": int(described["VCpuInfo"]["DefaultVCpus"]),
    }
    partition = min((float(g.get("GpuPartitionSize", 1.0)) for g in gpus), default=1.0)
    if partition < 1:
        facts["gpu_partition"] = partition
    return facts


def build_catalog(
    described: Mapping[str, Mapping[str, Any]],
    zone_offerings: Mapping[str, Iterable[Mapping[str, str]]],
    *,
    also: Iterable[str],
    moto_version: str,
) -> dict[str, Any]:
    """The catalog: every type with GPUs plus `also`, each with its facts and its zones per region.

    `described`: DescribeInstanceTypes' entries by type; `zone_offerings`: region ->
    DescribeInstanceTypeOfferings' entries with LocationType availability-zone."""
    wanted = {name for name, entry in described.items() if entry.get("GpuInfo")}
    missing = sorted(set(also) - set(described))
    if missing:
        raise SystemExit(f"EC2's data (moto {moto_version}) describes no {', '.join(missing)}: fix the price table")
    wanted |= set(also)
    zones: dict[str, dict[str, list[str]]] = {name: {} for name in wanted}
    for region, offers in zone_offerings.items():
        for offer in offers:
            if offer["InstanceType"] in wanted:
                zones[offer["InstanceType"]].setdefault(region, []).append(offer["Location"])
    return {
        "generated_by": GENERATED_BY,
        "moto_version": moto_version,
        "note": NOTE,
        "source": (
            f"EC2 DescribeInstanceTypes and DescribeInstanceTypeOfferings (LocationType availability-zone) as "
            f"bundled in moto {moto_version} (moto/ec2/resources/instance_types.json.gz and "
            "instance_type_offerings/availability-zone/<region>.json.gz): every type with GpuInfo, and the "
            "types ondemand_prices.json prices."
        ),
        "types": {name: type_facts(described[name]) for name in sorted(wanted)},
        "zones": {
            name: {region: sorted(set(found)) for region, found in sorted(zones[name].items())}
            for name in sorted(wanted)
        },
    }


def render(catalog: Mapping[str, Any]) -> str:
    """Sorted keys, one type per line (a diff shows which types changed), compact zone lists."""
    lines = ["{"]
    head = [key for key in sorted(catalog) if key not in ("types", "zones")]
    lines += [f"  {json.dumps(key)}: {json.dumps(catalog[key], ensure_ascii=False)}," for key in head]
    for section, separators in (("types", (", ", ": ")), ("zones", (",", ":"))):
        entries = catalog[section]
        lines.append(f'  "{section}": {{')
        rows = [
            f"    {json.dumps(name)}: {json.dumps(entries[name], sort_keys=True, separators=separators)}"
            for name in sorted(entries)
        ]
        lines.append(",\n".join(rows))
        lines.append("  }," if section == "types" else "  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def offerings_by_region(folder: Any) -> dict[str, Any]:
    """Region -> DescribeInstanceTypeOfferings' entries, from one of moto's `instance_type_offerings` folders."""
    return {
        item.name.removesuffix(".json.gz"): read_gz_json(item)
        for item in sorted(folder.iterdir(), key=lambda item: item.name)
        if item.name.endswith(".json.gz")
    }


def check_regions_agree(catalog: Mapping[str, Any], by_region: Mapping[str, Iterable[Mapping[str, str]]]) -> None:
    """The regions each type has zones in are those the LocationType `region` listing names: else
    the zone listing lost a region, and an empty zone list would read as "not offered there"."""
    for name, regions in catalog["zones"].items():
        listed = {region for region, offers in by_region.items() if any(o["InstanceType"] == name for o in offers)}
        if listed != set(regions):
            raise SystemExit(f"{name}: offered in {sorted(listed)} by region, zones only in {sorted(regions)}")


def generate(*, prices: Path = PRICES) -> str:
    """The file's text, from the installed moto's data and the price table."""
    data = moto_resources()
    described = read_gz_json(data.joinpath("instance_types.json.gz"))
    folders = data.joinpath("instance_type_offerings")
    by_zone = offerings_by_region(folders.joinpath("availability-zone"))
    catalog = build_catalog(described, by_zone, also=priced_types(prices), moto_version=metadata.version("moto"))
    check_regions_agree(catalog, offerings_by_region(folders.joinpath("region")))
    return render(catalog)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None,
        epilog=f"writes {OUTPUT.relative_to(ROOT)} from moto {metadata.version('moto')}'s copy of EC2's data",
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 when the bundled file differs from what it would be"
    )
    parser.add_argument("--output", type=Path, default=OUTPUT, help=f"where to write (default: {OUTPUT.name})")
    args = parser.parse_args(argv)
    text = generate()
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(
                f"{args.output}: differs from what moto {metadata.version('moto')}'s data gives; "
                f"run python {GENERATED_BY}",
                file=sys.stderr,
            )
            return 1
        print(f"{args.output}: up to date (moto {metadata.version('moto')})")
        return 0
    args.output.write_text(text, encoding="utf-8")
    catalog = json.loads(text)
    print(f"wrote {args.output}: {len(catalog['types'])} types, {len(text.encode())} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
