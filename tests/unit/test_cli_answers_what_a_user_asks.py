"""Stories of the questions an ML engineer asks the CLI: is every spec in this folder valid, why is
my command refused, does this type have the GPUs I asked for, what has my job cost, how much of the
GPU time I paid for did lasting work. All offline: no AWS is reached here."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpujobs.adapters.catalog import gpu_counts, on_demand_prices, packaged_catalog
from gpujobs.adapters.prices import packaged_on_demand_prices
from gpujobs.domain import documents
from gpujobs.domain.job import COMPLETED_END_REASON, Attempt, Job, Market
from gpujobs.domain.spec import argv_form, load_spec
from gpujobs.domain.states import JobState, Reason
from gpujobs_cli import commands, render
from gpujobs_cli.main import EXIT_READER_GONE, main
from gpujobs_cli.spend import spend_of

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
SPEC = "name: train\nimage: repo/train:1\ninstance_types: [g5.xlarge]\n"


@pytest.fixture(autouse=True)
def no_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(**kwargs: object) -> None:
        raise AssertionError(f"AWS was contacted: {kwargs}")

    monkeypatch.setattr(commands, "discover", refuse)


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ---- validate, many files ---------------------------------------------------------------------
def test_validate_takes_many_files_and_answers_for_each(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = str(EXAMPLES / "digits.yaml")
    bad = write(tmp_path, "bad.yaml", SPEC + "command: [python]\nnodes: 0\n")
    smoke = str(EXAMPLES / "cpu-smoke.json")

    code = main(["validate", good, bad, smoke])

    captured = capsys.readouterr()
    assert code == 1
    assert captured.out.splitlines() == [
        f"{good}: ok: digits",
        f"{bad}: nodes: Input should be greater than or equal to 1",
        f"{smoke}: ok: cpu-smoke",
    ]
    assert captured.err == "2 of 3 specs valid\n"


def test_every_example_is_valid_together(capsys: pytest.CaptureFixture[str]) -> None:
    examples = sorted(str(p) for p in EXAMPLES.iterdir() if p.suffix in (".yaml", ".json"))

    assert main(["validate", *examples]) == 0
    assert all(": ok: " in line for line in capsys.readouterr().out.splitlines())


def test_validate_json_gives_one_result_per_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = write(tmp_path, "bad.yaml", SPEC + "command: python train.py\n")

    code = main(["validate", str(EXAMPLES / "digits.yaml"), bad, "--json"])

    results = json.loads(capsys.readouterr().out)
    assert code == 1
    assert [(r["file"], r["ok"], r["name"]) for r in results] == [
        (str(EXAMPLES / "digits.yaml"), True, "digits"),
        (bad, False, None),
    ]
    assert results[0]["problems"] == []
    assert results[1]["problems"][0].startswith("command: must be a list of arguments")


def test_an_unreadable_file_among_many_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "nope.yaml")

    assert main(["validate", str(EXAMPLES / "digits.yaml"), missing]) == 2
    assert capsys.readouterr().err == f"gpujobs: cannot read {missing}: No such file or directory\n"


# ---- a string command -------------------------------------------------------------------------
def test_a_string_command_is_answered_with_its_argv_form(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = write(tmp_path, "job.yaml", SPEC + "command: python train.py --steps 600 --name 'my run'\n")

    assert main(["validate", spec]) == 1

    out = capsys.readouterr().out
    assert 'write it as command: [python, train.py, --steps, "600", --name, "my run"]' in out


@pytest.mark.parametrize(
    "line",
    [
        "python train.py",
        "torchrun --nproc-per-node 8 train.py --lr 3e-4",
        "bash -c 'echo yes && exit 0'",
        "run no null ~ .5 -1 .inf 0x1F 2025-06-01 a: b:c",
        "sh -c 'x=[1,2]; echo {a} #no-comment'",
    ],
)
def test_the_argv_form_reads_back_as_the_same_argv(line: str) -> None:
    document = documents.load(f"command: {argv_form(line)}\n")

    assert document == {"command": shlex.split(line)}


# ---- instance types and GPUs, offline ---------------------------------------------------------
def test_more_gpus_per_node_than_the_type_has_is_caught_offline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write(
        tmp_path,
        "job.yaml",
        "name: big\nimage: r/t:1\ncommand: [python]\ngpus_per_node: 4\ninstance_types: [g5.12xlarge, g5.xlarge]\n",
    )

    assert main(["validate", spec]) == 1

    assert capsys.readouterr().out == f"{spec}: instance_types: gpus_per_node is 4, but g5.xlarge has 1\n"


def test_an_unknown_instance_type_is_caught_offline_with_a_suggestion(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write(tmp_path, "job.yaml", "name: t\nimage: r/t:1\ncommand: [python]\ninstance_types: [g5.xlarg]\n")

    assert main(["validate", spec]) == 1

    out = capsys.readouterr().out
    assert "instance_types: g5.xlarg is not an instance type gpujobs knows (did you mean g5.xlarge?)" in out


def test_submit_checks_the_types_offline_before_anything_is_sent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write(tmp_path, "job.yaml", SPEC + "command: [python]\ngpus_per_node: 2\n")

    assert main(["submit", spec]) == 1  # no_aws: nothing was looked up or sent
    assert "gpus_per_node is 2, but g5.xlarge has 1" in capsys.readouterr().err


def test_the_catalog_knows_the_gpus_of_every_type_it_prices_and_prices_only_some() -> None:
    catalog = packaged_catalog()

    assert set(on_demand_prices()) < set(gpu_counts()) == set(catalog)
    assert packaged_on_demand_prices() == on_demand_prices()
    assert gpu_counts()["p5.48xlarge"] == 8
    assert gpu_counts()["c7i.large"] == 0
    assert all((facts.hourly_usd or 0) > 0 for name, facts in catalog.items() if name in on_demand_prices())
    assert catalog["p6-b200.48xlarge"].hourly_usd is None  # no price transcribed: validates, caps refused


def test_every_type_of_the_stacks_default_allow_list_is_known() -> None:
    template = (ROOT / "template.yaml").read_text()
    default = template.split("AllowedInstanceTypes:")[1].split("Default:")[1].splitlines()[0]
    allowed = [t.strip().strip("\"'") for t in default.split(",") if t.strip()]

    assert allowed
    assert set(allowed) <= set(gpu_counts())


# ---- cost and GPU-hours -----------------------------------------------------------------------
def job_with(*attempts: Attempt, state: JobState = JobState.RUNNING) -> Job:
    spec = load_spec((EXAMPLES / "digits.yaml").read_bytes())
    job = Job.submitted(job_id="j-0123456789abcdef", spec=spec, now=NOW, message_id=None)
    for attempt in attempts:
        job = job.with_attempt(attempt, now=NOW)
    return job.model_copy(update={"state": state})


def attempt(number: int, *, hours: float, market: Market, ended: bool = True, **changes: object) -> Attempt:
    start = NOW + (number - 1) * 10 * HOUR
    return Attempt(
        number=number,
        started_at=start,
        instance_ids=("i-1",),
        instance_type="g5.xlarge",
        zone="us-east-1a",
        market=market,
        ended_at=start + hours * HOUR if ended else None,
        **changes,  # type: ignore[arg-type]
    )


def test_an_on_demand_job_costs_its_list_price_exactly() -> None:
    job = job_with(attempt(1, hours=2, market=Market.ON_DEMAND, end_reason=COMPLETED_END_REASON))

    spend = spend_of(job.model_copy(update={"state": JobState.SUCCEEDED}), NOW + 5 * HOUR)

    assert spend.cost_usd == pytest.approx(2 * on_demand_prices()["g5.xlarge"])
    assert not spend.estimated
    assert spend.paid_gpu_hours == pytest.approx(2.0)
    assert spend.useful_gpu_hours == pytest.approx(2.0)


def test_a_running_spot_job_shows_its_cost_so_far_as_an_estimate() -> None:
    job = job_with(attempt(1, hours=0, market=Market.SPOT, ended=False))

    spend = spend_of(job, NOW + 3 * HOUR)
    page = render.job_status(job, spend=spend)

    assert spend.estimated
    assert spend.paid_gpu_hours is None  # GPU-hours are for ended jobs
    assert f"cost      ~${3 * on_demand_prices()['g5.xlarge']:.2f} so far" in page
    assert "gpu-hours" not in page


def test_an_ended_job_shows_paid_against_useful_gpu_hours() -> None:
    """Attempt 1 ran 2 h on spot, committed its last checkpoint after 1.5 h and was reclaimed: the half
    hour after it is redone. Attempt 2 ran 1 h and completed the job."""
    first = attempt(
        1, hours=2, market=Market.SPOT, end_reason="interrupted", checkpoint_step=900, checkpoint_at=NOW + 1.5 * HOUR
    )
    second = attempt(2, hours=1, market=Market.ON_DEMAND, end_reason=COMPLETED_END_REASON)
    job = job_with(first, second, state=JobState.SUCCEEDED)

    spend = spend_of(job, NOW + 20 * HOUR)
    page = render.job_status(job, spend=spend)

    assert spend.paid_gpu_hours == pytest.approx(3.0)
    assert spend.useful_gpu_hours == pytest.approx(2.5)
    assert "gpu-hours 3.00 paid, 2.50 useful (83%)" in page
    assert "cost      ~$" in page  # one attempt was spot
    assert "so far" not in page


def test_retired_attempts_keep_counting_in_cost_and_useful_time() -> None:
    attempts = [
        attempt(
            n,
            hours=1,
            market=Market.ON_DEMAND,
            end_reason="crashed",
            checkpoint_at=NOW + (n - 1) * 10 * HOUR + 0.5 * HOUR,
        )
        for n in range(1, 8)
    ]
    job = job_with(*attempts, state=JobState.FAILED)
    assert job.retired.count > 0  # the record let some attempts go

    spend = spend_of(job, NOW + 100 * HOUR)

    assert spend.paid_gpu_hours == pytest.approx(7.0)
    assert spend.useful_gpu_hours == pytest.approx(3.5)
    assert spend.cost_usd == pytest.approx(7 * on_demand_prices()["g5.xlarge"])


def test_list_shows_each_jobs_cost() -> None:
    job = job_with(attempt(1, hours=1, market=Market.ON_DEMAND, ended=False))

    lines = render.job_list([job], spends={job.job_id: spend_of(job, NOW + HOUR)}).splitlines()

    assert lines[0].split() == ["JOB", "ID", "NAME", "TEAM", "STATE", "ATTEMPT", "COST", "UPDATED", "DETAIL"]
    assert lines[1].split()[5] == f"${on_demand_prices()['g5.xlarge']:.2f}"


def test_status_shows_why_an_attempt_failed() -> None:
    failed = attempt(
        1,
        hours=0.1,
        market=Market.SPOT,
        end_reason="misconfigured",
        exit_codes={"i-1": 78},
        error_line="GPUJOBS_CHECKPOINT_URI is not reachable \x1b[31m",
    )
    job = job_with(failed).transition(JobState.FAILED, Reason.CONFIG_ERROR, now=NOW + HOUR)

    page = render.job_status(job)

    assert "exit messages:\n  #1  GPUJOBS_CHECKPOINT_URI is not reachable \\x1b[31m" in page


# ---- a reader that goes away ------------------------------------------------------------------
def test_status_shows_a_gang_relaunched_for_its_slow_interconnect_naming_the_nodes_and_the_figure() -> None:
    said = "workload exited with 123: all-reduce bus bandwidth 3.10 GB/s across 2 nodes (16 ranks) is below the floor"
    ended = attempt(
        1,
        hours=0.1,
        market=Market.SPOT,
        end_reason="slow-interconnect",
        exit_codes={"i-1": 123},
        error_line=said,
        slow_interconnect={"i-1": said},
    )
    job = job_with(ended).transition(
        JobState.QUEUED, Reason.SLOW_INTERCONNECT, now=NOW + HOUR, detail=f"slow interconnect: i-1: {said}"
    )

    page = render.job_status(job)
    as_json = commands._status_json(job)

    assert "slow-interconnect" in page
    assert f"exit messages:\n  #1  {said}" in page
    assert as_json["attempts"][0]["slow_interconnect"] == {"i-1": said}
    assert as_json["history"][-1]["reason"] == "slow-interconnect"


def test_a_reader_that_closes_early_gets_no_traceback() -> None:
    """`gpujobs validate ... | head -0`: the pipe is closed before the CLI writes its first byte."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "gpujobs_cli.main", "validate", str(EXAMPLES / "digits.yaml")],
            stdout=write_end,
            stderr=subprocess.PIPE,
            check=False,
            timeout=60,
        )
    finally:
        os.close(write_end)

    assert done.stderr.decode() == ""
    assert done.returncode == EXIT_READER_GONE == 141
