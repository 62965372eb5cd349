"""Each strategy on the hand-made zones (conftest), against figures worked out by hand.

Zone `a` runs the job first (booted at 600 s, a save committed at 2412 s with 1800 s of work) and
loses its room at 3600 s. What each strategy then pays and loses is written out in each test.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bench.replay.anchors import on_demand, sagemaker_like, skypilot_like, uniform_progress
from bench.replay.control_plane import ControlPlaneReplay
from bench.replay.model import Params, Result
from bench.replay.suite import STRATEGIES
from bench.replay.traces import load_trace_sets
from gpujobs.domain.states import JobState
from tests.bench.conftest import write_zones


def figures(result: Result) -> tuple[float, float | None, float | None, int, int]:
    cost = result.cost_per_useful_gpu_hour
    hours = result.hours_to_finish
    return (
        round(result.goodput, 6),
        None if cost is None else round(cost, 6),
        None if hours is None else round(hours, 6),
        result.steps_lost,
        result.interruptions,
    )


def test_gpujobs_saves_on_the_warning_and_its_replacement_boots_in_the_other_zone_at_once(two_zones, params):
    # The warning at 3480 s: the trainer saves its 2880 s of work (committed at 3492 s), exits 75 and
    # powers off. The replacement, launched in `b` at 3480 s, boots, restores (ready at 4140 s) and
    # does the remaining 4320 s by 8460 s. Paid: 3492 s in `a` + 4980 s in `b` = 8472 s.
    replay = ControlPlaneReplay(two_zones, params)
    result = replay.replay()
    assert figures(result) == (round(7200 / 8472, 6), round(8472 / 3600 / 2, 6), 2.35, 0, 1)

    # ... and it was the control plane's own doing, through the service layer and the fake EC2:
    job = replay.job
    assert job.state is JobState.SUCCEEDED
    assert job.interruptions == 1
    ran = [(a.zone, a.end_reason) for a in job.attempts if a.instance_ids]
    assert ran == [("a", "interrupted"), ("b", "succeeded")]
    launched = [(r.subnet.zone, r.market.value) for r in replay.compute.calls]
    assert launched == [("a", "spot"), ("b", "spot")]  # `b` had no room at 0 s, `a` at once after the warning
    first = next(a for a in job.attempts if a.zone == "a")
    assert replay.stack.signaller.signals == [(first.instance_ids, first.container_name(job.job_id))]
    assert (first.checkpoint_step, first.interrupted_at is not None) == (2880, True)


def test_skypilot_like_notices_the_reclaim_by_polling_and_redoes_the_work_since_the_last_save(two_zones, params):
    # Reclaimed at 3600 s without using the warning: 3000 s of work done, 1800 s committed, so
    # 1200 steps are lost. Noticed at the 3600 s poll, relaunched in `b`: ready at 4260 s, done at
    # 4260 + 5400 = 9660 s. Paid: 3600 s + 6060 s = 9660 s.
    paid_9660_s = (round(7200 / 9660, 6), round(9660 / 3600 / 2, 6))
    assert figures(skypilot_like(two_zones, params)) == (*paid_9660_s, 2.683333, 1200, 1)


def test_sagemaker_like_waits_for_its_own_zone_to_come_back(two_zones, params):
    # The same reclaim and loss; then it waits, unpaid, for `a` to have room again at 7200 s:
    # ready at 7860 s, done at 13260 s. Paid: 3600 s + 6060 s, as skypilot-like, but later.
    paid_9660_s = (round(7200 / 9660, 6), round(9660 / 3600 / 2, 6))
    assert figures(sagemaker_like(two_zones, params)) == (*paid_9660_s, 3.683333, 1200, 1)


def test_on_demand_pays_only_the_boot_but_at_three_times_the_price(two_zones, params):
    # 600 s of boot, then 7200 s of work: 7800 s at $3/h.
    assert figures(on_demand(two_zones, params)) == (round(7200 / 7800, 6), 3.25, round(7800 / 3600, 6), 0, 0)


def test_uniform_progress_with_slack_rides_spot_and_moves_zones_on_a_reclaim(two_zones, params):
    # Slack to spare: spot in `a`, reclaimed at the 3600 s tick, then spot in `b` at once, like
    # skypilot-like (the changeover costs the boot and the restore).
    result = uniform_progress(two_zones, dataclasses.replace(params, deadline_hours=10.0))
    assert figures(result) == figures(skypilot_like(two_zones, params))
    assert result.met_deadline is True


def test_uniform_progress_without_slack_goes_on_demand_from_the_start(two_zones, params):
    # Deadline 7920 s: the 2d safety net (work + 2 x 660 s > the 7800 s left in whole ticks) picks
    # on-demand at once, which finishes at 7800 s, in time.
    tight = dataclasses.replace(params, deadline_hours=2.2)
    result = uniform_progress(two_zones, tight)
    assert figures(result) == figures(on_demand(two_zones, tight))
    assert result.met_deadline is True


def test_a_gang_of_two_counts_like_one_node_on_traces_of_twice_the_capacity(tmp_path: Path, params: Params):
    (single,) = load_trace_sets(write_zones(tmp_path / "one-node"))
    (double,) = load_trace_sets(write_zones(tmp_path / "two-nodes", per_node=2))
    pair = dataclasses.replace(params, nodes=2)
    for name, strategy in STRATEGIES.items():
        if name == "uniform-progress":
            continue
        one, two = strategy(single, params), strategy(double, pair)
        assert figures(two) == figures(one), name
        assert two.cost_usd == pytest.approx(2 * one.cost_usd), name


def test_a_gang_of_two_is_interrupted_when_one_of_its_nodes_is_reclaimed(tmp_path: Path, params: Params):
    # `a` drops from 2 to 1 instance at 3600 s: the gang cannot run on one node.
    (traces,) = load_trace_sets(write_zones(tmp_path / "two-nodes", per_node=2))
    counts = {p.name: list(p.counts) for p in traces.pools}
    counts["a"][6:12] = [1] * 6
    for name, data in counts.items():
        (traces.folder / f"{name}.json").write_text(f'{{"metadata": {{"gap_seconds": 600}}, "data": {data}}}')
    (partial,) = load_trace_sets(traces.folder)
    pair = dataclasses.replace(params, nodes=2)
    replay = ControlPlaneReplay(partial, pair)
    result = replay.replay()
    assert figures(result)[3:] == (0, 1)
    assert [len(a.instance_ids) for a in replay.job.attempts if a.instance_ids] == [2, 2]
    assert figures(skypilot_like(partial, pair))[3:] == (1200, 1)


def test_a_job_longer_than_the_trace_has_no_hours_to_finish_and_counts_only_what_it_committed(two_zones, params):
    # 20 hours of work on a 10-hour trace: gpujobs runs as above until the warning, then in `b` from
    # 3480 s to the trace's end at 36000 s (ready at 4140 s). Its last save that committed in time
    # started at 34740 s, with 2880 + 30600 = 33480 s of work; the 1260 s after it die with the trace.
    # Paid: 3492 s + 32520 s = 36012 s.
    result = ControlPlaneReplay(two_zones, dataclasses.replace(params, hours_of_work=20.0)).replay()
    assert figures(result) == (round(33480 / 36012, 6), round(36012 / 33480, 6), None, 1260, 1)


def test_a_replacement_that_boots_before_the_warning_save_commits_waits_for_it(two_zones, params):
    # A 5 s boot and a 60 s commit: the replacement, launched in `b` at the warning (3480 s), is up
    # at 3485 s, but its run document names attempt 1 to wait for, whose save of 3475 s of work
    # commits at 3540 s. It resumes from that save (ready at 3600 s after the restore), so nothing
    # is lost, and is done at 3600 + 3725 = 7325 s. Paid: 3540 s in `a` + 3845 s in `b`.
    quick = dataclasses.replace(params, boot_s=5.0, save_commit_s=60.0)
    replay = ControlPlaneReplay(two_zones, quick)
    assert figures(replay.replay()) == (round(7200 / 7385, 6), round(7385 / 3600 / 2, 6), round(7325 / 3600, 6), 0, 1)
    assert replay.runs[2].document.wait_for_attempt == 1
