"""A corpus of bad job specs: each is refused, and the refusal names the field the user must fix.

Each case is (id, document, expected field path). The document is the text a user would submit;
most are JSON built from a valid base with one field changed, a few are raw YAML or raw bytes. The
assertion is what a user relies on: load_spec raises SpecError and one problem line starts with
`<field path>:`, so `gpujobs validate` points at the right line of their file.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpujobs.domain.spec import MAX_SPEC_BYTES, JobSpec, load_spec
from gpujobs.domain.spec_errors import MAX_PROBLEM_CHARS, MAX_PROBLEMS, SpecError
from gpujobs.domain.yaml_documents import MAX_YAML_EVENTS

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

BASE: dict[str, Any] = {
    "name": "digits",
    "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/gpujobs-train:latest",
    "command": ["python", "train.py"],
    "instance_types": ["g5.xlarge", "g6.xlarge"],
}
BASE_YAML = """\
name: digits
image: 123456789012.dkr.ecr.us-east-1.amazonaws.com/gpujobs-train:latest
command: [python, train.py]
instance_types: [g5.xlarge, g6.xlarge]
"""
ALLOWED = ("g5.xlarge", "g6.xlarge", "g5.12xlarge")
REMOVE = object()
QUOTES = '"' * 4000


def with_(**changes: Any) -> str:
    """The base spec as JSON, with fields replaced (or removed, for the value REMOVE)."""
    doc = {**BASE, **changes}
    return json.dumps({k: v for k, v in doc.items() if v is not REMOVE})


def yaml_with(extra: str) -> str:
    return BASE_YAML + extra


CASES: list[tuple[str, str | bytes, str]] = [
    # ---- the document itself
    ("bad-json", '{"name": "digits", "image": ', "(spec)"),
    ("bad-json-trailing-comma", '{"name": "digits",}', "(spec)"),
    ("bad-yaml", "name: digits\nimage: [unclosed\n", "(spec)"),
    ("bad-yaml-indent", "name: digits\n  image: x\n command: y\n", "(spec)"),
    ("yaml-list-not-mapping", "- name: digits\n- image: x\n", "(spec)"),
    ("json-list-not-mapping", '["digits"]', "(spec)"),
    ("yaml-scalar-not-mapping", "just a string\n", "(spec)"),
    ("empty", "", "(spec)"),
    ("only-whitespace", "  \n\t\n", "(spec)"),
    ("not-utf8", b"name: \xff\xfe\n", "(spec)"),
    ("too-large", with_(env={"PAD": "x" * 4000}) + " " * MAX_SPEC_BYTES, "(spec)"),
    ("unknown-field-typo", with_(gpu_per_node=1), "gpu_per_node"),
    ("missing-required-fields", json.dumps({"name": "digits"}), "image"),
    # ---- name
    ("name-uppercase", with_(name="Digits"), "name"),
    ("name-leading-digit", with_(name="1digits"), "name"),
    ("name-too-long", with_(name="d" * 64), "name"),
    ("name-empty", with_(name=""), "name"),
    ("name-not-string", with_(name=42), "name"),
    # ---- image
    ("image-whitespace", with_(image="repo/train latest"), "image"),
    ("image-bad-digest", with_(image="repo/train@sha256:abc123"), "image"),
    ("image-uppercase-repo", with_(image="Repo/Train:latest"), "image"),
    # ---- command
    ("command-empty", with_(command=[]), "command"),
    ("command-string-not-list", with_(command="python train.py"), "command"),
    ("command-item-not-string", with_(command=["python", 3]), "command[1]"),
    ("command-missing", with_(command=REMOVE), "command"),
    # ---- env
    ("env-reserved-aws", with_(env={"AWS_REGION": "us-west-2"}), "env"),
    ("env-reserved-gpujobs", with_(env={"GPUJOBS_JOB_ID": "x"}), "env"),
    ("env-bad-name", with_(env={"my-var": "x"}), "env"),
    ("env-value-number", with_(env={"STEPS": 600}), "env.STEPS"),
    ("env-value-yaml-bool", yaml_with("env:\n  DEBUG: yes\n"), "env.DEBUG"),
    ("env-not-mapping", with_(env=["A=1"]), "env"),
    # ---- gang shape
    ("nodes-0", with_(nodes=0), "nodes"),
    ("nodes-65", with_(nodes=65), "nodes"),
    ("nodes-fraction", with_(nodes=1.5), "nodes"),
    ("gpus_per_node-9", with_(gpus_per_node=9), "gpus_per_node"),
    ("gpus_per_node--1", with_(gpus_per_node=-1), "gpus_per_node"),
    ("gpus_per_node-word", yaml_with("gpus_per_node: eight\n"), "gpus_per_node"),
    # ---- instance types and capacity
    ("instance_types-empty", with_(instance_types=[]), "instance_types"),
    ("instance_types-duplicate", with_(instance_types=["g5.xlarge", "g5.xlarge"]), "instance_types"),
    ("instance_types-malformed", with_(instance_types=["g5.xlarge", "G5 XLARGE"]), "instance_types[1]"),
    ("instance_types-no-size", with_(instance_types=["g5"]), "instance_types[0]"),
    ("instance_types-not-list", with_(instance_types="g5.xlarge"), "instance_types"),
    ("capacity-unknown", with_(capacity="reserved"), "capacity"),
    # ---- limits
    ("max_interruptions-101", with_(max_interruptions=101), "max_interruptions"),
    ("max_interruptions-negative", with_(max_interruptions=-1), "max_interruptions"),
    ("max_attempts-0", with_(max_attempts=0), "max_attempts"),
    ("max_runtime_minutes-0", with_(max_runtime_minutes=0), "max_runtime_minutes"),
    ("max_runtime_minutes-43201", with_(max_runtime_minutes=43201), "max_runtime_minutes"),
    ("max_cost_usd-0", with_(max_cost_usd=0), "max_cost_usd"),
    ("max_cost_usd-negative", with_(max_cost_usd=-5), "max_cost_usd"),
    ("max_cost_usd-string", with_(max_cost_usd="ten dollars"), "max_cost_usd"),
    ("checkpoint_every_minutes-0", with_(checkpoint_every_minutes=0), "checkpoint_every_minutes"),
    ("checkpoint_every_minutes-1441", with_(checkpoint_every_minutes=1441), "checkpoint_every_minutes"),
    # ---- idle policy
    ("idle-for_minutes-4", with_(idle={"for_minutes": 4}), "idle.for_minutes"),
    ("idle-gpu_util_below_percent-101", with_(idle={"gpu_util_below_percent": 101}), "idle.gpu_util_below_percent"),
    ("idle-action-unknown", with_(idle={"action": "pause"}), "idle.action"),
    ("idle-extra-field", with_(idle={"for_minutes": 30, "notify": "me"}), "idle.notify"),
    ("idle-yaml-not-mapping", yaml_with("idle: stop\n"), "idle"),
    # ---- ownership and idempotency
    ("team-uppercase", with_(team="ML"), "team"),
    ("team-empty", with_(team=""), "team"),
    ("client_token-65-chars", with_(client_token="t" * 65), "client_token"),
    ("client_token-empty", with_(client_token=""), "client_token"),
]

HOSTILE: list[tuple[str, str | bytes, str]] = [
    # ---- documents built to break the parser, not to describe a job
    ("json-nested-past-the-recursion-limit", "[" * 200_000, "(spec)"),
    ("json-nested-objects", '{"a":' * 50_000 + "1" + "}" * 50_000, "(spec)"),
    ("yaml-nested-past-the-recursion-limit", "name: " + "[" * 100_000, "(spec)"),
    ("yaml-a-hundred-thousand-values", "command: [" + ",".join(["1"] * 100_000) + "]\n", "(spec)"),
    ("json-nested-eleven-levels", with_(idle={"a": [[[[[[[[[[1]]]]]]]]]]}), "(spec)"),
    ("yaml-billion-laughs", "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\n", "(spec)"),
    ("yaml-merge-key", yaml_with("<<: {nodes: 2}\n"), "(spec)"),
    ("json-duplicate-key", '{"name": "digits", "name": "other"}', "(spec)"),
    ("yaml-duplicate-key", yaml_with("name: other\n"), "(spec)"),
    ("yaml-duplicate-env-key", yaml_with("env:\n  A: '1'\n  A: '2'\n"), "(spec)"),
    ("json-integer-of-5000-digits", '{"nodes": ' + "9" * 5000 + "}", "(spec)"),
    ("yaml-python-tag", "name: !!python/object/apply:os.system ['id']\n", "(spec)"),
    ("max_cost_usd-infinity", yaml_with("max_cost_usd: .inf\n"), "max_cost_usd"),
    ("max_cost_usd-nan", yaml_with("max_cost_usd: .nan\n"), "max_cost_usd"),
    # a quote is one byte in YAML and two in the JSON the jobs table stores
    (
        "stored-json-larger-than-a-record",
        yaml_with("env:\n" + "".join(f"  Q{i}: '{QUOTES}'\n" for i in range(60))),
        "(spec)",
    ),
    # ---- control characters: a NUL ends an argv string, an ESC drives a terminal
    ("command-nul", with_(command=["python", "train\u0000.py"]), "command[1]"),
    ("command-escape-sequence", with_(command=["python", "\u001b[2J"]), "command[1]"),
    ("command-c1-csi", with_(command=["python", "\u009b31m"]), "command[1]"),
    ("env-value-escape-sequence", with_(env={"NOTE": "\u001b]0;pwned\u0007"}), "env.NOTE"),
    ("env-value-carriage-return", with_(env={"NOTE": "a\rb"}), "env.NOTE"),
    ("client_token-escape-sequence", with_(client_token="\u001b[31mx"), "client_token"),
    ("name-escape-sequence", with_(name="digits\u001b[31m"), "name"),
    ("team-nul", with_(team="vision\u0000"), "team"),
    # ---- reserved names
    ("env-reserved-docker", with_(env={"DOCKER_HOST": "tcp://evil:2375"}), "env"),
    ("env-reserved-ld", with_(env={"LD_PRELOAD": "/tmp/evil.so"}), "env"),
    # ---- credentials belong in secrets:, never in env
    ("env-aws-access-key-id", with_(env={"KEY": "AKIAIOSFODNN7EXAMPLE"}), "env"),
    ("env-aws-session-key-id", with_(env={"KEY": "ASIAIOSFODNN7EXAMPLE"}), "env"),
    (
        "env-aws-secret-access-key",
        with_(env={"MY_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}),
        "env",
    ),
    ("env-hugging-face-token", with_(env={"HF": "hf_" + "a1B2" * 9}), "env"),
    ("env-github-token", with_(env={"GH": "ghp_" + "a1B2" * 9}), "env"),
    ("env-github-fine-grained-token", with_(env={"GH": "github_pat_" + "a1B2_" * 6}), "env"),
    ("env-openai-style-key", with_(env={"OPENAI": "sk-" + "a1B2" * 8}), "env"),
    ("env-slack-token", with_(env={"SLACK": "xoxb-1234567890-abcdefghij"}), "env"),
]
CASES += HOSTILE


@pytest.mark.parametrize(("document", "field"), [pytest.param(d, f, id=i) for i, d, f in CASES])
def test_bad_spec_is_refused_naming_its_field(document: str | bytes, field: str) -> None:
    with pytest.raises(SpecError) as refused:
        load_spec(document)

    problems = refused.value.problems
    assert any(p.startswith(f"{field}: ") for p in problems), problems
    assert all("\n" not in p for p in problems), "each problem is one line"


def test_corpus_is_large_and_ids_are_unique() -> None:
    ids = [i for i, _, _ in CASES]
    assert len(ids) >= 35
    assert len(set(ids)) == len(ids)


def test_instance_type_outside_the_allow_list_is_refused_by_name() -> None:
    document = with_(instance_types=["g5.xlarge", "p5.48xlarge"])

    with pytest.raises(SpecError) as refused:
        load_spec(document, allowed_instance_types=ALLOWED)

    assert any(p.startswith("instance_types: ") and "p5.48xlarge" in p for p in refused.value.problems)


def test_the_same_spec_passes_without_an_allow_list() -> None:
    assert load_spec(with_(instance_types=["g5.xlarge", "p5.48xlarge"])).instance_types == ["g5.xlarge", "p5.48xlarge"]


def test_every_problem_of_a_spec_is_reported_at_once() -> None:
    with pytest.raises(SpecError) as refused:
        load_spec(with_(name="Digits", nodes=0, idle={"for_minutes": 4}))

    fields = {p.split(":", 1)[0] for p in refused.value.problems}
    assert fields == {"name", "nodes", "idle.for_minutes"}


@pytest.mark.parametrize("example", sorted(EXAMPLES.iterdir()), ids=lambda p: p.name)
def test_every_example_is_a_valid_spec(example: Path) -> None:
    spec = load_spec(example.read_bytes(), allowed_instance_types=[*ALLOWED, "c7i.large"])

    assert isinstance(spec, JobSpec)
    assert spec.name == example.stem.split(".")[0]


def test_examples_exist() -> None:
    assert {p.name for p in EXAMPLES.iterdir()} >= {"digits.yaml", "digits-2node.yaml", "cpu-smoke.json"}


@pytest.mark.parametrize(("document", "field"), [pytest.param(d, f, id=i) for i, d, f in HOSTILE])
def test_a_hostile_document_is_refused_with_bounded_printable_problems(document: str | bytes, field: str) -> None:
    with pytest.raises(SpecError) as refused:
        load_spec(document)

    problems = refused.value.problems
    assert 1 <= len(problems) <= MAX_PROBLEMS + 1
    assert all(len(p) <= MAX_PROBLEM_CHARS and p.isprintable() for p in problems), problems


def test_twenty_thousand_unknown_fields_are_listed_twenty_and_counted() -> None:
    document = json.dumps({**BASE, **{f"u{i}": 0 for i in range(20_000)}})
    assert len(document) < MAX_SPEC_BYTES

    with pytest.raises(SpecError) as refused:
        load_spec(document)

    problems = refused.value.problems
    assert len(problems) == MAX_PROBLEMS + 1
    assert problems[-1] == f"(spec): and {20_000 - MAX_PROBLEMS} more problems"


def test_a_credential_in_env_is_never_echoed_in_the_problem() -> None:
    with pytest.raises(SpecError) as refused:
        load_spec(with_(env={"TOKEN": "hf_" + "s3cr3t" * 6}))

    (problem,) = refused.value.problems
    assert "secrets:" in problem
    assert "s3cr3t" not in problem


def test_tab_and_newline_stay_allowed_in_command_arguments_and_a_tab_in_env_values() -> None:
    """A newline in an env value is refused (`test_spec`): docker's --env-file is read line by line."""
    spec = load_spec(with_(command=["python", "-c", "import sys\n\tprint(1)"], env={"NOTE": "a\tb c"}))

    assert spec.command[2] == "import sys\n\tprint(1)"
    assert spec.env["NOTE"] == "a\tb c"


def test_a_forty_character_value_alone_is_not_taken_for_a_secret_key() -> None:
    assert load_spec(with_(env={"COMMIT": "0123456789abcdef0123456789abcdef01234567"})).env["COMMIT"]


def test_a_yaml_document_of_a_hundred_thousand_values_is_refused_before_it_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    document = "command: [" + ",".join(["1"] * 100_000) + "]\n"
    read: list[object] = []
    parse = yaml.parse

    def counted(*args: Any, **kwargs: Any) -> Iterator[object]:
        for event in parse(*args, **kwargs):
            read.append(event)
            yield event

    def built(*args: Any, **kwargs: Any) -> object:
        raise AssertionError("the document was built: reading it would hold the submit function for seconds")

    monkeypatch.setattr(yaml, "parse", counted)
    monkeypatch.setattr(yaml, "load", built)

    with pytest.raises(SpecError, match="more than"):
        load_spec(document)

    assert len(read) <= MAX_YAML_EVENTS + 2  # the parser stopped at the limit, not at the 100,000th value
