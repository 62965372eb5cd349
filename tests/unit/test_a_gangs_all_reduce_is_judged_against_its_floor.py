"""The all-reduce check's arithmetic and verdict (`gpujobs_trainer.interconnect`), and what the
launcher does when the check itself cannot give a figure: it says so and the workload starts."""

from __future__ import annotations

import logging
import sys

import pytest

from gpujobs_trainer.errors import ConfigError
from gpujobs_trainer.interconnect import FLOOR_ENV, Measured, bus_bandwidth_gbs, floor_from_env, gate, judge


def measured(busbw: float, *, ranks: int = 16, nodes: int = 2) -> Measured:
    return Measured(busbw_gbs=busbw, ranks=ranks, nodes=nodes, bytes=256 * 2**20, seconds=0.1)


def test_bus_bandwidth_is_nccl_tests_busbw() -> None:
    # algbw 1 GB/s; an all-reduce moves 2(n-1)/n of the message through each rank's link
    assert bus_bandwidth_gbs(nbytes=10**9, seconds=1.0, ranks=2) == pytest.approx(1.0)
    assert bus_bandwidth_gbs(nbytes=10**9, seconds=0.5, ranks=8) == pytest.approx(2.0 * 2 * 7 / 8)
    assert bus_bandwidth_gbs(nbytes=2**28, seconds=0.1, ranks=16) == pytest.approx(2**28 / 0.1 / 1e9 * 30 / 16)


def test_a_gang_below_its_floor_is_told_what_was_measured_and_the_floor() -> None:
    line = judge(measured(3.1), 12.5, "p4d.24xlarge")
    assert line == (
        "all-reduce bus bandwidth 3.10 GB/s across 2 nodes (16 ranks) is below p4d.24xlarge's floor of"
        " 12.50 GB/s (a quarter of its network): relaunched on other hosts"
    )


def test_without_the_instance_type_the_line_names_the_floor_alone() -> None:
    line = judge(measured(3.1, ranks=4), 12.5, "")
    assert line is not None
    assert "across 2 nodes (4 ranks) is below the floor of 12.50 GB/s" in line


@pytest.mark.parametrize("busbw", [12.5, 40.0])
def test_a_gang_at_or_above_its_floor_trains(busbw: float) -> None:
    assert judge(measured(busbw), 12.5, "p4d.24xlarge") is None


def test_a_floor_of_zero_measures_and_never_judges() -> None:
    assert judge(measured(0.001), 0.0, "g5.xlarge") is None


def test_the_floor_is_read_only_when_the_bootstrap_sets_it() -> None:
    assert floor_from_env({}) is None
    assert floor_from_env({FLOOR_ENV: "12.5"}) == 12.5
    assert floor_from_env({FLOOR_ENV: "0"}) == 0.0


@pytest.mark.parametrize("raw", ["", "fast", "-1", "nan", "inf", "12,5"])
def test_a_floor_that_is_not_a_finite_number_of_gbs_is_a_configuration_error(raw: str) -> None:
    with pytest.raises(ConfigError, match=f"{FLOOR_ENV} must be a number of GB/s >= 0, not '{raw}'"):
        floor_from_env({FLOOR_ENV: raw})


def test_a_check_that_cannot_run_is_logged_and_the_workload_starts(caplog: pytest.LogCaptureFixture) -> None:
    def failing_torchrun(command: list[str]) -> list[str]:
        return [sys.executable, "-c", "raise SystemExit(1)"]

    with caplog.at_level(logging.INFO):
        assert gate({FLOOR_ENV: "12.5"}, failing_torchrun) is None
    assert "could not run (torchrun exited 1): the workload starts unchecked" in caplog.text


def test_a_check_that_writes_no_figure_is_logged_and_the_workload_starts(caplog: pytest.LogCaptureFixture) -> None:
    def silent_torchrun(command: list[str]) -> list[str]:
        return [sys.executable, "-c", "pass"]

    with caplog.at_level(logging.INFO):
        assert gate({FLOOR_ENV: "12.5"}, silent_torchrun) is None
    assert "wrote no figure" in caplog.text


def test_a_check_whose_peer_never_comes_is_stopped_and_the_workload_starts(caplog: pytest.LogCaptureFixture) -> None:
    def waiting_torchrun(command: list[str]) -> list[str]:
        return [sys.executable, "-c", "import time; time.sleep(600)"]  # a rendezvous that never completes

    with caplog.at_level(logging.INFO):
        assert gate({FLOOR_ENV: "12.5"}, waiting_torchrun, timeout=0.5) is None
    assert "did not end within 0.5s: stopped; the workload starts unchecked" in caplog.text


def test_without_a_floor_no_check_is_started() -> None:
    def no_torchrun(command: list[str]) -> list[str]:
        raise AssertionError("the check ran without a floor")

    assert gate({}, no_torchrun) is None
