"""The catalog of instance types is EC2's own data, regenerated and compared, never typed by hand.

Stories: the bundled `instance_types.json` is byte for byte what `scripts/generate_catalog.py`
writes from the installed moto's copy of DescribeInstanceTypes and DescribeInstanceTypeOfferings (a
hand edit, or a moto upgrade that moved the data, fails here until the script is run); it names
every type EC2 describes with GPUs and every type the price table prices; the facts the launcher
used to read from the hand-written hardware table are the same (p4d.24xlarge: 4 EFA interfaces,
p5.48xlarge: 32, every instance store as it was); `--check` says when the file is stale; and the
file stays small enough for the Lambda layer.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import subprocess
import sys
from importlib import metadata, resources
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gpujobs.adapters.catalog import on_demand_prices, packaged_catalog, packaged_hardware, packaged_offerings

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "generate_catalog.py"
BUNDLED = ROOT / "layers" / "gpujobs" / "gpujobs" / "data" / "instance_types.json"

FORMER_HARDWARE_TABLE = {  # instance_hardware.json as it was typed by hand, before it was generated
    "c7i.large": (0, 0),
    "g4dn.xlarge": (0, 125),
    "g5.12xlarge": (1, 3800),
    "g5.2xlarge": (0, 450),
    "g5.48xlarge": (1, 7600),
    "g5.xlarge": (0, 250),
    "g6.12xlarge": (1, 3760),
    "g6.xlarge": (0, 250),
    "g6e.xlarge": (0, 250),
    "p4d.24xlarge": (4, 8000),
    "p5.48xlarge": (32, 30400),
}
"""Type -> (EFA interfaces, instance store GB)."""


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate_catalog", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def moto_instance_types() -> dict[str, Any]:
    data = resources.files("moto").joinpath("ec2", "resources", "instance_types.json.gz").read_bytes()
    return dict(json.loads(gzip.decompress(data)))


def test_the_bundled_catalog_is_exactly_what_the_generator_writes_from_ec2s_data() -> None:
    regenerated = generator().generate()

    assert BUNDLED.read_text(encoding="utf-8") == regenerated, (
        "instance_types.json differs from EC2's data as moto ships it: run python scripts/generate_catalog.py"
    )
    assert json.loads(regenerated)["moto_version"] == metadata.version("moto")


def test_it_names_every_type_ec2_describes_with_gpus_and_every_priced_type() -> None:
    described = moto_instance_types()
    with_gpus = {name for name, entry in described.items() if entry.get("GpuInfo")}

    assert set(packaged_catalog()) == with_gpus | set(on_demand_prices())
    for name in ("p4de.24xlarge", "p5e.48xlarge", "p5en.48xlarge", "p6-b200.48xlarge", "g6e.12xlarge", "g5.24xlarge"):
        assert name in packaged_catalog()


def test_the_facts_the_launcher_read_from_the_hand_written_table_are_unchanged() -> None:
    hardware = packaged_hardware()

    assert hardware["p4d.24xlarge"].efa_interfaces == 4
    assert hardware["p5.48xlarge"].efa_interfaces == 32
    assert {
        name: (hardware[name].efa_interfaces, hardware[name].instance_store_gb) for name in FORMER_HARDWARE_TABLE
    } == (FORMER_HARDWARE_TABLE)


def test_each_type_carries_what_ec2_says_of_it() -> None:
    b200 = packaged_catalog()["p6-b200.48xlarge"]
    fractional = packaged_catalog()["g6f.large"]

    assert (b200.gpus, b200.gpu_model, b200.gpu_manufacturer, b200.vcpus, b200.architectures) == (
        8,
        "B200",
        "NVIDIA",
        192,
        ("x86_64",),
    )
    assert (b200.efa_interfaces, b200.network_cards, b200.instance_store_gb) == (8, 8, 30400)
    assert b200.gpu_memory_mib == 8 * 183359
    assert (fractional.gpus, fractional.gpu_partition) == (1, 0.125)  # one eighth of an L4, seen as one GPU
    assert packaged_catalog()["g5g.xlarge"].architectures == ("arm64",)


def test_it_holds_the_zones_offering_each_type_per_region() -> None:
    offerings = packaged_offerings()

    assert offerings["p5e.48xlarge"].get("us-east-1", frozenset()) == frozenset()
    assert offerings["p5e.48xlarge"]["us-east-2"] == {"us-east-2a", "us-east-2b", "us-east-2c"}
    assert "us-east-1a" in offerings["g5.xlarge"]["us-east-1"]


def test_check_fails_on_a_hand_edited_copy_and_passes_on_the_generated_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = generator()
    edited = tmp_path / "instance_types.json"
    edited.write_text(BUNDLED.read_text(encoding="utf-8").replace('"gpus": 8', '"gpus": 16', 1), encoding="utf-8")

    stale = script.main(["--check", "--output", str(edited)])
    stale_err = capsys.readouterr().err
    fresh = script.main(["--check", "--output", str(BUNDLED)])

    assert stale == 1
    assert "run python scripts/generate_catalog.py" in stale_err
    assert fresh == 0


def test_the_script_explains_itself() -> None:
    shown = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, check=True, timeout=60
    ).stdout

    assert "--check" in shown
    assert "instance_types.json" in shown


def test_the_catalog_stays_small_enough_for_the_lambda_layer() -> None:
    assert BUNDLED.stat().st_size < 128 * 1024
