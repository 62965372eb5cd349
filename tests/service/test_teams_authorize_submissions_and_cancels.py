"""Who may act for which team, on fakes: a sender outside a team can neither submit for it, squat its
job ids, nor cancel its jobs; a client_token names one spec; a rejection never takes a valid id."""

from __future__ import annotations

import json

import pytest

from gpujobs.domain.job_ids import job_id_for
from gpujobs.domain.states import JobState
from gpujobs.domain.teams import parse_team_config
from gpujobs.service.jobs import CancelRefusedError
from gpujobs_fakes.memory import StaticTeamConfig
from tests.service.conftest import World, spec

VISION = "AROAVISIONEXAMPLE0001"
SPEECH = "AROASPEECHEXAMPLE0002"
TEAMS = {
    "teams": {
        "vision": {"principals": [VISION], "instance_types": ["g5.xlarge", "g6.xlarge"], "max_nodes": 2},
        "speech": {"principals": [SPEECH]},
    }
}


@pytest.fixture
def config() -> StaticTeamConfig:
    return StaticTeamConfig(parse_team_config(json.dumps(TEAMS)))


@pytest.fixture
def teams(world: World, config: StaticTeamConfig) -> World:
    return world.rewire(teams=config)


def send(world: World, document: dict[str, object], *, sender: str | None, message_id: str) -> JobState:
    outcome = world.service.handle_message(json.dumps(document), message_id=message_id, sender=sender)
    return outcome.job.state


def test_a_spec_for_a_team_the_sender_may_not_use_is_rejected_naming_team_and_sender(teams: World) -> None:
    outcome = teams.service.handle_message(
        json.dumps(spec(team="vision")), message_id="m-1", sender=f"{SPEECH}:mallory"
    )

    assert outcome.job.state is JobState.REJECTED
    assert any(p.startswith("team: ") and "'vision'" in p and SPEECH in p for p in outcome.job.problems)
    assert teams.compute.calls == []


def test_the_teams_own_role_session_submits_and_launches(teams: World) -> None:
    assert send(teams, spec(team="vision"), sender=f"{VISION}:alice", message_id="m-1") is JobState.RUNNING


def test_instance_types_and_nodes_beyond_the_teams_limits_are_rejected_naming_the_field(teams: World) -> None:
    outcome = teams.service.handle_message(
        json.dumps(spec(team="vision", instance_types=["p4d.24xlarge"], nodes=4)), message_id="m-1", sender=VISION
    )

    assert outcome.job.state is JobState.REJECTED
    assert any(p.startswith("instance_types: ") and "p4d.24xlarge" in p for p in outcome.job.problems)
    assert any(p.startswith("nodes: ") for p in outcome.job.problems)
    assert teams.compute.calls == []


def test_an_unauthorized_sender_cannot_squat_another_teams_job_id(teams: World) -> None:
    # given mallory guesses the token vision's nightly run will use, and submits it first
    squat = spec(team="vision", client_token="nightly-1", image="evil/miner:1")
    assert send(teams, squat, sender=SPEECH, message_id="m-mallory") is JobState.REJECTED

    # when vision submits its own spec with that token
    outcome = teams.service.handle_message(
        json.dumps(spec(team="vision", client_token="nightly-1")), message_id="m-vision", sender=VISION
    )

    # then it is vision's job, under the id vision computed, and it runs
    assert outcome.job.job_id == job_id_for(client_token="nightly-1", team="vision", message_id=None)
    assert outcome.created
    assert outcome.job.state is JobState.RUNNING
    assert teams.store.get(outcome.job.job_id).require_spec().image != "evil/miner:1"


def test_the_same_token_with_a_different_spec_is_rejected_as_a_conflict_never_mapped_onto_the_job(
    teams: World,
) -> None:
    first = teams.service.handle_message(
        json.dumps(spec(team="vision", client_token="tok-1")), message_id="m-1", sender=VISION
    )

    second = teams.service.handle_message(
        json.dumps(spec(team="vision", client_token="tok-1", command=["python", "other.py"])),
        message_id="m-2",
        sender=VISION,
    )

    assert second.job.job_id != first.job.job_id
    assert second.job.state is JobState.REJECTED
    assert any(p.startswith("client_token: ") and first.job.job_id in p for p in second.job.problems)
    original = teams.store.get(first.job.job_id)
    assert original.require_spec().command == spec()["command"]
    assert len(teams.compute.calls) == 1
    redelivered = teams.service.handle_message(
        json.dumps(spec(team="vision", client_token="tok-1", command=["python", "other.py"])),
        message_id="m-2",
        sender=VISION,
    )
    assert redelivered.job.job_id == second.job.job_id
    assert not redelivered.created


def test_the_same_token_with_the_same_spec_is_the_same_job(teams: World) -> None:
    first = teams.service.handle_message(
        json.dumps(spec(client_token="t", team="vision")), message_id="a", sender=VISION
    )
    again = teams.service.handle_message(
        json.dumps(spec(client_token="t", team="vision")), message_id="b", sender=VISION
    )

    assert again.job.job_id == first.job.job_id
    assert not again.created


def test_a_bad_first_submission_never_blocks_the_good_one_with_the_same_token(teams: World) -> None:
    bad = teams.service.handle_message(
        json.dumps(spec(team="vision", client_token="tok-2", nodes=0)), message_id="m-1", sender=VISION
    )
    good = teams.service.handle_message(
        json.dumps(spec(team="vision", client_token="tok-2")), message_id="m-2", sender=VISION
    )

    assert bad.job.state is JobState.REJECTED
    assert good.job.job_id == job_id_for(client_token="tok-2", team="vision", message_id=None)
    assert good.job.state is JobState.RUNNING


def test_a_cancel_from_outside_the_jobs_team_is_refused_and_the_job_keeps_running(teams: World) -> None:
    job = teams.service.handle_message(json.dumps(spec(team="vision")), message_id="m-1", sender=VISION).job

    with pytest.raises(CancelRefusedError) as refused:
        teams.service.handle_message(json.dumps({"cancel_job_id": job.job_id}), message_id="m-2", sender=SPEECH)

    assert refused.value.sender == SPEECH
    assert teams.store.get(job.job_id).state is JobState.RUNNING
    assert len(teams.compute.live()) == 1


def test_a_cancel_from_the_jobs_team_is_honoured(teams: World) -> None:
    job = teams.service.handle_message(json.dumps(spec(team="vision")), message_id="m-1", sender=VISION).job

    cancelled = teams.service.handle_message(
        json.dumps({"cancel_job_id": job.job_id}), message_id="m-2", sender=f"{VISION}:bob"
    )

    assert cancelled.job.state is JobState.CANCELLED
    assert teams.compute.live() == []


def test_a_cancel_naming_something_that_is_not_a_job_id_is_rejected_not_looked_up(teams: World) -> None:
    outcome = teams.service.handle_message(json.dumps({"cancel_job_id": "x" * 5000}), message_id="m-1", sender=VISION)

    assert outcome.job.state is JobState.REJECTED
    assert outcome.job.problems[0].startswith("cancel_job_id: ")


def test_the_team_configuration_is_loaded_once_per_service(teams: World, config: StaticTeamConfig) -> None:
    for n in range(3):
        send(teams, spec(team="vision"), sender=VISION, message_id=f"m-{n}")

    assert config.loads == 1


def test_without_a_team_configuration_any_sender_submits_and_cancels_as_before(world: World) -> None:
    job = world.service.handle_message(json.dumps(spec(team="vision")), message_id="m-1", sender=SPEECH).job
    assert job.state is JobState.RUNNING

    cancelled = world.service.handle_message(json.dumps({"cancel_job_id": job.job_id}), message_id="m-2", sender=None)

    assert cancelled.job.state is JobState.CANCELLED
