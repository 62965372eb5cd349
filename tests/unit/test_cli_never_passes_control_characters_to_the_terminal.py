"""What a job's submitter wrote never drives the terminal of whoever reads the job.

A name, a problem or a status detail can hold an ESC sequence (clear the screen, retitle the window,
rewrite earlier lines, or an OSC 8 link), written by the submitter or echoed from their spec. The
CLI shows such characters spelled out (`\\x1b`), never sends them. `gpujobs validate` answers every
hostile document with one line per problem and exit 1, never a traceback.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpujobs.domain.job import Job
from gpujobs.domain.spec_errors import printable
from gpujobs.domain.states import JobState
from gpujobs.service.ports import JobNotFoundError
from gpujobs_cli import commands, render
from gpujobs_cli.logs import LogLine
from gpujobs_cli.main import main
from tests.unit.test_spec_corpus import HOSTILE

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
CLEAR_SCREEN = "\x1b[2J"
RETITLE = "\x1b]0;you have been pwned\x07"
CSI = "\x9b31m"


def hostile_job() -> Job:
    rejected = Job.rejected(
        job_id="j-0000000000000001",
        problems=[f"{CLEAR_SCREEN}name: bad", f"env.{RETITLE}: unknown field", f"x{CSI}\r\nfake: line"],
        excerpt="",
        now=NOW,
        message_id="m-1",
    )
    return rejected.model_copy(update={"name": f"digits{CLEAR_SCREEN}", "team": f"vision{CSI}"})


def assert_no_control_characters(text: str) -> None:
    assert all(c == "\n" or c.isprintable() for c in text), repr(text)


def test_status_spells_out_escape_sequences_in_a_rejected_jobs_name_detail_and_problems() -> None:
    page = render.job_status(hostile_job())

    assert_no_control_characters(page)
    assert "\\x1b[2J" in page
    assert "\\x9b31m" in page
    assert "\nfake: line" not in page, "a problem cannot add lines of its own"


def test_list_spells_out_escape_sequences_in_names_teams_and_details() -> None:
    table = render.job_list([hostile_job()])

    assert_no_control_characters(table)
    assert "digits\\x1b[2J" in table


def test_waiting_reports_a_detail_with_an_escape_sequence_spelled_out(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    job = hostile_job().model_copy(update={"status_detail": f"{RETITLE}rejected"})

    class Store:
        def get(self, job_id: str) -> Job:
            if job_id != job.job_id:
                raise JobNotFoundError(job_id)
            return job

    monkeypatch.setattr(commands, "sleep", lambda _: None)
    commands.wait_for(Store(), job.job_id, done=lambda j: j.state is JobState.REJECTED)

    err = capsys.readouterr().err
    assert_no_control_characters(err)
    assert "\\x1b]0;you have been pwned\\x07rejected" in err


@pytest.mark.parametrize(("document", "field"), [pytest.param(d, f, id=i) for i, d, f in HOSTILE])
def test_validate_answers_a_hostile_document_one_line_per_problem_never_a_traceback(
    document: str | bytes, field: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "hostile.yaml"
    path.write_bytes(document.encode() if isinstance(document, str) else document)

    code = main(["validate", str(path)])

    out, err = capsys.readouterr()
    assert code == 1
    assert err == ""
    lines = out.splitlines()
    assert lines
    assert all(line.startswith(f"{path}: ") for line in lines)
    assert any(line.startswith(f"{path}: {field}: ") for line in lines)
    assert_no_control_characters(out)


RIGHT_TO_LEFT_OVERRIDE = "\u202e"
ISOLATES = "\u2066\u2067\u2068\u2069"
ZERO_WIDTH_SPACE = "\u200b"
FORMAT_CHARACTERS = (RIGHT_TO_LEFT_OVERRIDE, *ISOLATES, ZERO_WIDTH_SPACE, "\ufeff", "\U000e0001")


def reordering_job() -> Job:
    """A job whose text reorders or hides what a terminal shows: `report<RLO>gnp.exe` reads as
    `reportexe.png`, a zero-width space makes two names look equal."""
    rejected = Job.rejected(
        job_id="j-0000000000000002",
        problems=[f"name{RIGHT_TO_LEFT_OVERRIDE}: bad", f"env.{ISOLATES}: unknown field"],
        excerpt="",
        now=NOW,
        message_id="m-2",
    )
    return rejected.model_copy(
        update={
            "name": f"report{RIGHT_TO_LEFT_OVERRIDE}gnp.exe",
            "team": f"vision{ZERO_WIDTH_SPACE}",
            "status_detail": f"done{ISOLATES}",
        }
    )


@pytest.mark.parametrize("char", FORMAT_CHARACTERS, ids=[f"U+{ord(c):04X}" for c in FORMAT_CHARACTERS])
def test_a_format_character_is_spelled_out_as_its_code_point(char: str) -> None:
    shown = printable(f"a{char}b")

    assert shown.isprintable()
    assert shown == "a" + ascii(char)[1:-1] + "b"


def test_status_spells_out_bidi_overrides_isolates_and_zero_width_spaces() -> None:
    page = render.job_status(reordering_job())

    assert_no_control_characters(page)
    assert "report\\u202egnp.exe" in page
    assert "vision\\u200b" in page
    assert "env.\\u2066\\u2067\\u2068\\u2069: unknown field" in page


def test_list_spells_out_format_characters_in_names_teams_and_details() -> None:
    table = render.job_list([reordering_job()])

    assert_no_control_characters(table)
    assert "report\\u202egnp.exe" in table
    assert "vision\\u200b" in table


def test_a_log_line_with_a_bidi_override_is_spelled_out_and_its_tabs_still_become_spaces() -> None:
    line = LogLine(timestamp=NOW, message=f"loss\t0.5 {RIGHT_TO_LEFT_OVERRIDE}dekcah")

    assert line.text() == "loss    0.5 \\u202edekcah"


def test_plain_text_in_any_script_is_shown_as_it_is() -> None:
    text = "Größe 学習 обучение ✓ 🚀"

    assert printable(text) == text
