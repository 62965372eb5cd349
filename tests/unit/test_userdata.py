"""User data: job strings travel as data, the shell part never changes, and size limits are handled."""

from __future__ import annotations

import ast
import email
import gzip
import hashlib
import json
import random
import string
import sys
from pathlib import Path
from typing import Any

import pytest
import vermin

import gpujobs
from gpujobs.domain.rundoc import RunDocument, RunDocumentPointer
from gpujobs.instance import errors, rundoc
from gpujobs.instance.userdata import (
    HEREDOC_DELIMITER,
    MAX_USER_DATA_BYTES,
    UserDataError,
    UserDataTooLargeError,
    bootstrap_bundle,
    bootstrap_key,
    bootstrap_modules,
    bootstrap_script,
    parse_user_data,
    render_mime,
    render_user_data,
)

BUCKET = "gpujobs-test-checkpoints"
REGION = "us-east-1"
HOSTILE = [
    "$(rm -rf /)",
    "`id`",
    "it's",
    'say "hi"',
    "a; reboot",
    "true && halt",
    "line1\nline2",
    f"x\n{HEREDOC_DELIMITER}\ntouch /tmp/pwned",
    HEREDOC_DELIMITER,
    f"'{HEREDOC_DELIMITER}'",
    "${HOME}",
    "$HOME",
    "\\",
    "snowman \u2603 \U0001f600",
    "--==GPUJOBS-USER-DATA==",
    "\n--==GPUJOBS-USER-DATA==\nContent-Type: text/x-shellscript\n\n#!/bin/sh\nreboot\n",
    "",
    " ",
    "\t\r\n",
    "%s %(x)s {0}",
    "-e FOO=bar",
    "--privileged",
]


def a_document(**changes: Any) -> RunDocument:
    fields: dict[str, Any] = {
        "job_id": "job-1",
        "attempt": 2,
        "name": "demo",
        "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/t:1",
        "command": ["python", "-m", "train"],
        "env": {"LR": "0.1"},
        "nodes": 2,
        "gpus_per_node": 4,
        "checkpoint_uri": "s3://bucket/jobs/job-1/ckpt",
        "resume_from_step": 40,
        "event_bus": "gpujobs",
        "region": "us-east-1",
    }
    return RunDocument(**{**fields, **changes})


def shell_part(user_data: bytes) -> bytes:
    raw = gzip.decompress(user_data) if user_data[:2] == b"\x1f\x8b" else user_data
    parts = [p for p in email.message_from_bytes(raw).walk() if p.get_content_type() == "text/x-shellscript"]
    assert len(parts) == 1
    payload = parts[0].get_payload(decode=True)
    assert isinstance(payload, bytes)
    return payload


def test_hostile_command_and_env_come_back_as_the_same_literal_strings() -> None:
    doc = a_document(command=["python", *HOSTILE], env={f"V{i}": v for i, v in enumerate(HOSTILE)})

    parsed = parse_user_data(render_user_data(doc, bucket=BUCKET, region=REGION))

    assert parsed == doc
    assert isinstance(parsed, RunDocument)
    assert parsed.command == ["python", *HOSTILE]


def test_the_shell_part_is_byte_identical_for_different_jobs() -> None:
    quiet = a_document()
    hostile = a_document(job_id="other", command=HOSTILE, env={"X": "$(reboot)"})

    assert shell_part(render_user_data(quiet, bucket=BUCKET, region=REGION)) == shell_part(
        render_user_data(hostile, bucket=BUCKET, region=REGION)
    )
    assert shell_part(render_user_data(quiet, bucket=BUCKET, region=REGION)).decode() == bootstrap_script(
        bucket=BUCKET, region=REGION
    )


def test_the_shell_part_holds_no_job_data_and_quotes_its_heredoc() -> None:
    script = bootstrap_script(bucket=BUCKET, region=REGION)

    assert "job-1" not in script
    assert f"- <<'{HEREDOC_DELIMITER}'\n" in script
    assert script.splitlines().count(HEREDOC_DELIMITER) == 1
    assert script.endswith(f"\n{HEREDOC_DELIMITER}\n")


def test_the_job_part_is_one_line_so_no_job_string_can_start_a_mime_or_heredoc_line() -> None:
    doc = a_document(command=HOSTILE, env={"X": "\n".join(HOSTILE)})

    mime = render_mime(doc, bucket=BUCKET, region=REGION)
    json_part = mime.split('filename="run.json"\n\n', 1)[1]

    assert json_part.count("\n") == 2  # the JSON line, then the closing boundary line
    assert mime.isascii()


def test_a_normal_document_fits_and_a_large_env_is_gzipped() -> None:
    normal = render_user_data(a_document(), bucket=BUCKET, region=REGION)
    large_env = {f"K{i}": "x" * 200 for i in range(90)}  # 18 KB of compressible env

    packed = render_user_data(a_document(env=large_env), bucket=BUCKET, region=REGION)

    assert len(normal) <= MAX_USER_DATA_BYTES
    assert packed[:2] == b"\x1f\x8b"
    assert len(packed) <= MAX_USER_DATA_BYTES
    assert parse_user_data(packed) == a_document(env=large_env)


def test_a_huge_document_raises_so_the_caller_can_use_a_pointer() -> None:
    rng = random.Random(7)
    noise = "".join(rng.choice(string.ascii_letters) for _ in range(30_000))  # does not compress

    with pytest.raises(UserDataTooLargeError) as raised:
        render_user_data(a_document(env={"BLOB": noise}), bucket=BUCKET, region=REGION)

    assert raised.value.size > MAX_USER_DATA_BYTES
    pointer = RunDocumentPointer.for_stored("s3://bucket/jobs/job-1/run-2.json", b'{"job_id": "job-1"}')
    assert parse_user_data(render_user_data(pointer, bucket=BUCKET, region=REGION)) == pointer


def test_rendering_is_deterministic() -> None:
    big = a_document(env={f"K{i}": "x" * 200 for i in range(60)})

    assert render_user_data(a_document(), bucket=BUCKET, region=REGION) == render_user_data(
        a_document(), bucket=BUCKET, region=REGION
    )
    assert render_user_data(big, bucket=BUCKET, region=REGION) == render_user_data(big, bucket=BUCKET, region=REGION)


def test_user_data_without_a_run_document_is_an_error() -> None:
    with pytest.raises(UserDataError):
        parse_user_data("#!/bin/sh\necho hi\n")
    with pytest.raises(UserDataError):
        parse_user_data(b"{not json")


def test_parse_accepts_text_and_bare_json() -> None:
    doc = a_document()

    assert parse_user_data(render_mime(doc, bucket=BUCKET, region=REGION)) == doc
    assert parse_user_data(doc.model_dump_json()) == doc


def test_the_bootstrap_validator_agrees_with_the_pydantic_model() -> None:
    model_defaults = {
        name: (None if field.is_required() else field.get_default(call_default_factory=True))
        for name, field in RunDocument.model_fields.items()
    }
    bootstrap_defaults = {
        name: (None if default is rundoc._REQUIRED else default) for name, (_, default) in rundoc.FIELDS.items()
    }

    assert bootstrap_defaults == model_defaults
    assert rundoc.check_document(a_document().model_dump(mode="json")) == a_document().model_dump(mode="json")


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"command": "python train.py"}, "command"),
        ({"env": {"BAD NAME": "x"}}, "env name"),
        ({"env": {"DOCKER_HOST": "tcp://elsewhere"}}, "env name"),
        ({"image": "--privileged"}, "image"),
        ({"attempt": True}, "attempt"),
        ({"surprise": 1}, "unknown"),
        ({"wait_for_attempt": "1"}, "wait_for_attempt"),
        ({"wait_for_attempt": 2}, "not an earlier attempt"),
    ],
)
def test_the_bootstrap_rejects_malformed_documents(change: dict[str, Any], problem: str) -> None:
    with pytest.raises(errors.BootstrapError, match=problem):
        rundoc.check_document({**a_document().model_dump(mode="json"), **change})


def test_the_bundle_parses_as_python_3_9_and_imports_only_the_stdlib_and_boto3() -> None:
    for name, code in bootstrap_modules().items():
        tree = ast.parse(code, feature_version=(3, 9))
        imported = {
            alias.name.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])
        }

        # botocore comes with boto3 (its dependency): the identity proof signs with its SigV4Auth
        assert imported - {"__future__", "boto3", "botocore", "gpujobs"} <= set(sys.stdlib_module_names), name


def loader_program() -> str:
    """The Python the shell part feeds the AMI's python3 (the heredoc's body)."""
    script = bootstrap_script(bucket=BUCKET, region=REGION)
    return script.split(f"<<'{HEREDOC_DELIMITER}'\n", 1)[1].rsplit(HEREDOC_DELIMITER, 1)[0]


def test_nothing_that_runs_on_an_instance_needs_a_python_newer_than_3_9() -> None:
    """Parsing as 3.9 is not enough: `datetime.UTC` (3.11) parses, and broke every job's credentials on
    both AMIs. vermin knows which stdlib names, arguments and syntax came in which version; the
    bootstrap's tests also run it under the real 3.9 and 3.10 (tests/ami_pythons.py)."""
    shipped = {**bootstrap_modules(), "the loader": loader_program()}

    needs = {name: vermin.detect(code, path=name)[1] for name, code in shipped.items()}

    assert {name: version for name, version in needs.items() if version is None or version > (3, 9)} == {}


def modules_imported_by(node: ast.Import | ast.ImportFrom) -> list[str]:
    """`import a.b` imports a.b; `from a import b` imports a, and a.b too when b is a module of the layer."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    package = node.module or ""
    layer = Path(gpujobs.__file__).parents[1]
    submodules = [
        f"{package}.{alias.name}"
        for alias in node.names
        if (layer / package.replace(".", "/") / f"{alias.name}.py").exists()
    ]
    return [package, *submodules]


def test_the_bundle_imports_only_the_stdlib_itself_and_boto3_once_a_client_is_made() -> None:
    """The instance has a bare Python with boto3, and the bundle: nothing else of gpujobs, no pydantic.

    The import-linter contract keeps gpujobs.instance away from the rest of gpujobs; this also catches
    an import of a module the bundle leaves out (userdata) or of any third-party package, which
    import-linter cannot name in advance. boto3 is imported inside functions only, so the launch
    Lambda can import `rundoc` to parse user data without it mattering where boto3 comes from.
    """
    modules = bootstrap_modules()
    bundled = {name.removesuffix(".py").removesuffix("/__init__").replace("/", ".") for name in modules}

    for name, code in modules.items():
        tree = ast.parse(code)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for module in modules_imported_by(node):
                top = module.split(".")[0]
                if top == "gpujobs":
                    assert module in bundled, f"{name} imports {module}, which the bundle does not hold"
                elif top in ("boto3", "botocore"):
                    assert node not in tree.body, f"{name} imports boto3 when it is imported"
                else:
                    assert top == "__future__" or top in sys.stdlib_module_names, f"{name} imports {module}"


def test_the_shipped_modules_keep_every_statement_on_its_line() -> None:
    """Docstrings stay out of user data, yet a traceback on the instance names the repository's lines."""
    layer = Path(gpujobs.__file__).parents[1]

    for name, code in bootstrap_modules().items():
        source = (layer / name).read_text(encoding="ascii") if name != "gpujobs/__init__.py" else ""
        statements = [
            [(node.lineno, type(node).__name__) for node in ast.walk(ast.parse(text)) if isinstance(node, ast.stmt)]
            for text in (code, source)
        ]

        assert statements[0] == statements[1], name
        assert len(code.splitlines()) == len(source.splitlines()), name


def test_a_typical_document_leaves_room_for_what_the_bootstrap_is_still_to_learn() -> None:
    """A typical document renders to at most 13 KB of EC2's 16 KB of user data.

    The rest of the 16 KB is the job's. A job whose document does not fit in what is left is moved to
    S3 behind a pointer, which costs the launcher a write and the instance a read. The bootstrap
    itself left user data when logs came (it had reached 12.6 KB gzipped): it is stored in S3 and
    user data carries only a loader pinned to its SHA-256, which the next test keeps small.
    """
    assert len(render_user_data(a_document(), bucket=BUCKET, region=REGION)) <= 13 * 1024


def test_user_data_carries_a_small_loader_pinned_to_the_stored_bootstrap_not_the_bootstrap() -> None:
    """However the bootstrap grows, user data holds a 2.5 KB loader and the job: the job keeps 13.5 KB."""
    script = bootstrap_script(bucket=BUCKET, region=REGION)
    digest = hashlib.sha256(bootstrap_bundle()).hexdigest()

    assert len(script.encode()) <= 2560
    assert f'SHA256 = "{digest}"' in script
    assert f'KEY = "{bootstrap_key()}"' in script
    assert digest in bootstrap_key()
    assert f'BUCKET = "{BUCKET}"' in script
    assert "def rendezvous" not in script
    assert json.loads(gzip.decompress(bootstrap_bundle())) == bootstrap_modules()
    ast.parse(loader_program(), feature_version=(3, 9))
