"""The team configuration: parsed strictly (a mistake names its field), and what it allows."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpujobs.domain.spec import JobSpec
from gpujobs.domain.teams import TeamConfigError, TeamDirectory, parse_team_config

VISION_ROLE = "AROAVISIONEXAMPLE0001"
SPEECH_ROLE = "AROASPEECHEXAMPLE0002"


def config(**vision: Any) -> str:
    entry = {"principals": [VISION_ROLE], **vision}
    return json.dumps({"teams": {"vision": entry, "speech": {"principals": [SPEECH_ROLE]}}})


def spec(**changes: Any) -> JobSpec:
    base = {"name": "digits", "image": "repo/train:1", "command": ["python"], "instance_types": ["g5.xlarge"]}
    return JobSpec.model_validate({**base, "team": "vision", **changes})


def test_a_role_session_acts_for_the_team_that_lists_the_role() -> None:
    teams = parse_team_config(config())

    assert teams.refusal(spec(), f"{VISION_ROLE}:alice") == []
    assert teams.may_act_for("vision", f"{VISION_ROLE}:alice")
    assert not teams.may_act_for("vision", f"{SPEECH_ROLE}:bob")


def test_another_teams_principal_is_refused_naming_the_team_and_the_sender() -> None:
    teams = parse_team_config(config())

    (problem,) = teams.refusal(spec(), f"{SPEECH_ROLE}:bob")

    assert problem.startswith("team: ")
    assert "'vision'" in problem
    assert SPEECH_ROLE in problem


def test_a_message_without_a_sender_is_refused_once_teams_are_configured() -> None:
    assert parse_team_config(config()).refusal(spec(), None) != []


def test_a_team_that_is_not_configured_is_refused_by_name() -> None:
    (problem,) = parse_team_config(config()).refusal(spec(team="audio"), f"{VISION_ROLE}:alice")

    assert problem.startswith("team: 'audio' is not a team of this stack")


def test_instance_types_and_nodes_beyond_the_teams_limits_are_refused_naming_the_field() -> None:
    teams = parse_team_config(config(instance_types=["g5.xlarge"], max_nodes=2))

    problems = teams.refusal(spec(instance_types=["g5.xlarge", "p4d.24xlarge"], nodes=4), f"{VISION_ROLE}:a")

    assert any(p.startswith("instance_types: ") and "p4d.24xlarge" in p for p in problems)
    assert any(p.startswith("nodes: ") and "(2)" in p for p in problems)


def test_without_a_configuration_any_sender_may_use_any_team() -> None:
    teams = TeamDirectory.open()

    assert teams.refusal(spec(team="anything"), None) == []
    assert teams.may_act_for("anything", "AIDAANYONE0000000000")


@pytest.mark.parametrize(
    ("document", "field"),
    [
        pytest.param("{not json", "team configuration", id="not-json"),
        pytest.param(json.dumps({"teams": {}}), "teams", id="no-teams"),
        pytest.param(json.dumps({"groups": {}}), "team configuration", id="wrong-top-level"),
        pytest.param(json.dumps({"teams": {"Vision": {"principals": [VISION_ROLE]}}}), "teams.Vision", id="team-name"),
        pytest.param(config(principals=[]), "teams.vision.principals", id="no-principals"),
        pytest.param(
            config(principals=["arn:aws:iam::123456789012:role/vision"]), "teams.vision.principals", id="an-arn"
        ),
        pytest.param(config(max_nodes=0), "teams.vision.max_nodes", id="max-nodes-0"),
        pytest.param(config(max_nodes=True), "teams.vision.max_nodes", id="max-nodes-bool"),
        pytest.param(config(instance_types="g5.xlarge"), "teams.vision.instance_types", id="types-not-list"),
        pytest.param(config(data_buckets=["Not_A_Bucket"]), "teams.vision.data_buckets", id="bucket"),
        pytest.param(config(budget=5), "teams.vision.budget", id="unknown-field"),
    ],
)
def test_a_malformed_configuration_is_refused_naming_the_field(document: str, field: str) -> None:
    with pytest.raises(TeamConfigError) as refused:
        parse_team_config(document)

    assert str(refused.value).startswith(f"{field}: ")


def test_an_arn_is_refused_with_the_way_to_find_the_roles_unique_id() -> None:
    with pytest.raises(TeamConfigError, match="aws iam get-role"):
        parse_team_config(config(principals=["arn:aws:iam::123456789012:role/vision"]))


def test_data_buckets_are_kept_for_the_teams_jobs() -> None:
    teams = parse_team_config(config(data_buckets=["vision-datasets"]))

    assert teams.teams["vision"].data_buckets == ("vision-datasets",)
