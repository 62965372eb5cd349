"""Stories of the core: a spec on the queue becomes a recorded job and launched instances."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta

import pytest

from gpujobs.domain.job import Market
from gpujobs.domain.launching import LAUNCH_LEASE
from gpujobs.domain.states import JobState
from gpujobs.service.ports import JobNotFoundError
from tests.service.conftest import World, spec


def test_a_valid_spec_is_recorded_queued_then_launched_on_spot_in_the_first_pool(world: World) -> None:
    outcome = world.submit(spec())

    job = world.store.get(outcome.job.job_id)
    assert outcome.created
    assert job.state is JobState.RUNNING
    attempt = job.current_attempt
    assert attempt is not None
    assert (attempt.instance_type, attempt.zone, attempt.market) == ("g5.xlarge", "us-east-1a", Market.SPOT)
    assert len(attempt.instance_ids) == 1
    assert [f.instance.instance_id for f in world.compute.live()] == list(attempt.instance_ids)
    assert world.transitions(job.job_id) == [
        (None, "QUEUED", "submitted"),
        ("QUEUED", "LAUNCHING", "launch-started"),
        ("LAUNCHING", "RUNNING", "instances-launched"),
    ]


def test_the_instances_receive_the_run_document_with_command_and_env_as_literal_data(world: World) -> None:
    hostile = ["python", "-c", "print('$(rm -rf /)'); `id`; echo \"x\""]
    world.submit(spec(command=hostile, env={"NOTE": "a;b && $(c) `d` 'e'"}))

    request = world.compute.calls[0]
    document = json.loads(request.user_data)
    assert document["command"] == hostile
    assert document["env"] == {"NOTE": "a;b && $(c) `d` 'e'"}
    assert document["checkpoint_uri"] == f"s3://ckpt-bucket/jobs/{request.job_id}/ckpt"
    assert document["event_bus"] == "gpujobs-jobs"


def test_a_gang_launches_all_nodes_in_one_request_with_a_cluster_placement_group(world: World) -> None:
    outcome = world.submit(spec(nodes=4))

    (request,) = world.compute.calls
    assert request.count == 4
    assert request.placement_group == f"gpujobs-{outcome.job.job_id}-a1"
    assert len(world.store.get(outcome.job.job_id).instance_ids) == 4


def test_capacity_shortage_walks_the_ladder_zones_then_types_and_records_every_refusal(world: World) -> None:
    world.compute.refuse = {
        ("g5.xlarge", "us-east-1a", "spot"): "InsufficientInstanceCapacity",
        ("g5.xlarge", "us-east-1b", "spot"): "SpotMaxPriceTooLow",
    }

    job = world.store.get(world.submit(spec()).job.job_id)

    attempt = job.current_attempt
    assert attempt is not None
    assert (attempt.instance_type, attempt.zone, attempt.market) == ("g6.xlarge", "us-east-1a", Market.SPOT)
    assert [(t.instance_type, t.zone, t.error_code) for t in attempt.tries] == [
        ("g5.xlarge", "us-east-1a", "InsufficientInstanceCapacity"),
        ("g5.xlarge", "us-east-1b", "SpotMaxPriceTooLow"),
    ]
    assert len({c.client_token for c in world.compute.calls}) == 3


def test_spot_first_falls_back_to_on_demand_when_no_spot_pool_has_capacity(world: World) -> None:
    world.compute.refuse = {
        (t, z, "spot"): "InsufficientInstanceCapacity"
        for t in ("g5.xlarge", "g6.xlarge")
        for z in ("us-east-1a", "us-east-1b")
    }

    job = world.store.get(world.submit(spec()).job.job_id)

    assert job.state is JobState.RUNNING
    assert job.current_attempt is not None
    assert job.current_attempt.market is Market.ON_DEMAND
    assert len(job.current_attempt.tries) == 4


def test_a_spot_only_job_never_lands_on_demand_and_waits_queued_with_a_next_try_time(world: World) -> None:
    world.compute.refuse = {
        (t, z, "spot"): "InsufficientInstanceCapacity"
        for t in ("g5.xlarge", "g6.xlarge")
        for z in ("us-east-1a", "us-east-1b")
    }

    job = world.store.get(world.submit(spec(capacity="spot")).job.job_id)

    assert job.state is JobState.QUEUED
    assert job.hold_reason is None
    assert job.next_try_at is not None
    assert job.next_try_at > world.clock.now()
    assert "no capacity" in job.status_detail
    assert "g6.xlarge" in job.status_detail
    assert world.compute.live() == []
    assert all(c.market is Market.SPOT for c in world.compute.calls)
    assert job.history[-1].reason == "no-capacity"


def test_a_queued_job_is_not_relaunched_before_its_next_try_time(world: World) -> None:
    world.compute.refuse = {
        ("g5.xlarge", z, "on-demand"): "InstanceLimitExceeded" for z in ("us-east-1a", "us-east-1b")
    }
    job_id = world.submit(spec(capacity="on-demand", instance_types=["g5.xlarge"])).job.job_id
    calls = len(world.compute.calls)

    world.service.launch(job_id)
    assert len(world.compute.calls) == calls

    world.compute.refuse = {}
    world.clock.advance(minutes=31)
    job = world.service.launch(job_id)
    assert job.state is JobState.RUNNING
    assert job.current_attempt is not None
    assert job.current_attempt.number == 2


def test_the_same_message_delivered_twice_yields_one_job_and_one_set_of_instances(world: World) -> None:
    first = world.submit(spec(nodes=2), message_id="m-1")
    second = world.submit(spec(nodes=2), message_id="m-1")

    assert first.job.job_id == second.job.job_id
    assert not second.created
    assert len(world.compute.calls) == 1
    assert len(world.compute.live()) == 2


def test_the_same_client_token_in_two_messages_yields_one_job(world: World) -> None:
    first = world.submit(spec(client_token="tok-42"), message_id="m-1")
    second = world.submit(spec(client_token="tok-42"), message_id="m-2")

    assert first.job.job_id == second.job.job_id
    assert len(world.compute.live()) == 1


def test_an_invalid_spec_is_recorded_rejected_with_reasons_naming_fields_and_nothing_launches(world: World) -> None:
    outcome = world.service.handle_message(
        json.dumps(spec(nodes=0, gpu_per_node=2, instance_types=["x1.32xlarge"])), message_id="bad-1"
    )

    job = world.store.get(outcome.job.job_id)
    assert job.state is JobState.REJECTED
    assert any(p.startswith("nodes:") for p in job.problems)
    assert any(p.startswith("gpu_per_node: unknown field") for p in job.problems)
    assert any(p.startswith("instance_types:") and "allow-list" in p for p in job.problems)
    assert world.compute.calls == []
    (event,) = world.publisher.events
    assert event.target is JobState.REJECTED
    assert event.extra["problems"] == list(job.problems)


def test_a_rejected_message_redelivered_is_recorded_once(world: World) -> None:
    world.service.handle_message("{not json", message_id="bad-2")
    again = world.service.handle_message("{not json", message_id="bad-2")

    assert not again.created
    assert again.job.problems[0].startswith("(spec): invalid JSON")
    assert len(world.publisher.events) == 1


def test_cancel_moves_the_job_to_cancelled_and_terminates_its_instances(world: World) -> None:
    job_id = world.submit(spec(nodes=2)).job.job_id

    world.service.handle_message(json.dumps({"cancel_job_id": job_id}), message_id="c-1")

    job = world.store.get(job_id)
    assert job.state is JobState.CANCELLED
    assert world.compute.live() == []
    assert job.current_attempt is not None
    assert job.current_attempt.end_reason == "user-cancelled"
    assert world.transitions(job_id)[-1] == ("RUNNING", "CANCELLED", "user-cancelled")


def test_cancelling_twice_or_cancelling_a_finished_job_changes_nothing(world: World) -> None:
    job_id = world.submit(spec()).job.job_id
    world.service.cancel(job_id)
    events = len(world.publisher.events)

    again = world.service.cancel(job_id)

    assert again.state is JobState.CANCELLED
    assert len(world.publisher.events) == events


def test_cancelling_an_unknown_job_is_a_typed_error(world: World) -> None:
    with pytest.raises(JobNotFoundError):
        world.service.cancel("j-0000000000000000")


def test_a_cancel_that_wins_the_race_against_a_launch_gets_the_new_instances_terminated(world: World) -> None:
    job_id_holder: list[str] = []

    def cancel_during_run_instances(request: object) -> None:
        if not job_id_holder:
            job_id_holder.append(request.job_id)
            world.service.cancel(job_id_holder[0])

    world.compute.on_run = cancel_during_run_instances
    world.submit(spec())

    job = world.store.get(job_id_holder[0])
    assert job.state is JobState.CANCELLED
    assert world.compute.live() == []


def test_a_launch_that_crashed_after_run_instances_is_adopted_not_repeated(world: World) -> None:
    class CrashAfterLaunchError(Exception):
        pass

    original_save = world.store.save

    crashed: list[bool] = []

    def crashing_save(job: object) -> object:
        # The process dies once RunInstances has returned: no later write (not even the lease
        # release) reaches the store.
        if crashed or job.state is JobState.RUNNING:
            crashed.append(True)
            raise CrashAfterLaunchError
        return original_save(job)  # type: ignore[arg-type]

    world.store.save = crashing_save  # type: ignore[method-assign]
    with pytest.raises(CrashAfterLaunchError):
        world.submit(spec(nodes=2), message_id="m-9")
    world.store.save = original_save  # type: ignore[method-assign]
    assert len(world.compute.live()) == 2

    world.submit(spec(nodes=2), message_id="m-9")  # redelivered before the lease expired: hands off
    assert world.store.get(world.compute.calls[0].job_id).state is JobState.LAUNCHING

    world.clock.current += LAUNCH_LEASE + timedelta(minutes=1)
    job = world.submit(spec(nodes=2), message_id="m-9").job

    assert job.state is JobState.RUNNING
    assert len(world.compute.live()) == 2
    assert len(world.compute.calls) == 1
    assert set(job.instance_ids) == {f.instance.instance_id for f in world.compute.live()}


def test_a_launch_rejected_for_a_configuration_error_fails_the_job_with_the_reason(world: World) -> None:
    from gpujobs.service.ports import LaunchRejectedError

    def reject(request: object) -> None:
        raise LaunchRejectedError("InvalidAMIID.Malformed", "The image id '[ami-x]' is malformed")

    world.compute.on_run = reject
    job = world.store.get(world.submit(spec()).job.job_id)

    assert job.state is JobState.FAILED
    assert "InvalidAMIID.Malformed" in job.status_detail


def test_a_run_document_too_large_for_user_data_travels_through_s3() -> None:
    from gpujobs.domain.rundoc import RunDocument, RunDocumentPointer
    from gpujobs.service.ports import UserDataTooLargeError

    def renderer(doc: RunDocument | RunDocumentPointer) -> str:
        if isinstance(doc, RunDocument):
            raise UserDataTooLargeError(20_000)
        return doc.model_dump_json()

    world = World(renderer)
    big_env = {f"BIG_{i}": "x" * 4000 for i in range(5)}
    job_id = world.submit(spec(env=big_env)).job.job_id

    key = f"jobs/{job_id}/attempt-1/run.json"
    assert json.loads(world.blobs.objects[key])["env"] == big_env
    # the attempt's report key stays in user data, beside the pointer; the S3 copy never holds it
    report_key = world.ports.report_keys.key_for(job_id=job_id, attempt=1).hex()
    checkpoint_key = world.ports.report_keys.checkpoint_key_for(job_id=job_id).hex()
    assert json.loads(world.compute.calls[0].user_data) == {
        "run_document_uri": f"s3://checkpoints/{key}",
        "run_document_sha256": hashlib.sha256(world.blobs.objects[key].encode()).hexdigest(),
        "report_key": report_key,
        "checkpoint_key": checkpoint_key,  # the job's checkpoint key travels the same way
        # whom to report to if the bootstrap must refuse the stored document
        "job_id": job_id,
        "attempt": 1,
        "event_bus": world.service.config.event_bus_name,
    }
    assert report_key not in world.blobs.objects[key]
    assert checkpoint_key not in world.blobs.objects[key]


def test_a_failed_event_publication_does_not_undo_the_recorded_job(world: World) -> None:
    def broken(events: object) -> None:
        raise RuntimeError("EventBridge unavailable")

    world.publisher.publish = broken  # type: ignore[method-assign]
    outcome = world.submit(spec())

    assert world.store.get(outcome.job.job_id).state is JobState.RUNNING


def test_a_throttled_launch_releases_its_lease_so_the_redelivered_message_launches_at_once(world: World) -> None:
    throttled = [True]

    def throttle_once(request: object) -> None:
        if throttled:
            throttled.clear()
            raise RuntimeError("RequestLimitExceeded")

    world.compute.on_run = throttle_once
    with pytest.raises(RuntimeError, match="RequestLimitExceeded"):
        world.submit(spec(), message_id="m-7")

    job = world.submit(spec(), message_id="m-7").job

    assert job.state is JobState.RUNNING
    assert job.current_attempt is not None
    assert job.current_attempt.number == 1
    assert len(world.compute.live()) == 1


def test_a_rejected_spec_with_a_client_token_is_recorded_under_its_message_id_leaving_the_token_free(
    world: World,
) -> None:
    # issue 10 reverses the old rule (recorded under the token's id): a bad first submission must
    # not occupy the id its corrected resubmission takes. `gpujobs submit --wait` watches both ids.
    from gpujobs.domain.job_ids import job_id_for

    outcome = world.submit(spec(client_token="tok-7", team="vision", nodes=99), message_id="m-3")

    assert outcome.job.state is JobState.REJECTED
    assert outcome.job.job_id == job_id_for(client_token=None, team=None, message_id="m-3")
    fixed = world.submit(spec(client_token="tok-7", team="vision"), message_id="m-4")
    assert fixed.job.job_id == job_id_for(client_token="tok-7", team="vision", message_id=None)
    assert fixed.job.state is JobState.RUNNING
