"""The job spec: what an ML engineer submits, validated before anything is recorded or launched.

The model is the single source of truth for the rules: `gpujobs schema` prints the JSON Schema
generated from it and `gpujobs validate` reports its errors. Unknown fields are rejected so that a
typo (`gpu_per_node`) is an error instead of a silently ignored setting. The stack's instance-type
allow-list is deployment configuration, so it is checked against a validation context rather than
being baked into the model; so is the set of instance types with a known price, which a
`max_cost_usd` needs.

Whoever may send to the queue writes these documents, so reading one never fails any other way than
with a `SpecError` whose problems are bounded (`MAX_PROBLEMS` lines of at most `MAX_PROBLEM_CHARS`):
the parser's hazards are closed in `documents`, control characters (a NUL ends an argv string; an
ESC drives the terminal of whoever reads the job) are refused in every string a job carries, and so
are credentials in `env` (`env_secrets`), which belong in `secrets:`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gpujobs.contract import SECRET_NAME_PREFIX
from gpujobs.domain import documents
from gpujobs.domain.env_secrets import env_credential_problems
from gpujobs.domain.spec_errors import SpecError
from gpujobs.domain.spec_hints import argv_form, unknown_type
from gpujobs.domain.spec_parts import (
    Capacity,
    CheckpointMode,
    Deadline,
    IdleAction,
    IdlePolicy,
    KeepDuration,
    Priority,
    RequirementsPath,
    SetupCommands,
    StrictInt,
    StrictNumber,
    Text,
    duration,
)
from gpujobs.domain.spec_parts import printable as _printable
from gpujobs.domain.stored import is_stored_record
from gpujobs.domain.trainer_settings import TrainerSettings

if TYPE_CHECKING:
    from gpujobs.domain.offerings import RegionOfferings

__all__ = [  # the spec's parts (`spec_parts`) are imported from here too
    "Capacity",
    "CheckpointMode",
    "Deadline",
    "IdleAction",
    "IdlePolicy",
    "JobSpec",
    "Priority",
    "load_spec",
    "parse_document",
    "validate_spec",
]

MAX_SPEC_BYTES = 256 * 1024
"""A spec must fit in one SQS message, also in the JSON form the jobs table stores."""
NAME_PATTERN = r"^[a-z][a-z0-9-]{0,62}$"
TEAM_PATTERN = r"^[a-z0-9-]{1,63}$"
ENV_NAME_PATTERN = r"^[A-Z_][A-Z0-9_]*$"
RESERVED_ENV_PREFIXES = ("AWS_", "GPUJOBS_", "DOCKER_", "LD_")
"""Set by gpujobs (AWS_*, GPUJOBS_*), or changing what docker or the dynamic loader does (DOCKER_*, LD_PRELOAD)."""
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

Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
Team = Annotated[str, StringConstraints(pattern=TEAM_PATTERN)]
InstanceType = Annotated[str, StringConstraints(pattern=INSTANCE_TYPE_PATTERN)]
Image = Annotated[str, StringConstraints(pattern=IMAGE_PATTERN, max_length=512)]


S3_OBJECT_PATTERN = r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/[^\s]{1,1024}$"
SHA256_PATTERN = r"^[0-9a-f]{64}$"


def _name_problems(names: Iterable[str]) -> list[str]:
    """What is wrong with environment variable names (the spec's `env` and `secrets` alike)."""
    names = list(names)
    bad = [f"{k[:64]!r} must match {ENV_NAME_PATTERN}" for k in names if not re.fullmatch(ENV_NAME_PATTERN, k)]
    return bad + [
        f"{k!r} is reserved (AWS_*, GPUJOBS_*, DOCKER_* and LD_* are set by gpujobs or change the runtime)"
        for k in names
        if k.startswith(RESERVED_ENV_PREFIXES)
    ]


class JobSpec(BaseModel):
    """A training job as submitted. See docs/job-spec.md for the reference."""

    model_config = ConfigDict(extra="forbid", frozen=True, title="gpujobs job spec")

    name: Name = Field(description="lowercase letters, digits and '-', 1 to 63 chars, starting with a letter")
    image: Image = Field(description="container image: registry/repo[:tag][@sha256:digest]")
    command: list[Text] = Field(
        min_length=1, max_length=256, description="argv of the training process; never run through a shell"
    )
    env: dict[str, Text] = Field(
        default_factory=dict,
        description="environment for the container; AWS_*, GPUJOBS_*, DOCKER_* and LD_* are reserved; "
        "credentials go in secrets:, never here",
    )
    nodes: StrictInt = Field(default=1, ge=1, le=64, description="instances in the gang")
    gpus_per_node: StrictInt = Field(default=1, ge=0, le=8, description="0 for CPU smoke jobs")
    instance_types: list[InstanceType] = Field(
        min_length=1, max_length=16, description="ordered preference; each must be in the stack's allow-list"
    )
    capacity: Capacity = Capacity.SPOT_FIRST
    priority: Priority = Field(
        default=Priority.NORMAL,
        description="low, normal or high: the order the team's waiting jobs are admitted in and what a"
        " preemption may take (at most the team's max_priority)",
    )
    max_interruptions: StrictInt = Field(default=5, ge=0, le=100)
    max_attempts: StrictInt = Field(default=3, ge=1, le=100)
    max_runtime_minutes: StrictInt = Field(default=1440, ge=1, le=43200)
    max_cost_usd: StrictNumber | None = Field(default=None, gt=0)
    checkpoint_every_minutes: StrictInt = Field(default=30, ge=1, le=1440)
    idle: IdlePolicy = Field(default_factory=IdlePolicy)
    checkpoint: CheckpointMode = Field(
        default=CheckpointMode.GPUJOBS,
        description="gpujobs (the trainer library), directory (sync $GPUJOBS_CHECKPOINT_DIR) or none",
    )
    code: Annotated[str, StringConstraints(min_length=1, max_length=1100), AfterValidator(_printable)] | None = Field(
        default=None,
        description="a .tar.gz of code unpacked into the working directory before the command: s3://bucket/key; "
        "in a file given to `gpujobs submit`, a local folder it packs and uploads",
    )
    code_sha256: Annotated[str, StringConstraints(pattern=SHA256_PATTERN)] | None = Field(
        default=None, description="hex SHA-256 of the code archive; the launcher refuses any other bytes"
    )
    setup: SetupCommands = Field(
        default_factory=list,
        description="commands run in the job's container before the command, on every node and attempt: "
        "an argv list, or a string run by /bin/sh -c in the container (never on the host)",
    )
    requirements: RequirementsPath | None = Field(
        default=None,
        description="a pip requirements file inside code:, installed into a venv layered on the image "
        "(cached in S3 by its content, so a replacement node does not reinstall)",
    )
    deadline: Deadline | None = Field(
        default=None, description="finish within hours of submission: spot while the slack allows, else on-demand"
    )
    trainer: TrainerSettings = Field(
        default_factory=TrainerSettings,
        description="settings of the trainer runtime (gpujobs_trainer) and of its hang check",
    )
    team: Team = "default"
    client_token: Annotated[str, AfterValidator(_printable)] | None = Field(default=None, min_length=1, max_length=64)
    keep_on_failure: KeepDuration | None = Field(
        default=None,
        description="keep a failed gang up (billed) this long for `gpujobs shell`/`exec`: 30m, 2h or 1h30m, at most 24h",
    )
    secrets: dict[str, Annotated[str, StringConstraints(max_length=2048)]] = Field(
        default_factory=dict,
        max_length=32,
        description=(
            "environment name -> secret reference (arn:aws:secretsmanager:... or ssm:/path) under the team's "
            "prefix gpujobs/<team>/; resolved on the instance, never stored as a value"
        ),
    )

    @property
    def keeps_on_failure(self) -> timedelta | None:
        """How long a gang whose crash fails the job stays up for inspection; None: not at all."""
        return duration(self.keep_on_failure) if self.keep_on_failure else None

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        bad = _name_problems(env)
        stored = is_stored_record(info.context)  # a stored job may predate the submit-only rules
        if not stored:  # docker's --env-file is line-based
            bad += [f"{k!r}: a value may not hold a line break" for k, v in env.items() if "\n" in v]
        bad += env_credential_problems(env, submitted=info.context is not None and not stored)
        if bad:
            raise ValueError("; ".join(bad))
        return env

    @field_validator("secrets")
    @classmethod
    def _secret_names(cls, secrets: dict[str, str]) -> dict[str, str]:
        """Names follow the env rules; the values (references) are checked with the team below."""
        bad = _name_problems(secrets)
        if bad:
            raise ValueError("; ".join(bad))
        return secrets

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

    @field_validator("code")
    @classmethod
    def _code_is_an_archive_in_s3(cls, code: str | None, info: ValidationInfo) -> str | None:
        """The queue takes only S3 code; a local folder is valid where `gpujobs submit` packs it."""
        if code is None or re.fullmatch(S3_OBJECT_PATTERN, code):
            return code
        if code.startswith("s3://"):
            raise ValueError(f"{code[:80]!r} is not s3://bucket/key")
        if not (info.context or {}).get("local_code"):
            raise ValueError("must be s3://bucket/key here; a local folder is packed and uploaded by `gpujobs submit`")
        return code

    @field_validator("code_sha256")
    @classmethod
    def _digest_of_an_s3_archive(cls, digest: str | None, info: ValidationInfo) -> str | None:
        code = info.data.get("code")
        if digest is not None and not (code and code.startswith("s3://")):
            raise ValueError("only for an s3:// code archive (submit computes it for a folder it packs)")
        return digest

    @model_validator(mode="after")
    def _an_s3_archive_is_pinned(self, info: ValidationInfo) -> JobSpec:
        """Refused at submit (a stored job may predate the rule), not by the launcher (exit 78)."""
        if self.code and self.code.startswith("s3://") and not (self.code_sha256 or is_stored_record(info.context)):
            raise ValueError(
                "code_sha256: required with an s3:// code archive, the launcher runs only the bytes it pins"
            )
        return self

    @field_validator("requirements")
    @classmethod
    def _requirements_come_with_code(cls, path: str | None, info: ValidationInfo) -> str | None:
        """The file is read from the unpacked `code:` folder: without one there is nothing to read."""
        if path is not None and "code" in info.data and info.data["code"] is None:
            raise ValueError(f"{path[:80]!r} is a path inside code:, but the job has no code: (add the folder)")
        return path

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

    @field_validator("instance_types")
    @classmethod
    def _known_types(cls, types: list[str], info: ValidationInfo) -> list[str]:
        """Offline knowledge of the types (`instance_gpus` in the context: type -> GPUs per instance;
        with a `region`, `instance_offerings`: where each is offered, `domain.offerings`)."""
        context = info.context or {}
        gpus: Mapping[str, int] = context.get("instance_gpus") or {}
        bad = [unknown_type(t, gpus) for t in types if gpus and t not in gpus]
        wanted = info.data.get("gpus_per_node")
        short = [f"{t} has {gpus[t]}" for t in types if t in gpus and isinstance(wanted, int) and gpus[t] < wanted]
        if short:
            bad.append(f"gpus_per_node is {wanted}, but {', '.join(short)}")
        if context.get("region"):  # the CLI's offline check; the Lambdas never load `offerings` for it
            from gpujobs.domain.offerings import not_offered_in_region

            offerings, region = context["instance_offerings"], context["region"]
            bad += [m for t in types if (m := not_offered_in_region(offerings, instance_type=t, region=region))]
        if bad:
            raise ValueError("; ".join(bad))
        return types

    @field_validator("command", mode="before")
    @classmethod
    def _command_is_argv(cls, command: object) -> object:
        if isinstance(command, str):
            raise ValueError(
                "must be a list of arguments (argv), never a string run through a shell; "
                f"write it as command: {argv_form(command)}"
            )
        return command

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

    @model_validator(mode="after")
    def _deadline_may_use_on_demand(self) -> JobSpec:
        """A deadline is kept by moving to on-demand when spot cannot make it: only spot-first may."""
        if self.deadline is not None and self.capacity is not Capacity.SPOT_FIRST:
            raise ValueError(f"deadline: needs capacity spot-first (got {self.capacity.value})")
        return self


_PATTERN_RULES = {
    NAME_PATTERN: "lowercase letters, digits and '-', 1 to 63 characters, starting with a letter",
    TEAM_PATTERN: "lowercase letters, digits and '-', 1 to 63 characters",
    IMAGE_PATTERN: "a container image reference registry/repo[:tag][@sha256:digest] without whitespace",
    INSTANCE_TYPE_PATTERN: "an EC2 instance type such as g5.xlarge",
    SHA256_PATTERN: "a SHA-256 in lowercase hex (64 characters)",
}


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
            message = f"must be {rule} (got {str(err['input'])[:64]!r})"
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
    if not decoded.strip():
        raise SpecError(["(spec): empty document"])
    try:
        data = documents.load(decoded)
    except documents.DocumentError as exc:
        raise SpecError([f"(spec): {exc}"]) from exc
    if not isinstance(data, dict):
        raise SpecError([f"(spec): expected a mapping of fields, got {type(data).__name__}"])
    return data


def validate_spec(
    data: Mapping[str, Any],
    *,
    allowed_instance_types: Iterable[str] | None = None,
    priced_instance_types: Iterable[str] | None = None,
    instance_gpus: Mapping[str, int] | None = None,
    offered_in: tuple[str, RegionOfferings] | None = None,
    local_code: bool = False,
) -> JobSpec:
    """Validate a parsed document against the spec and, when given, the stack's allow-list, the
    types whose price is known (a `max_cost_usd` over a type of unknown price cannot be enforced),
    the GPUs of each known type (an unknown type, or fewer GPUs than `gpus_per_node`, is refused)
    and `offered_in`, a region and where each type is offered (a type no zone there offers is refused).
    `local_code`: `code` may name a local folder (a file `gpujobs submit` packs), not only S3."""
    context: dict[str, object] = {"local_code": local_code}
    if offered_in is not None:
        context["region"], context["instance_offerings"] = offered_in
    if allowed_instance_types is not None:
        context["allowed_instance_types"] = frozenset(allowed_instance_types)
    if priced_instance_types is not None:
        context["priced_instance_types"] = frozenset(priced_instance_types)
    if instance_gpus is not None:
        context["instance_gpus"] = dict(instance_gpus)
    try:
        spec = JobSpec.model_validate(data, context=context)
    except ValidationError as exc:
        raise SpecError(describe_errors(exc)) from exc
    stored = len(spec.model_dump_json().encode())
    if stored > MAX_SPEC_BYTES:
        raise SpecError([f"(spec): {stored} bytes as stored JSON, more than a job record holds ({MAX_SPEC_BYTES})"])
    return spec


def load_spec(
    text: str | bytes,
    *,
    allowed_instance_types: Iterable[str] | None = None,
    instance_gpus: Mapping[str, int] | None = None,
    offered_in: tuple[str, RegionOfferings] | None = None,
    local_code: bool = False,
) -> JobSpec:
    return validate_spec(
        parse_document(text),
        allowed_instance_types=allowed_instance_types,
        instance_gpus=instance_gpus,
        offered_in=offered_in,
        local_code=local_code,
    )


def json_schema() -> dict[str, Any]:
    return JobSpec.model_json_schema()
