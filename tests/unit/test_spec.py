"""The job spec as documented: its defaults, its two input formats, its schema, and that what a
user writes in a command or env value reaches the container byte for byte."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from gpujobs.domain.spec import Capacity, IdleAction, IdlePolicy, JobSpec, json_schema, load_spec, parse_document
from gpujobs.domain.spec_errors import SpecError

MINIMAL_YAML = """\
name: digits
image: 123456789012.dkr.ecr.us-east-1.amazonaws.com/gpujobs-train:latest
command: [python, /opt/gpujobs/examples/digits/train.py, --steps, "600"]
instance_types: [g5.xlarge, g6.xlarge]
"""

FULL_YAML = """\
name: digits-2node
image: registry.example.com:5000/ml/train:v1.2@sha256:%s
command:
  - torchrun
  - train.py
env:
  NCCL_DEBUG: WARN
  LR: "0.1"
nodes: 2
gpus_per_node: 4
instance_types: [g5.12xlarge]
capacity: on-demand
max_interruptions: 2
max_attempts: 4
max_runtime_minutes: 600
max_cost_usd: 12.5
checkpoint_every_minutes: 10
idle: {gpu_util_below_percent: 2.5, for_minutes: 15, action: ignore}
team: ml-platform
client_token: nightly-2025-06-01
""" % ("a" * 64)

FULL_JSON = json.dumps(
    {
        "name": "digits-2node",
        "image": "registry.example.com:5000/ml/train:v1.2@sha256:" + "a" * 64,
        "command": ["torchrun", "train.py"],
        "env": {"NCCL_DEBUG": "WARN", "LR": "0.1"},
        "nodes": 2,
        "gpus_per_node": 4,
        "instance_types": ["g5.12xlarge"],
        "capacity": "on-demand",
        "max_interruptions": 2,
        "max_attempts": 4,
        "max_runtime_minutes": 600,
        "max_cost_usd": 12.5,
        "checkpoint_every_minutes": 10,
        "idle": {"gpu_util_below_percent": 2.5, "for_minutes": 15, "action": "ignore"},
        "team": "ml-platform",
        "client_token": "nightly-2025-06-01",
    }
)


def test_a_minimal_spec_gets_the_documented_defaults() -> None:
    spec = load_spec(MINIMAL_YAML)

    assert spec.nodes == 1
    assert spec.gpus_per_node == 1
    assert spec.capacity is Capacity.SPOT_FIRST
    assert spec.max_interruptions == 5
    assert spec.max_attempts == 3
    assert spec.max_runtime_minutes == 1440
    assert spec.max_cost_usd is None
    assert spec.checkpoint_every_minutes == 30
    assert spec.idle == IdlePolicy(gpu_util_below_percent=5, for_minutes=30, action=IdleAction.STOP)
    assert spec.env == {}
    assert spec.team == "default"
    assert spec.client_token is None


def test_numbers_in_command_are_kept_as_the_strings_the_user_wrote() -> None:
    assert load_spec(MINIMAL_YAML).command[-2:] == ["--steps", "600"]


def test_yaml_and_json_of_the_same_job_give_the_same_spec() -> None:
    from_yaml, from_json = load_spec(FULL_YAML), load_spec(FULL_JSON)

    assert from_yaml == from_json
    assert from_yaml.nodes == 2
    assert from_yaml.idle.action is IdleAction.IGNORE


def test_json_is_recognised_even_with_leading_whitespace() -> None:
    assert parse_document("\n  " + FULL_JSON) == json.loads(FULL_JSON)


def test_a_spec_survives_a_round_trip_through_json() -> None:
    spec = load_spec(FULL_YAML)

    assert load_spec(spec.model_dump_json()) == spec


def test_the_schema_is_generated_from_the_model() -> None:
    schema = json_schema()

    assert set(schema["properties"]) == set(JobSpec.model_fields)
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {"name", "image", "command", "instance_types"}
    assert schema["$defs"]["IdlePolicy"]["additionalProperties"] is False
    assert schema["properties"]["nodes"] == {
        "default": 1,
        "description": "instances in the gang",
        "maximum": 64,
        "minimum": 1,
        "title": "Nodes",
        "type": "integer",
    }


def test_the_schema_is_plain_json() -> None:
    assert json.loads(json.dumps(json_schema())) == json_schema()


SHELL_LOOKING = [
    "$(rm -rf /)",
    "`id`",
    'it\'s "quoted"',
    "a; b && c | d > e",
    "${HOME} $PATH",
    "  leading and trailing spaces  ",
    "newline\ninside",
    "unicode: żółw ✓",
    "*.py ~/glob?",
]


@pytest.mark.parametrize("literal", SHELL_LOOKING)
def test_shell_looking_strings_are_preserved_exactly_in_json(literal: str) -> None:
    document = json.dumps(
        {
            "name": "literal",
            "image": "repo/train:1",
            "command": ["python", "-c", literal],
            "env": {"ARG": literal},
            "instance_types": ["g5.xlarge"],
        }
    )

    if "\n" in literal:  # docker's --env-file, the only way env reaches the container, is line-based
        with pytest.raises(SpecError, match="a value may not hold a line break"):
            load_spec(document)
        document = document.replace('"ARG": ' + json.dumps(literal), '"ARG": "one line"')

    spec = load_spec(document)

    assert spec.command == ["python", "-c", literal]
    assert spec.env == {"ARG": literal if "\n" not in literal else "one line"}


def test_shell_looking_strings_are_preserved_exactly_in_yaml() -> None:
    document = """\
name: literal
image: repo/train:1
command: [sh, -c, 'echo $(date) `id` "q" ''s''; exit 0']
env:
  SUBST: $(whoami)
  TICKS: '`uname`'
  MIXED: "a;b 'c' \\"d\\""
instance_types: [g5.xlarge]
"""

    spec = load_spec(document)

    assert spec.command == ["sh", "-c", "echo $(date) `id` \"q\" 's'; exit 0"]
    assert spec.env == {"SUBST": "$(whoami)", "TICKS": "`uname`", "MIXED": "a;b 'c' \"d\""}


def test_an_env_value_with_a_line_break_is_refused_naming_the_variable() -> None:
    """docker's --env-file, the only way env values reach the container, is read line by line (a
    carriage return is refused already, as a control character)."""
    from gpujobs.domain.spec import validate_spec

    with pytest.raises(SpecError) as raised:
        validate_spec({**json.loads(FULL_JSON), "env": {"LR": "0.1", "PROMPT": "first\nsecond"}})

    assert raised.value.problems == ["env: 'PROMPT': a value may not hold a line break"]


@pytest.mark.parametrize(("written", "minutes"), [("30m", 30), ("2h", 120), ("1h30m", 90), ("24h", 1440), ("1m", 1)])
def test_keep_on_failure_is_a_duration_in_hours_and_minutes(written: str, minutes: int) -> None:
    spec = load_spec(MINIMAL_YAML + f"keep_on_failure: {written}\n")

    assert spec.keeps_on_failure == timedelta(minutes=minutes)


def test_without_keep_on_failure_nothing_is_kept() -> None:
    assert load_spec(MINIMAL_YAML).keeps_on_failure is None


@pytest.mark.parametrize(
    ("written", "says"),
    [
        ("25h", "not between 1m and 24h"),
        ("0m", "not between 1m and 24h"),
        ("30", "not a duration such as 30m, 2h or 1h30m"),
        ("30 minutes", "not a duration such as 30m, 2h or 1h30m"),
        ('""', "not a duration such as 30m, 2h or 1h30m"),
        ("1800", "(give the unit)"),
    ],
)
def test_a_keep_on_failure_that_is_no_bounded_duration_is_refused_naming_the_field(written: str, says: str) -> None:
    with pytest.raises(SpecError) as refused:
        load_spec(MINIMAL_YAML + f"keep_on_failure: {written}\n")

    [problem] = refused.value.problems
    assert problem.startswith("keep_on_failure")
    assert says in problem
