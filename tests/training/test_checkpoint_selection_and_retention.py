"""Pure rules about the checkpoint layout: which folder a resume uses and which may be purged."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpujobs_trainer.config import TrainerConfig
from gpujobs_trainer.errors import CheckpointError, ConfigError
from gpujobs_trainer.layout import (
    CommitMarker,
    StepListing,
    parse_step_dir,
    resume_candidates,
    size_mismatches,
    step_dir_name,
    steps_to_purge,
)
from gpujobs_trainer.storage import LocalStore, open_store


def _marker(step: int, **files: int) -> CommitMarker:
    return CommitMarker(
        step=step,
        world_size=2,
        torch_version="2.13.0",
        reason="periodic",
        files=files or {"__0_0.distcp": 10},
        time="2030-01-01T00:00:00+00:00",
        position={"epoch": 3, "offset": 7},
    )


def test_step_folders_are_eight_digit_zero_padded_and_sort_like_numbers() -> None:
    assert step_dir_name(42) == "step-00000042"
    assert parse_step_dir("step-00000042/") == 42
    assert parse_step_dir("step-42") is None
    assert parse_step_dir("notes.txt") is None
    assert sorted([step_dir_name(s) for s in (1000, 20, 300)]) == [step_dir_name(s) for s in (20, 300, 1000)]


def test_resume_tries_committed_checkpoints_newest_first_and_never_a_torn_one() -> None:
    listing = StepListing.of({100: True, 200: True, 300: False})
    assert resume_candidates(listing) == [200, 100]


def test_retention_keeps_two_commits_even_when_asked_for_one_and_drops_old_torn_folders() -> None:
    listing = StepListing.of({100: True, 150: False, 200: True, 300: True, 400: False})
    assert steps_to_purge(listing, keep=1) == [100, 150]  # 400 may still be in flight
    assert steps_to_purge(listing, keep=3) == [150]


def test_nothing_is_purged_before_the_first_commit() -> None:
    assert steps_to_purge(StepListing.of({100: False}), keep=2) == []


def test_the_commit_marker_round_trips_and_a_malformed_one_is_an_error() -> None:
    marker = _marker(7, **{"__0_0.distcp": 5, ".metadata": 9})
    assert CommitMarker.from_json(marker.to_json()) == marker
    with pytest.raises(CheckpointError, match=r"COMMIT\.json is malformed"):
        CommitMarker.from_json('{"step": 7}')


def test_files_that_are_missing_or_resized_are_named() -> None:
    marker = _marker(7, a=1, b=2)
    assert size_mismatches(marker, {"a": 1, "b": 2}) == []
    assert size_mismatches(marker, {"b": 3}) == ["a is missing", "b has 3 bytes, expected 2"]


def test_a_local_store_lists_only_folders_with_a_marker_as_committed(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    for step in (100, 200):
        store.staging_dir(step).mkdir()
        (store.staging_dir(step) / "__0_0.distcp").write_bytes(b"x" * 10)
    store.write_commit(_marker(100))
    assert store.listing() == StepListing(committed=(100,), uncommitted=(200,))
    assert store.read_commit(100).position == {"epoch": 3, "offset": 7}
    (store.staging_dir(100) / "__0_0.distcp").write_bytes(b"short")
    with pytest.raises(CheckpointError, match=r"incomplete: __0_0\.distcp has 5 bytes, expected 10"):
        store.fetch(100, store.read_commit(100))


def test_checkpoint_uris_choose_the_store_and_unknown_schemes_are_refused(tmp_path: Path) -> None:
    assert isinstance(open_store(f"file://{tmp_path}", local_dir=""), LocalStore)
    assert isinstance(open_store(str(tmp_path), local_dir=""), LocalStore)
    with pytest.raises(CheckpointError, match="unsupported scheme 'gs'"):
        open_store("gs://bucket/x", local_dir="")


def test_the_environment_contract_names_the_missing_or_bad_variable() -> None:
    with pytest.raises(ConfigError, match="GPUJOBS_CHECKPOINT_URI is not set"):
        TrainerConfig.from_env({})
    with pytest.raises(ConfigError, match="GPUJOBS_HEARTBEAT_SECONDS must be a number"):
        TrainerConfig.from_env({"GPUJOBS_CHECKPOINT_URI": "/x", "GPUJOBS_HEARTBEAT_SECONDS": "soon"})
    config = TrainerConfig.from_env({"GPUJOBS_CHECKPOINT_URI": "/x", "GPUJOBS_KEEP_CHECKPOINTS": "1"})
    assert config.keep_checkpoints == 2
    assert config.imds_mode == "auto"
    assert config.collective_timeout_seconds == 120
    explicit = TrainerConfig.from_env(
        {"GPUJOBS_CHECKPOINT_URI": "/x", "AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://h/"}
    )
    assert explicit.imds_mode == "required"
    assert explicit.imds_endpoint == "http://h"
