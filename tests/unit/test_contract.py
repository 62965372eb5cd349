"""Every copy of the shared names agrees with `gpujobs.contract`, and no other copy exists.

The contract is written once in `gpujobs/contract.py`. The bootstrap (stdlib only, in user data),
the trainer image (another artifact) and template.yaml keep their own copies; these tests compare
each copy with the contract, and search every source folder (the layer, the functions, the CLI, the
local cloud, the training image) for a literal of a shared name anywhere else, so a copy cannot
drift and a new one cannot appear unnoticed.
"""

from __future__ import annotations

import ast
import fnmatch
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import gpujobs_trainer
from gpujobs import contract
from gpujobs.domain.spec import TEAM_PATTERN
from gpujobs.domain.spec_parts import MAX_KEEP_ON_FAILURE
from gpujobs.domain.trainer_settings import LogLevel, TrainerSettings
from gpujobs.instance import contract as instance_contract
from gpujobs.instance import rundoc as instance_rundoc
from gpujobs.instance.workload_env import container_env
from gpujobs_local.template import resources_of_type
from gpujobs_trainer import errors as trainer_errors
from gpujobs_trainer import events as trainer_events
from gpujobs_trainer import layout as trainer_layout
from gpujobs_trainer import metrics as trainer_metrics
from gpujobs_trainer import outputs as trainer_outputs
from gpujobs_trainer import signing as trainer_signing

ROOT = Path(__file__).resolve().parents[2]

# The files allowed to spell a shared name: the contract and its registered copies.
COPIES = {
    "layers/gpujobs/gpujobs/contract.py",
    "layers/gpujobs/gpujobs/instance/contract.py",
    "training_image/gpujobs_trainer/errors.py",
    "training_image/gpujobs_trainer/events.py",
    "training_image/gpujobs_trainer/layout.py",
    "training_image/gpujobs_trainer/metrics.py",
    "training_image/gpujobs_trainer/outputs.py",
    "training_image/gpujobs_trainer/signing.py",
}
SOURCE_FOLDERS = ("layers", "functions", "cli", "local", "training_image")


# ---- the bootstrap's copy ---------------------------------------------------------------------
def test_the_bootstrap_reads_the_tags_the_launcher_writes() -> None:
    assert instance_contract.TAG_JOB_ID == contract.JOB_TAG
    assert instance_contract.TAG_ATTEMPT == contract.ATTEMPT_TAG
    assert instance_contract.TAG_GENERATION == contract.GENERATION_TAG


def test_the_bootstrap_signs_its_identity_proof_as_the_credentials_function_checks_it() -> None:
    assert instance_contract.JOB_SESSION_HEADER == contract.JOB_SESSION_HEADER
    assert instance_contract.job_session_purpose("s", "j-1", 2) == contract.job_session_purpose("s", "j-1", 2)


def test_the_bootstrap_reports_its_exit_as_the_reports_rule_expects() -> None:
    assert instance_contract.EVENT_SOURCE == contract.INSTANCE_SOURCE
    assert instance_contract.EVENT_DETAIL_TYPE == contract.JOB_EXITED
    assert instance_contract.EXIT_BOOTSTRAP_FAILED == contract.ExitCode.BOOTSTRAP_FAILED
    assert instance_contract.EXIT_PREEMPTED == contract.ExitCode.PREEMPTED
    assert instance_contract.EXIT_UNHEALTHY_NODE == contract.ExitCode.UNHEALTHY_NODE
    assert instance_contract.EXIT_HARDWARE_FAULT == contract.ExitCode.HARDWARE_FAULT
    assert instance_contract.EXIT_SLOW_INTERCONNECT == contract.ExitCode.SLOW_INTERCONNECT


def test_the_bootstrap_counts_instance_states_as_the_control_plane_does() -> None:
    assert instance_contract.ALIVE_STATES == contract.WORKLOAD_MAY_RUN_STATES
    assert instance_contract.RENDEZVOUS_STATES == contract.UP_STATES


@pytest.mark.parametrize(("job_id", "attempt"), [("j-0123456789abcdef", 1), ("j-ffffffffffffffff", 42)])
def test_the_bootstrap_names_the_container_as_the_checkpoint_signal_addresses_it(job_id: str, attempt: int) -> None:
    assert instance_contract.container_name(job_id, attempt) == contract.container_name(job_id, attempt)


@pytest.mark.parametrize("team", ["vision", None])
def test_the_bootstrap_names_log_streams_as_the_cli_reads_them(team: str | None) -> None:
    for attempt, node, generation in ((1, 0, 0), (12, 63, 0), (3, 1, 2)):
        stream = contract.job_log_stream("j-0123456789abcdef", attempt, node, team=team, generation=generation)
        copy = instance_contract.job_log_stream("j-0123456789abcdef", attempt, node, team=team, generation=generation)
        assert copy == stream
        assert ":" not in stream
        assert "*" not in stream
    assert instance_contract.BOOTSTRAP_LOG_STREAM_SUFFIX == contract.BOOTSTRAP_LOG_STREAM_SUFFIX


def test_the_bootstrap_accepts_exactly_the_team_names_a_spec_may_have() -> None:
    assert instance_rundoc.TEAM_NAME.pattern == TEAM_PATTERN


def test_the_bootstrap_reads_checkpoints_in_the_trainers_layout() -> None:
    assert instance_contract.CHECKPOINT_COMMIT_FILE == contract.CHECKPOINT_COMMIT_FILE
    assert instance_contract.LAST_COMMIT_REASONS == contract.LAST_COMMIT_REASONS
    for step in (0, 42, 99_999_999):
        folder = contract.checkpoint_step_dir(step)
        assert instance_contract.checkpoint_step_dir(step) == folder
        match = instance_contract.CHECKPOINT_STEP_DIR.match(folder + "/")
        assert match is not None
        assert int(match.group(1)) == step


def test_the_bootstrap_tells_the_workload_exactly_the_contracts_variables() -> None:
    doc = {
        "job_id": "j-0123456789abcdef",
        "attempt": 2,
        "nodes": 2,
        "gpus_per_node": 8,
        "master_port": 29500,
        "checkpoint_uri": "s3://bucket/jobs/j-0123456789abcdef/ckpt",
        "checkpoint_every_minutes": 30,
        "event_bus": "bus",
        "resume_from_step": 100,
        "env": {"LR": "0.1"},
        "report_key": "00" * 32,
        "checkpoint_key": "11" * 32,
        "checkpoint_mode": "directory",
        "code_uri": "s3://bucket/jobs/j-0123456789abcdef/code/0.tar.gz",
        "code_sha256": "0" * 64,
        "setup": [["/bin/sh", "-c", "nvidia-smi"]],
        "requirements": "requirements.txt",
        "venv_cache_uri": "s3://bucket/jobs/j-0123456789abcdef/venvs",
        # Every trainer setting differs from its default, so each travels as its variable.
        "trainer_env": TrainerSettings(
            collective_timeout_seconds=600,
            checkpoint_every_steps=500,
            keep_checkpoints=3,
            async_checkpoints=False,
            compile=True,
            heartbeat_seconds=30,
            log_level=LogLevel.DEBUG,
        ).environment(),
    }
    env = container_env(
        doc,
        rank=1,
        master_addr="10.0.0.1",
        instance_id="i-0123456789abcdef0",
        region="us-east-1",
        output_dir="/var/lib/gpujobs/outputs",
        instance_type="p4d.24xlarge",
        interconnect_floor=12.5,
    )
    assert sorted(k for k in env if k.startswith("GPUJOBS_")) == sorted(contract.WORKLOAD_ENV)


def test_the_trainer_image_reads_every_variable_the_bootstrap_sets() -> None:
    sources = "\n".join(
        p.read_text(encoding="utf-8")
        for p in [*(ROOT / "training_image").rglob("*.py"), ROOT / "training_image" / "Dockerfile"]
    )
    unread = [name for name in contract.WORKLOAD_ENV if name not in sources]
    # The resume step is advice for people reading the environment: the trainer takes the newest
    # committed checkpoint whatever the control plane knew at launch (docs/training.md).
    assert unread == ["GPUJOBS_RESUME_FROM_STEP"]


# ---- the trainer image's copy -----------------------------------------------------------------
def test_the_trainer_promises_the_exit_codes_the_control_plane_judges() -> None:
    assert gpujobs_trainer.SUCCESS_EXIT_CODE == contract.ExitCode.SUCCEEDED
    assert gpujobs_trainer.CRASH_EXIT_CODE == contract.ExitCode.CRASHED
    assert gpujobs_trainer.PREEMPTED_EXIT_CODE == contract.ExitCode.PREEMPTED
    assert gpujobs_trainer.CONFIG_ERROR_EXIT_CODE == contract.ExitCode.CONFIG_ERROR
    assert trainer_errors.SYNC_FAILED_EXIT_CODE == contract.ExitCode.SYNC_FAILED


def test_the_trainer_reports_what_the_reports_function_handles() -> None:
    assert trainer_events.SOURCE == contract.TRAINER_SOURCE
    assert trainer_events.CHECKPOINT_COMMITTED == contract.CHECKPOINT_COMMITTED
    assert trainer_events.TRAINING_HEARTBEAT == contract.TRAINING_HEARTBEAT
    assert trainer_events.JOB_EXITED == contract.JOB_EXITED


def test_the_trainer_writes_checkpoints_in_the_layout_the_bootstrap_reads() -> None:
    assert trainer_layout.COMMIT_FILE == contract.CHECKPOINT_COMMIT_FILE
    assert set(contract.LAST_COMMIT_REASONS) <= set(trainer_layout.REASONS)
    for step in (0, 42, 99_999_999):
        assert trainer_layout.step_dir_name(step) == contract.checkpoint_step_dir(step)
        assert trainer_layout.parse_step_dir(contract.checkpoint_step_dir(step)) == step


def test_the_trainer_signs_the_fields_the_control_plane_acts_on_under_its_scheme() -> None:
    assert trainer_signing.SIGNED_FIELDS == contract.REPORT_SIGNED_FIELDS
    assert trainer_signing.SIGNED_EXTENSIONS == contract.REPORT_SIGNED_EXTENSIONS
    assert trainer_metrics.MAX_METRICS == contract.MAX_HEARTBEAT_METRICS
    assert trainer_metrics.METRIC_NAME_PATTERN == contract.METRIC_NAME_PATTERN
    assert trainer_outputs.TB_SUBDIR + "/" == contract.TENSORBOARD_OUTPUTS
    assert trainer_signing.REPORT_SIGNATURE_SCHEME == contract.REPORT_SIGNATURE_SCHEME
    assert trainer_signing.REPORT_KEY_ENV in contract.WORKLOAD_ENV
    assert trainer_signing.CHECKPOINT_KEY_ENV in contract.WORKLOAD_ENV


def test_the_bootstrap_signs_its_exit_under_the_scheme_the_control_plane_verifies() -> None:
    assert contract.REPORT_SIGNED_FIELDS[contract.JOB_EXITED] == instance_contract.EXIT_SIGNED_FIELDS
    assert instance_contract.REPORT_SIGNATURE_SCHEME == contract.REPORT_SIGNATURE_SCHEME
    assert instance_contract.REPORT_KEY_ENV == trainer_signing.REPORT_KEY_ENV
    assert instance_contract.CHECKPOINT_KEY_ENV == trainer_signing.CHECKPOINT_KEY_ENV


def test_the_bootstrap_and_the_trainer_agree_on_the_output_folder() -> None:
    for copy in (instance_contract, trainer_outputs):
        assert copy.OUTPUT_DIR_ENV == contract.OUTPUT_DIR_ENV
        assert copy.OUTPUT_UNSENT_PREFIX == contract.OUTPUT_UNSENT_PREFIX
        assert copy.OUTPUT_UPLOAD_REQUEST_FILE == contract.OUTPUT_UPLOAD_REQUEST_FILE
        assert copy.OUTPUT_UPLOAD_TAKEN_FILE == contract.OUTPUT_UPLOAD_TAKEN_FILE
    assert contract.OUTPUT_DIR_ENV in contract.WORKLOAD_ENV
    assert contract.OUTPUT_UPLOAD_REQUEST_FILE.startswith(contract.OUTPUT_UNSENT_PREFIX)
    assert contract.OUTPUT_UPLOAD_TAKEN_FILE.startswith(contract.OUTPUT_UNSENT_PREFIX)


# ---- template.yaml's copy ---------------------------------------------------------------------
def _rule_patterns() -> dict[str, dict[str, Any]]:
    """Function logical id -> the pattern of its EventBridge rule (one per function here)."""
    found: dict[str, dict[str, Any]] = {}
    for logical_id, function in resources_of_type("AWS::Serverless::Function").items():
        for event in function.get("Properties", {}).get("Events", {}).values():
            if event["Type"] == "EventBridgeRule":
                found[logical_id] = event["Properties"]["Pattern"]
    return found


def test_the_templates_rules_match_the_contracts_sources_and_detail_types() -> None:
    patterns = _rule_patterns()
    assert patterns["SpotFunction"]["source"] == [contract.EC2_SOURCE]
    assert patterns["SpotFunction"]["detail-type"] == [
        contract.SPOT_INTERRUPTION_WARNING,
        contract.REBALANCE_RECOMMENDATION,
    ]
    assert patterns["InstanceStateFunction"]["source"] == [contract.EC2_SOURCE]
    assert patterns["InstanceStateFunction"]["detail-type"] == [contract.INSTANCE_STATE_CHANGE]
    assert patterns["ReportsFunction"]["source"] == [contract.TRAINER_SOURCE, contract.INSTANCE_SOURCE]
    assert patterns["ReportsFunction"]["detail-type"] == list(contract.REPORT_DETAIL_TYPES)
    assert patterns["IdleFunction"]["source"] == [contract.CLOUDWATCH_SOURCE]
    assert patterns["IdleFunction"]["detail-type"] == [contract.ALARM_STATE_CHANGE]
    assert patterns["BudgetFunction"]["source"] == [contract.COST_EXPLORER_SOURCE]
    assert patterns["BudgetFunction"]["detail-type"] == [contract.ANOMALY_DETECTED]


def test_the_idle_rule_matches_the_alarm_names_the_control_plane_creates() -> None:
    alarm_filter = _rule_patterns()["IdleFunction"]["detail"]["alarmName"][0]["prefix"]["Fn::Sub"]
    name = contract.idle_alarm_name("${AWS::StackName}", "i-0123456789abcdef0")
    assert name.startswith(alarm_filter)
    assert alarm_filter.startswith(contract.IDLE_ALARM_PREFIX)


def test_the_templates_iam_grants_cover_the_names_the_control_plane_gives() -> None:
    template = (ROOT / "template.yaml").read_text(encoding="utf-8")
    stack = "${AWS::StackName}"
    for arn_part, pattern, name in [
        ("placement-group/", "gpujobs-*", contract.placement_group_name("j-0123456789abcdef", 1)),
        ("alarm:", f"{contract.IDLE_ALARM_PREFIX}{stack}-i-*", contract.idle_alarm_name(stack, "i-0123456789abcdef0")),
        ("budget/", f"gpujobs-{stack}-*", contract.budget_name(stack, "ml-research")),
        ("budget/", f"gpujobs-{stack}-*", contract.budget_name(stack, contract.ALL_TEAMS_SCOPE)),
    ]:
        assert arn_part + pattern in template
        assert fnmatch.fnmatchcase(name, pattern), (name, pattern)
    for tag in (contract.STACK_TAG, contract.JOB_TAG, contract.ATTEMPT_TAG, contract.TEAM_TAG, contract.NAME_TAG):
        assert tag in template


# ---- no other copy ------------------------------------------------------------------------------
_TOO_COMMON = {contract.NAME_TAG, contract.ALL_TEAMS_SCOPE, contract.CONTROL_PLANE_SOURCE, contract.RESOURCE_PREFIX}
"""Values that are also ordinary words here ("gpujobs" is the default stack name); compared above, not searched."""


def _shared_strings() -> dict[str, str]:
    """Every string constant of the contract that is distinctive enough to search for."""
    return {
        name: value
        for name, value in vars(contract).items()
        if name.isupper() and isinstance(value, str) and value not in _TOO_COMMON
    }


def _sources() -> Iterator[tuple[str, ast.Module]]:
    for folder in SOURCE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative not in COPIES:
                yield relative, ast.parse(path.read_text(encoding="utf-8"))


def _docstrings(tree: ast.Module) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            ids |= {
                id(stmt.value) for stmt in body if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
            }
    return ids


def _strays(path: str, tree: ast.Module) -> list[str]:
    """Literals of a shared name (docstrings aside) and literal sets of EC2 instance states."""
    wanted = {value: name for name, value in _shared_strings().items()}
    states = set(contract.INSTANCE_STATES)
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if node.value in wanted:
                found.append(f"{path}:{node.lineno}: {node.value!r} is contract.{wanted[node.value]}")
        elif isinstance(node, ast.Tuple | ast.List | ast.Set):
            items = [e.value for e in node.elts if isinstance(e, ast.Constant)]
            if len(items) >= 2 and len(items) == len(node.elts) and set(items) <= states:
                found.append(f"{path}:{node.lineno}: instance states {items}: use the contract's")
    return found


def test_no_module_spells_a_shared_name_outside_the_contract_and_its_copies() -> None:
    assert [stray for path, tree in _sources() for stray in _strays(path, tree)] == []


def test_the_search_finds_a_planted_copy_and_leaves_prose_alone() -> None:
    planted = ast.parse(
        '"""Reports Job Exited, in prose."""\nTAG = "gpujobs:job-id"\nGONE = ("stopped", "terminated")\n'
    )
    assert _strays("planted.py", planted) == [
        "planted.py:2: 'gpujobs:job-id' is contract.JOB_TAG",
        "planted.py:3: instance states ['stopped', 'terminated']: use the contract's",
    ]


def test_the_bootstrap_accepts_exactly_the_keeps_a_spec_may_ask_for() -> None:
    assert MAX_KEEP_ON_FAILURE.total_seconds() == instance_rundoc.MAX_KEEP_SECONDS
