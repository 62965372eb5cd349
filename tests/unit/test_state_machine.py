"""The state machine lives in one module; docs/state-machine.md must say exactly the same."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpujobs.domain.states import (
    TERMINAL_STATES,
    TRANSITIONS,
    IllegalTransitionError,
    JobState,
    Reason,
    check_transition,
    render_markdown,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "state-machine.md"


def test_the_document_is_the_rendering_of_the_module() -> None:
    assert DOC.read_text() == render_markdown(), "run: python -m gpujobs.domain.states > docs/state-machine.md"


def test_the_documented_transition_table_matches_the_module_row_for_row() -> None:
    rows = re.findall(r"^\| (\(new\)|`\w+`) \| `(\w+)` \| `([\w-]+)` \|", DOC.read_text(), flags=re.M)
    documented = {(None if a == "(new)" else a.strip("`"), b, c) for a, b, c in rows}
    in_code = {(t.source.value if t.source else None, t.target.value, t.reason.value) for t in TRANSITIONS}
    assert documented == in_code


def test_terminal_states_have_no_way_out() -> None:
    assert not [t for t in TRANSITIONS if t.source in TERMINAL_STATES]


def test_every_reason_is_used_and_every_state_is_reachable() -> None:
    assert {t.reason for t in TRANSITIONS} == set(Reason)
    assert {t.target for t in TRANSITIONS} == set(JobState)


def test_every_active_state_can_be_cancelled() -> None:
    for state in JobState:
        if not state.is_terminal:
            check_transition(state, JobState.CANCELLED, Reason.USER_CANCELLED)


@pytest.mark.parametrize(
    ("source", "target", "reason"),
    [
        (JobState.SUCCEEDED, JobState.QUEUED, Reason.CRASHED_RETRYING),
        (JobState.QUEUED, JobState.RUNNING, Reason.INSTANCES_LAUNCHED),
        (JobState.RUNNING, JobState.SUCCEEDED, Reason.USER_CANCELLED),
        (JobState.CANCELLED, JobState.CANCELLED, Reason.USER_CANCELLED),
    ],
)
def test_moves_outside_the_table_are_refused(source: JobState, target: JobState, reason: Reason) -> None:
    with pytest.raises(IllegalTransitionError, match=f"{source.value} -> {target.value}"):
        check_transition(source, target, reason)
