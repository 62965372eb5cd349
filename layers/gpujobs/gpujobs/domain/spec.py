"""The job spec: what an ML engineer submits, validated before anything is recorded or launched.

The model is the single source of truth for the rules: `gpujobs schema` prints the JSON Schema
generated from it and `gpujobs validate` reports its errors. Unknown fields are rejected so that a
typo (`gpu_per_node`) is an error instead of a silently ignored setting. The stack's instance-type
allow-list is deployment configuration, so it is checked against a validation context rather than
being baked into the model; so is the set of instance types with a known price, which a
`max_cost_usd` needs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Annotated, Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gpujobs.contract import SECRET_NAME_PREFIX

MAX_SPEC_BYTES = 256 * 1024
"""A spec must fit in one SQS message."""

NAME_PATTERN = r"^[a-z][a-z0-9-]{0,62}$"
TEAM_PATTERN = r"^[a-z0-9-]{1,63}$"
ENV_NAME_PATTERN = r"^[A-Z_][A-Z0-9_]*$"
RESERVED_ENV_PREFIXES = ("AWS_", "GPUJOBS_")
# registry/repo[:tag][@sha256:digest]; lowercase repository path components as Docker requires.
IMAGE_PATTERN = (
    r"^(?:[a-zA-Z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$"
)
INSTANCE_TYPE_PATTERN = r"^[a-z][a-z0-9-]*\.[a-z0-9]+$"
REFERENCE_PATTERN = (
    r"^(?:arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:(?P<secret>[A-Za-z0-9/_+=.@-]+)"
    r"|ssm:/(?P<parameter>[A-Za-z0-9/_.-]+))$"
)
"""A secret is a reference, never a value: a Secrets Manager ARN or `ssm:/<parameter name>`."""

StrictInt = Annotated[int, Strict()]
StrictNumber = Annotated[float, Strict()]
"""Numbers must be numbers: YAML `yes` or the JSON string "2" is an error, not 1 or 2."""
Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
Team = Annotated[str, StringConstraints(pattern=TEAM_PATTERN)]
InstanceType = Annotated[str, StringConstraints(pattern=INSTANCE_TYPE_PATTERN)]
Image = Annotated[str, StringConstraints(pattern=IMAGE_PATTERN, max_length=512)]


class Capacity(StrEnum):
    """Which EC2 market a job may run on."""

    SPOT = "spot"
    ON_DEMAND = "on-demand"
    SPOT_FIRST = "spot-first"


class IdleAction(StrEnum):
    STOP = "stop"
    IGNORE = "ignore"


class IdlePolicy(BaseModel):
    """When a job's GPUs count as idle, and what to do about it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu_util_below_percent: StrictNumber = Field(default=5, ge=0, le=100)
    for_minutes: StrictInt = Field(default=30, ge=5, le=1440)
    action: IdleAction = IdleAction.STOP


class JobSpec(BaseModel):
    """A training job as submitted. See docs/job-spec.md for the reference."""

    model_config = ConfigDict(extra="forbid", frozen=True, title="gpujobs job spec")

    name: Name = Field(description="lowercase letters, digits and '-', 1 to 63 chars, starting with a letter")
    image: Image = Field(description="container image: registry/repo[:tag][@sha256:digest]")
    command: list[Annotated[str, StringConstraints(max_length=4096)]] = Field(
        min_length=1, max_length=256, description="argv of the training process; never run through a shell"
    )
    env: dict[str, Annotated[str, StringConstraints(max_length=4096)]] = Field(
        default_factory=dict, description="environment for the container; AWS_* and GPUJOBS_* are reserved"
    )
    nodes: StrictInt = Field(default=1, ge=1, le=64, description="instances in the gang")
    gpus_per_node: StrictInt = Field(default=1, ge=0, le=8, description="0 for CPU smoke jobs")
    instance_types: list[InstanceType] = Field(
        min_length=1, max_length=16, description="ordered preference; each must be in the stack's allow-list"
    )
    capacity: Capacity = Capacity.SPOT_FIRST
    max_interruptions: StrictInt = Field(default=5, ge=0, le=100)
    max_attempts: StrictInt = Field(default=3, ge=1, le=100)
    max_runtime_minutes: StrictInt = Field(default=1440, ge=1, le=43200)
    max_cost_usd: StrictNumber | None = Field(default=None, gt=0)
    checkpoint_every_minutes: StrictInt = Field(default=30, ge=1, le=1440)
    idle: IdlePolicy = Field(default_factory=IdlePolicy)
    team: Team = "default"
    client_token: str | None = Field(default=None, min_length=1, max_length=64)
    secrets: dict[str, Annotated[str, StringConstraints(max_length=2048)]] = Field(
        default_factory=dict,
        max_length=32,
        description=(
            "environment name -> secret reference (arn:aws:secretsmanager:... or ssm:/path) under the team's "
            "prefix gpujobs/<team>/; resolved on the instance, never stored as a value"
        ),
    )

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        bad = [f"{k!r} must match {ENV_NAME_PATTERN}" for k in env if not re.fullmatch(ENV_NAME_PATTERN, k)]
        bad += [
            f"{k!r} is reserved (AWS_* and GPUJOBS_* are set by gpujobs)"
            for k in env
            if k.startswith(RESERVED_ENV_PREFIXES)
        ]
        if bad:
            raise ValueError("; ".join(bad))
        return env

    @field_validator("secrets")
    @classmethod
    def _secret_names(cls, secrets: dict[str, str]) -> dict[str, str]:
        return cls._env_names(secrets)

    @model_validator(mode="after")
    def _secrets_are_the_teams_references(self) -> JobSpec:
        """Each secret is a reference under the team's prefix, and names no variable `env` also sets."""
        bad = [f"{k!r} is also set in env" for k in self.secrets if k in self.env]
        for name, ref in self.secrets.items():
            found = re.fullmatch(REFERENCE_PATTERN, ref)
            if found is None:
                bad.append(
                    f"{name}: must be a reference, arn:aws:secretsmanager:<region>:<account>:secret:... or ssm:/path"
                )
                continue
            path = found["secret"] or found["parameter"]
            if not path.startswith(f"{SECRET_NAME_PREFIX}{self.team}/"):
                bad.append(
                    f"{name}: team {self.team!r} may read only secrets named {SECRET_NAME_PREFIX}{self.team}/..."
                )
        if bad:
            raise ValueError("secrets: " + "; ".join(bad))
        return self

    @field_validator("instance_types")
    @classmethod
    def _allowed_types(cls, types: list[str], info: ValidationInfo) -> list[str]:
        if len(set(types)) != len(types):
            raise ValueError("instance_types must not repeat a type")
        allowed = (info.context or {}).get("allowed_instance_types")
        if allowed is not None:
            refused = [t for t in types if t not in allowed]
            if refused:
                raise ValueError(f"{', '.join(refused)} not in this stack's allow-list ({', '.join(sorted(allowed))})")
        return types

    @field_validator("max_cost_usd")
    @classmethod
    def _priced_types(cls, cap: float | None, info: ValidationInfo) -> float | None:
        priced = (info.context or {}).get("priced_instance_types")
        if cap is None or priced is None:
            return cap
        unpriced = [t for t in info.data.get("instance_types", ()) if t not in priced]
        if unpriced:
            raise ValueError(
                f"cannot be enforced: no price is known for {', '.join(unpriced)}; "
                "drop max_cost_usd or choose instance types with a known price"
            )
        return cap


_PATTERN_RULES = {
    NAME_PATTERN: "lowercase letters, digits and '-', 1 to 63 characters, starting with a letter",
    TEAM_PATTERN: "lowercase letters, digits and '-', 1 to 63 characters",
    IMAGE_PATTERN: "a container image reference registry/repo[:tag][@sha256:digest] without whitespace",
    INSTANCE_TYPE_PATTERN: "an EC2 instance type such as g5.xlarge",
}


class SpecError(Exception):
    """A submission that is not a valid job spec. `problems` are one line each, naming the field."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def _field_path(loc: Iterable[int | str]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "(spec)"


def describe_errors(error: ValidationError) -> list[str]:
    """One line per problem: `field: rule`, in the user's terms rather than pydantic's."""
    lines = []
    for err in error.errors(include_url=False):
        field = _field_path(err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = "unknown field (not part of the job spec)"
        elif err["type"] == "string_pattern_mismatch":
            rule = _PATTERN_RULES.get(str((err.get("ctx") or {}).get("pattern")), message)
            message = f"must be {rule} (got {err['input']!r})"
        lines.append(f"{field}: {message}")
    return lines


def parse_document(text: str | bytes) -> Mapping[str, Any]:
    """Parse a JSON or YAML document into a mapping; raises SpecError naming the problem."""
    raw = text.encode() if isinstance(text, str) else text
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError([f"(spec): {len(raw)} bytes is larger than one SQS message ({MAX_SPEC_BYTES} bytes)"])
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError([f"(spec): not UTF-8 text ({exc.reason} at byte {exc.start})"]) from exc
    stripped = decoded.lstrip()
    if not stripped:
        raise SpecError(["(spec): empty document"])
    try:
        data = json.loads(decoded) if stripped.startswith(("{", "[")) else yaml.safe_load(decoded)
    except json.JSONDecodeError as exc:
        raise SpecError([f"(spec): invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"]) from exc
    except yaml.YAMLError as exc:
        raise SpecError([f"(spec): invalid YAML: {str(exc).splitlines()[0]}"]) from exc
    if not isinstance(data, dict):
        raise SpecError([f"(spec): expected a mapping of fields, got {type(data).__name__}"])
    return data


def validate_spec(
    data: Mapping[str, Any],
    *,
    allowed_instance_types: Iterable[str] | None = None,
    priced_instance_types: Iterable[str] | None = None,
) -> JobSpec:
    """Validate a parsed document against the spec and, when given, the stack's allow-list and the
    types whose price is known (a `max_cost_usd` over a type of unknown price cannot be enforced)."""
    context: dict[str, frozenset[str]] = {}
    if allowed_instance_types is not None:
        context["allowed_instance_types"] = frozenset(allowed_instance_types)
    if priced_instance_types is not None:
        context["priced_instance_types"] = frozenset(priced_instance_types)
    try:
        return JobSpec.model_validate(data, context=context)
    except ValidationError as exc:
        raise SpecError(describe_errors(exc)) from exc


def load_spec(text: str | bytes, *, allowed_instance_types: Iterable[str] | None = None) -> JobSpec:
    return validate_spec(parse_document(text), allowed_instance_types=allowed_instance_types)


def json_schema() -> dict[str, Any]:
    return JobSpec.model_json_schema()
