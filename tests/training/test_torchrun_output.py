"""torchrun's own traceback of a stop the launcher asked for is left out of the job's log; every
other line, and every other traceback, is passed on (`gpujobs_trainer.torchrun_output`)."""

from __future__ import annotations

import io

import pytest

from gpujobs_trainer.torchrun_output import TorchrunStderr

STOP_TRACEBACK = [
    b"Traceback (most recent call last):\n",
    b'  File "/venv/bin/torchrun", line 8, in <module>\n',
    b"    sys.exit(main())\n",
    b"             ^^^^^^\n",
    b'  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py", line 86\n',
    b'    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)\n',
    b"torch.distributed.elastic.multiprocessing.api.SignalException: Process 7437 got signal: 15\n",
]
CRASH_TRACEBACK = [
    b"Traceback (most recent call last):\n",
    b'  File "train.py", line 3, in <module>\n',
    b"    main()\n",
    b"ValueError: bad shape (3, 4)\n",
]


def _through(lines: list[bytes], *, stop_asked: bool) -> bytes:
    sink = io.BytesIO()
    output = TorchrunStderr(io.BytesIO(b"".join(lines)), sink, stop_asked=lambda: stop_asked)
    for line in lines:
        output.feed(line)
    output.close(timeout=0)
    return sink.getvalue()


def test_the_signal_exception_of_a_stop_the_launcher_asked_for_is_left_out_and_other_lines_stay() -> None:
    before = b"W1206 10:15:57 api.py:753] Received 15 death signal, shutting down workers\n"
    interleaved = b"[rank1]: checkpoint step 12 committed\n"
    lines = [before, *STOP_TRACEBACK[:3], interleaved, *STOP_TRACEBACK[3:], b"after\n"]

    assert _through(lines, stop_asked=True) == before + interleaved + b"after\n"


def test_the_same_traceback_after_a_stop_nobody_asked_for_is_kept_whole() -> None:
    assert _through(STOP_TRACEBACK, stop_asked=False) == b"".join(STOP_TRACEBACK)


@pytest.mark.parametrize("stop_asked", [True, False])
def test_any_other_traceback_is_kept_whole(stop_asked: bool) -> None:
    assert _through(CRASH_TRACEBACK, stop_asked=stop_asked) == b"".join(CRASH_TRACEBACK)


def test_a_traceback_whose_end_never_comes_is_passed_on_at_close() -> None:
    cut = STOP_TRACEBACK[:4]

    assert _through(cut, stop_asked=True) == b"".join(cut)


def test_the_workers_prefixed_tracebacks_are_never_held() -> None:
    sink = io.BytesIO()
    output = TorchrunStderr(io.BytesIO(), sink, stop_asked=lambda: True)

    output.feed(b"[rank0]: Traceback (most recent call last):\n")

    assert sink.getvalue() == b"[rank0]: Traceback (most recent call last):\n"
