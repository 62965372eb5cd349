"""The trainer and the control plane agree on what an exit code means."""

from __future__ import annotations

import gpujobs_trainer
from gpujobs.domain import fate


def test_the_preempted_exit_code_is_the_same_on_both_sides() -> None:
    assert gpujobs_trainer.PREEMPTED_EXIT_CODE == fate.PREEMPTED_EXIT_CODE == 75
