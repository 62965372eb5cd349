"""The fingerprints that compare shared state across ranks (`gpujobs_trainer.rank_agreement`), pure."""

from __future__ import annotations

import torch

from gpujobs_trainer.rank_agreement import fingerprint, first_difference


def _ema(running_mean: torch.Tensor) -> dict[str, object]:
    return {"ema": {"n_averaged": torch.tensor(3), "module.1.running_mean": running_mean, "note": "x"}}


def test_equal_states_on_every_rank_have_no_difference() -> None:
    states = [fingerprint(_ema(torch.arange(8.0))) for _ in range(4)]

    assert first_difference(states) is None


def test_the_first_rank_and_key_that_differ_from_rank_0_are_named() -> None:
    base = torch.arange(8.0)
    moved = base.clone()
    moved[5] += 1e-6  # one statistic of one rank, barely different
    states = [fingerprint(_ema(base)), fingerprint(_ema(base)), fingerprint(_ema(moved))]

    assert first_difference(states) == (2, "ema.module.1.running_mean")


def test_a_permutation_of_the_same_values_is_a_difference() -> None:
    states = [fingerprint(_ema(torch.tensor([1.0, 2.0, 3.0]))), fingerprint(_ema(torch.tensor([3.0, 2.0, 1.0])))]

    assert first_difference(states) == (1, "ema.module.1.running_mean")


def test_non_tensor_values_and_missing_keys_count() -> None:
    assert first_difference([fingerprint({"best": 0.5}), fingerprint({"best": 0.25})]) == (1, "best")
    assert first_difference([fingerprint({"a": 1}), fingerprint({"a": 1, "b": 2})]) == (1, "b")
