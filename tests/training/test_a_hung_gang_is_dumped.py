"""A hung gang's stacks are dumped before its kill (issue 22): what the launcher does on SIGUSR2.

Every test hangs a real Python process (blocked on an event that never comes) and dumps it: with
py-spy, with a fake py-spy on PATH (its argv is what the launcher runs), and, where py-spy is
missing, with the trainer library's faulthandler. The last one runs the real launcher over torchrun
with two ranks and signals it as `docker kill --signal SIGUSR2` would. Nothing sleeps to wait: each
waits, bounded, for a file that says the state it needs has been reached.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpujobs_trainer.stack_dumps import (
    DUMPS_FOLDER,
    STACKS_DIR_ENV,
    StackDumper,
    first_dump_end,
    nccl_flight_recorder_env,
)
from gpujobs_trainer.workers import Worker, rank_of

HUNG_SCRIPT = """
import os, sys, threading
from pathlib import Path
from gpujobs_trainer.stack_dumps import install_faulthandler

def wait_for_a_peer_that_never_comes():
    threading.Event().wait()

install_faulthandler(os.environ, rank=int(os.environ.get("RANK", "0")))
Path(sys.argv[1] + "." + os.environ.get("RANK", "0")).touch()
wait_for_a_peer_that_never_comes()
"""


def until(what: str, holds: object, timeout: float = 60.0) -> None:
    """Poll a condition the test needs (a process reached its hang), bounded: never a blind sleep."""
    deadline = time.monotonic() + timeout
    while not holds():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.05)


@pytest.fixture
def hung(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A real Python process hung in `wait_for_a_peer_that_never_comes`, rank 3, faulthandler installed."""
    script, ready, stacks = tmp_path / "hung.py", tmp_path / "ready", tmp_path / "stacks"
    script.write_text(HUNG_SCRIPT)
    stacks.mkdir()
    env = {**os.environ, "RANK": "3", STACKS_DIR_ENV: str(stacks)}
    proc = subprocess.Popen([sys.executable, str(script), str(ready)], env=env)
    until("the process hangs", lambda: Path(f"{ready}.3").exists())
    yield proc, stacks
    proc.kill()
    proc.wait()


def test_without_py_spy_each_rank_is_dumped_by_the_trainer_librarys_faulthandler(
    hung: tuple[subprocess.Popen[bytes], Path], tmp_path: Path
) -> None:
    proc, stacks = hung
    dumper = StackDumper(folder=tmp_path / "dumps", stacks_dir=stacks, node_rank=1, py_spy=None)

    [written] = dumper.dump_all([Worker(proc.pid, rank_of(proc.pid))])

    text = written.read_text()
    assert written.name == "rank-00003.txt"
    assert text.startswith(f"# rank 3 (node 1, pid {proc.pid}): faulthandler\n")
    assert "py-spy is not installed" in text
    assert "wait_for_a_peer_that_never_comes" in text
    assert proc.poll() is None  # dumped, not killed: the control plane does that


def test_a_process_that_installs_no_dump_says_so_rather_than_being_killed_by_the_signal(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        dumper = StackDumper(folder=tmp_path / "dumps", stacks_dir=tmp_path, node_rank=0, py_spy=None)

        [written] = dumper.dump_all([Worker(proc.pid, 0)])

        assert "no stacks: py-spy is not installed in the image" in written.read_text()
        assert proc.poll() is None  # SIGUSR2's default action would have ended it
    finally:
        proc.kill()
        proc.wait()


def test_py_spy_is_run_as_argv_on_each_rank_and_its_output_is_the_dump(
    hung: tuple[subprocess.Popen[bytes], Path], tmp_path: Path
) -> None:
    proc, stacks = hung
    argv_file = tmp_path / "argv"
    fake = tmp_path / "bin" / "py-spy"
    fake.parent.mkdir()
    fake.write_text(
        f"#!{sys.executable}\nimport sys\nopen({str(argv_file)!r}, 'w').write(repr(sys.argv[1:]))\n"
        "print('Thread 0x1 (idle): MainThread\\n    wait_for_a_peer_that_never_comes (hung.py:7)')\n"
    )
    fake.chmod(0o755)
    dumper = StackDumper(folder=tmp_path / "dumps", stacks_dir=stacks, node_rank=0, py_spy=str(fake))

    [written] = dumper.dump_all([Worker(proc.pid, 3)])

    assert argv_file.read_text() == repr(["dump", "--pid", str(proc.pid)])
    assert written.read_text().startswith(f"# rank 3 (node 0, pid {proc.pid}): py-spy\nThread 0x1 (idle)")


def test_a_py_spy_that_is_refused_falls_back_to_faulthandler(
    hung: tuple[subprocess.Popen[bytes], Path], tmp_path: Path
) -> None:
    proc, stacks = hung
    refused = tmp_path / "py-spy"
    refused.write_text("#!/bin/sh\necho 'Permission Denied: Try running again with elevated permissions' >&2\nexit 1\n")
    refused.chmod(0o755)
    dumper = StackDumper(folder=tmp_path / "dumps", stacks_dir=stacks, node_rank=0, py_spy=str(refused))

    [written] = dumper.dump_all([Worker(proc.pid, 3)])

    text = written.read_text()
    assert ": faulthandler\n" in text.splitlines(keepends=True)[0]
    assert "py-spy exited 1: Permission Denied" in text
    assert "wait_for_a_peer_that_never_comes" in text


TWO_DUMPS_SCRIPT = """
import faulthandler, os, signal, sys, threading
out = open(sys.argv[1], "w")
faulthandler.register(signal.SIGUSR2, file=out, all_threads=True, chain=False)
for _ in range(2):
    threading.Thread(target=threading.Event().wait, daemon=True).start()
os.kill(os.getpid(), signal.SIGUSR2)
out.flush()
print(os.path.getsize(sys.argv[1]), flush=True)
os.kill(os.getpid(), signal.SIGUSR2)
"""


def test_the_first_of_two_real_dumps_is_whole_only_once_the_second_begins(tmp_path: Path) -> None:
    """A rank's dump is read back only when it is whole: faulthandler writes it in many pieces, and
    reading at the first growth once cut it after the header (a red CI). The launcher asks twice;
    the second dump's header, which follows no blank line, is the fence."""
    dumps = tmp_path / "dumps.txt"
    done = subprocess.run(
        [sys.executable, "-c", TWO_DUMPS_SCRIPT, str(dumps)], capture_output=True, text=True, check=True
    )
    first_size = int(done.stdout)
    text = dumps.read_text()
    assert text.count("(most recent call first)") == 6  # three threads, twice

    for cut in range(first_size + 1):
        assert first_dump_end(text[:cut]) is None, f"the first dump taken for whole at byte {cut}"
    assert first_dump_end(text[: first_size + len("Current thread 0x")]) == first_size
    assert first_dump_end(text) == first_size


PY_SPY = shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))


@pytest.mark.skipif(PY_SPY is None, reason="py-spy is not installed here")
def test_the_real_py_spy_dumps_a_hung_rank(hung: tuple[subprocess.Popen[bytes], Path], tmp_path: Path) -> None:
    proc, stacks = hung
    dumper = StackDumper(folder=tmp_path / "dumps", stacks_dir=stacks, node_rank=0, py_spy=PY_SPY)

    [written] = dumper.dump_all([Worker(proc.pid, 3)])

    text = written.read_text()
    if ": py-spy\n" not in text.splitlines(keepends=True)[0]:
        pytest.skip(f"py-spy may not trace here (ptrace refused): {text.splitlines()[1][:200]}")
    assert "wait_for_a_peer_that_never_comes" in text


def test_the_nccl_flight_recorder_is_switched_on_unless_the_job_set_it(tmp_path: Path) -> None:
    env = nccl_flight_recorder_env({"TORCH_NCCL_TRACE_BUFFER_SIZE": "50"}, tmp_path)

    assert env == {
        STACKS_DIR_ENV: str(tmp_path),
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(tmp_path / "nccl_trace_rank_"),
    }


def test_nccl_traces_written_by_the_time_of_the_dump_go_beside_the_stacks(tmp_path: Path) -> None:
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "nccl_trace_rank_1").write_bytes(b"\x80pickled entries")

    written = StackDumper(folder=tmp_path / "dumps", stacks_dir=stacks, node_rank=0).dump_all([])

    assert [p.name for p in written] == ["nccl-trace-rank-1"]
    assert written[0].read_bytes() == b"\x80pickled entries"


def test_the_launcher_dumps_every_rank_on_sigusr2_into_the_output_folder(tmp_path: Path) -> None:
    script, ready, outputs = tmp_path / "hung.py", tmp_path / "ready", tmp_path / "outputs"
    script.write_text(HUNG_SCRIPT)
    env = {
        **os.environ,
        "GPUJOBS_NPROC_PER_NODE": "2",
        "GPUJOBS_NODE_RANK": "0",
        "GPUJOBS_ATTEMPT": "4",
        "GPUJOBS_MASTER_PORT": "29561",
        "GPUJOBS_OUTPUT_DIR": str(outputs),
        "PATH": os.path.dirname(sys.executable),  # no py-spy: the library's faulthandler answers
    }
    launcher = subprocess.Popen(
        [sys.executable, "-m", "gpujobs_trainer.launch", "--", sys.executable, str(script), str(ready)],
        env=env,
        cwd=tmp_path,
    )
    try:
        until("both ranks hang", lambda: Path(f"{ready}.0").exists() and Path(f"{ready}.1").exists())
        launcher.send_signal(signal.SIGUSR2)
        folder = outputs / DUMPS_FOLDER / "attempt-4"
        names = ["rank-00000.txt", "rank-00001.txt"]
        until("both ranks are dumped", lambda: all((folder / n).exists() for n in names))

        for rank, name in enumerate(names):
            text = (folder / name).read_text()
            assert text.startswith(f"# rank {rank} (node 0, pid ")
            assert "wait_for_a_peer_that_never_comes" in text
        assert launcher.poll() is None  # the launcher and its ranks live on until the control plane's kill
    finally:
        launcher.send_signal(signal.SIGTERM)
        try:
            launcher.wait(timeout=60)
        except subprocess.TimeoutExpired:
            launcher.kill()
            launcher.wait()
