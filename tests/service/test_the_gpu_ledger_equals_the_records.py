"""The GPU ledger cannot drift (issue 20): 50 teams, 10,000 queued jobs, admission rounds racing
launches, exits, cancels and spot warnings on four threads, and after every step the ledger's
counters equal what the records stand for (`domain.ledger.truth`). Every write carries its own
change to the ledger in the same atomic write, so a write that loses its race adds nothing and a
retry adds what its fresh record's change is: no GPU is counted twice, none is lost."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from gpujobs.domain.job import Job
from gpujobs.domain.ledger import holds, truth, waits
from gpujobs.domain.reports import ExitReport
from gpujobs.domain.spec import validate_spec
from gpujobs.domain.states import JobState
from gpujobs.domain.teams import parse_team_config
from gpujobs.service.ports import Backoff
from gpujobs_fakes.memory import StaticTeamConfig
from tests.service.conftest import World

TEAMS = 50
JOBS = 10_000
PRINCIPAL = "AROAEXAMPLEID1234567"


def fleet_of_teams() -> StaticTeamConfig:
    teams: dict[str, Any] = {
        f"team-{t:02d}": {"principals": [PRINCIPAL], "gpus": 16, "weight": 1 + t % 3, "borrow": t % 2 == 0}
        for t in range(TEAMS)
    }
    return StaticTeamConfig(parse_team_config(json.dumps({"teams": teams, "fleet": {"max_gpus": 640}})))


def all_jobs(world: World) -> list[Job]:
    return [job for state in JobState for job in world.store.list_by_state(state, limit=100_000)]


@pytest.fixture
def crowded() -> World:
    world = World()
    world.rewire(teams=fleet_of_teams(), backoff=Backoff(sleep=lambda _s: None))
    for n in range(JOBS):
        spec = validate_spec(
            {
                "name": f"j{n}",
                "image": "img:1",
                "command": ["python", "train.py"],
                "instance_types": ["g5.xlarge", "g6.xlarge"],
                "gpus_per_node": 1 + n % 4,
                "team": f"team-{n % TEAMS:02d}",
                "priority": ("low", "normal", "high")[n % 3],
            }
        )
        world.store.create(Job.submitted(job_id=f"j-{n:016x}", spec=spec, now=world.clock.now(), message_id=f"m-{n}"))
    return world


def test_fifty_teams_and_ten_thousand_queued_jobs_keep_the_ledger_equal_to_the_records_through_racing_steps(
    crowded: World,
) -> None:
    world, rng = crowded, random.Random(20)
    assert world.store.ledger() == truth(all_jobs(world))
    assert world.store.ledger().waiting == JOBS

    def finish(job: Job) -> Callable[[], object]:
        def run() -> None:
            attempt = job.current_attempt
            if attempt is None:
                return
            for iid in attempt.instance_ids:
                world.reactions.report(
                    ExitReport(job_id=job.job_id, attempt=attempt.number, instance_id=iid, exit_code=0)
                )
                world.compute.terminate([iid])
                world.reactions.instance_state(iid, "terminated")

        return run

    admitted_ever = 0
    for _step in range(30):
        jobs = all_jobs(world)
        running = [j for j in jobs if j.state is JobState.RUNNING]
        waiting = [j for j in jobs if waits(j)]
        actions: list[Callable[[], object]] = [world.reconciler.run]
        actions += [finish(j) for j in rng.sample(running, min(len(running), 12))]
        actions += [lambda j=j: world.service.launch(j.job_id) for j in rng.sample(waiting, min(len(waiting), 8))]
        actions += [lambda j=j: world.service.cancel(j.job_id) for j in rng.sample(jobs, 4)]
        actions += [
            lambda j=j: world.reactions.spot_warning(j.instance_ids[0])
            for j in rng.sample(running, min(len(running), 3))
            if j.instance_ids
        ]
        rng.shuffle(actions)
        with ThreadPoolExecutor(max_workers=4) as pool:
            for done in [pool.submit(action) for action in actions]:
                done.result()

        everything = all_jobs(world)
        ledger = world.store.ledger()
        assert ledger == truth(everything), f"step {_step}: the ledger drifted from the records"
        assert ledger.gpus <= 640  # the fleet's cap
        for team in {j.team for j in everything}:
            own = sum(
                j.require_spec().gpus_per_node * j.require_spec().nodes
                for j in everything
                if holds(j) and j.team == team and j.admission is not None and not j.admission.borrowed
            )
            assert own <= 16, f"{team} holds {own} GPUs of its own, over its quota of 16"
        admitted_ever = max(admitted_ever, sum(1 for j in everything if j.admission is not None or j.state.is_terminal))
    assert admitted_ever > 100  # the steps did admit, launch and end work, not only wait
