"""`gpujobs validate` knows every GPU instance type EC2 describes, and says where a type is offered.

Stories, as a user reads them on the terminal, with no AWS reached: a spec on p4de.24xlarge,
p5e.48xlarge, p5en.48xlarge, p6-b200.48xlarge, g6e.12xlarge or g5.24xlarge is valid with all the
GPUs the type has and refused one GPU past them (8 is the spec's own limit); a mistyped type gets the nearest type of the same family
and size (`p6b200.48xlarge` -> `p6-b200.48xlarge`), a family nobody knows gets the list of known
families, never another family's type; with a region (`--region`, `AWS_REGION`,
`AWS_DEFAULT_REGION`) a type no zone there offers is refused naming where it is offered, and
without one nothing is said about regions; `submit` refuses it the same way before anything is sent.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpujobs_cli import commands
from gpujobs_cli.main import main

GPUS = {
    "p4de.24xlarge": 8,
    "p5e.48xlarge": 8,
    "p5en.48xlarge": 8,
    "p6-b200.48xlarge": 8,
    "g6e.12xlarge": 4,
    "g5.24xlarge": 4,
}


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No region configured (each test sets its own) and no AWS reached."""

    def refuse(**kwargs: object) -> None:
        raise AssertionError(f"AWS was contacted: {kwargs}")

    monkeypatch.setattr(commands, "discover", refuse)
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)


def a_spec(tmp_path: Path, *types: str, gpus: int = 1) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(
        f"name: big\nimage: r/t:1\ncommand: [python, train.py]\ngpus_per_node: {gpus}\n"
        f"instance_types: [{', '.join(types)}]\n"
    )
    return str(path)


@pytest.mark.parametrize(("instance_type", "gpus"), sorted(GPUS.items()))
def test_a_gpu_type_ec2_describes_is_valid_with_all_its_gpus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], instance_type: str, gpus: int
) -> None:
    assert main(["validate", a_spec(tmp_path, instance_type, gpus=gpus)]) == 0

    assert capsys.readouterr().out == "ok: big\n"


@pytest.mark.parametrize("instance_type", ["g6e.12xlarge", "g5.24xlarge"])
def test_one_gpu_past_what_the_type_has_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], instance_type: str
) -> None:
    spec = a_spec(tmp_path, instance_type, "p5en.48xlarge", gpus=5)

    assert main(["validate", spec]) == 1

    assert capsys.readouterr().out == f"{spec}: instance_types: gpus_per_node is 5, but {instance_type} has 4\n"


@pytest.mark.parametrize(
    ("typed", "suggestion"),
    [
        ("p5e.48xlarg", "did you mean p5e.48xlarge?"),
        ("g5.24xl", "did you mean g5.24xlarge?"),
        ("p6b200.48xlarge", "did you mean p6-b200.48xlarge?"),
        ("p5en.48", "did you mean p5en.48xlarge?"),
        ("g4d.xlarge", "did you mean g4dn.xlarge?"),
        ("p5.xlarge", "did you mean p5.4xlarge?"),
        ("g7.xlarge", "did you mean g7.2xlarge?"),  # g7 starts at 2xlarge: the smallest, not the nearest spelling
        ("g5.huge", "g5 comes in xlarge, 2xlarge, 4xlarge, 8xlarge, 12xlarge, 16xlarge, 24xlarge, 48xlarge"),
    ],
)
def test_a_mistyped_type_gets_the_nearest_type_of_its_family_and_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], typed: str, suggestion: str
) -> None:
    spec = a_spec(tmp_path, typed)

    assert main(["validate", spec]) == 1

    assert capsys.readouterr().out == (
        f"{spec}: instance_types: {typed} is not an instance type gpujobs knows ({suggestion})\n"
    )


def test_a_family_nobody_knows_gets_the_known_families_never_another_familys_type(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = a_spec(tmp_path, "g9.xlarge")

    assert main(["validate", spec]) == 1

    out = capsys.readouterr().out
    assert out.startswith(f"{spec}: instance_types: g9.xlarge is not an instance type gpujobs knows (nor any g9 type; ")
    assert "known families: c7i, g4dn, g5, g5g, g6, g6e, g6f, g7, g7e, gr6, gr6f, p3dn, p4d, p4de, p5," in out
    assert "did you mean" not in out


def test_a_type_not_offered_in_the_region_given_is_refused_naming_where_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = a_spec(tmp_path, "p5e.48xlarge", "g5.xlarge")

    assert main(["validate", spec, "--region", "us-east-1"]) == 1

    assert capsys.readouterr().out == (
        f"{spec}: instance_types: p5e.48xlarge is not offered in us-east-1 (offered in: us-east-2, us-west-2, "
        "ap-southeast-2, ap-southeast-3, eu-north-1, eu-west-2 and 1 more)\n"
    )


@pytest.mark.parametrize("variable", ["AWS_REGION", "AWS_DEFAULT_REGION"])
def test_the_region_may_come_from_the_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    monkeypatch.setenv(variable, "us-west-1")
    spec = a_spec(tmp_path, "p5e.48xlarge")

    assert main(["validate", spec, "--json"]) == 1

    (result,) = json.loads(capsys.readouterr().out)
    assert result["problems"] == [
        "instance_types: p5e.48xlarge is not offered in us-west-1 (offered in: us-east-2, us-west-2, "
        "ap-southeast-2, ap-southeast-3, eu-north-1, eu-west-2 and 1 more)"
    ]


@pytest.mark.parametrize("region", [None, "us-east-2", "xx-nowhere-1"], ids=["no-region", "offered", "unknown-region"])
def test_without_a_region_offering_nothing_the_type_is_valid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], region: str | None
) -> None:
    spec = a_spec(tmp_path, "p5e.48xlarge")

    assert main(["validate", spec, *(["--region", region] if region else [])]) == 0
    assert capsys.readouterr().out == "ok: big\n"


def test_submit_refuses_a_type_not_offered_in_its_region_before_anything_is_sent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = a_spec(tmp_path, "p5e.48xlarge")

    assert main(["submit", spec, "--region", "us-east-1"]) == 1  # `offline`: nothing was looked up or sent

    assert "p5e.48xlarge is not offered in us-east-1 (offered in: us-east-2," in capsys.readouterr().err
