"""`gpujobs debug` against moto: a user reads the stacks their hung gang was dumped with.

The dumps are objects of the job's outputs (`outputs/<team>/<job>/[node-K/]gpujobs-hang-dumps/
attempt-N/`), uploaded by each node's launcher before the control plane killed the gang
(`gpujobs_trainer.stack_dumps`); their text was written by the job, so it is shown through
`printable`.
"""

from __future__ import annotations

import json

import pytest

from gpujobs_cli import debug
from gpujobs_cli.main import main
from gpujobs_trainer import stack_dumps
from tests.integration import test_cli_artifacts_moto as artifacts_moto
from tests.integration.test_cli_artifacts_moto import Outputs

pytestmark = pytest.mark.integration

stack_outputs = artifacts_moto.outputs
"""The stack's bucket and table in moto, as `gpujobs artifacts`' tests have them."""

RANK0 = "# rank 0 (node 0, pid 41): py-spy\nThread 41 (idle): MainThread\n    wait (torch/distributed.py:12)\n"
RANK1 = '# rank 1 (node 1, pid 17): faulthandler\nFile "train.py", line 9 in all_reduce\n\x1b[31mred\n'


def a_job_dumped_twice(stack_outputs: Outputs) -> None:
    stack_outputs.add_job()
    stack_outputs.put("model.safetensors", b"w")
    stack_outputs.put("gpujobs-hang-dumps/attempt-1/rank-00000.txt", b"# an older hang\n")
    stack_outputs.put("gpujobs-hang-dumps/attempt-2/rank-00000.txt", RANK0.encode())
    stack_outputs.put("node-1/gpujobs-hang-dumps/attempt-2/rank-00001.txt", RANK1.encode())
    stack_outputs.put("node-1/gpujobs-hang-dumps/attempt-2/nccl-trace-rank-1", b"\x80\x04pickled")


def test_debug_prints_the_newest_attempts_stacks_per_node_and_rank(
    stack_outputs: Outputs, capsys: pytest.CaptureFixture[str]
) -> None:
    a_job_dumped_twice(stack_outputs)

    code = main(["debug", "j-00000000000000aa"])

    out = capsys.readouterr().out
    assert code == 0
    assert out.index("== attempt 2, node 0, rank 0 ==") < out.index("wait (torch/distributed.py:12)")
    assert out.index("== attempt 2, node 1, rank 1 ==") < out.index('File "train.py", line 9 in all_reduce')
    assert "== attempt 2, node 1: NCCL flight recorder of rank 1 ==" in out
    assert "node-1/gpujobs-hang-dumps/attempt-2/nccl-trace-rank-1 (binary" in out
    assert "\\x1b[31mred" in out  # the job's escape codes are spelled out
    assert "\x1b" not in out
    assert "an older hang" not in out
    assert "model.safetensors" not in out


def test_debug_attempt_picks_an_older_hang_and_json_carries_the_text(
    stack_outputs: Outputs, capsys: pytest.CaptureFixture[str]
) -> None:
    a_job_dumped_twice(stack_outputs)

    code = main(["debug", "j-00000000000000aa", "--attempt", "1", "--json"])

    [dump] = json.loads(capsys.readouterr().out)
    assert code == 0
    assert (dump["attempt"], dump["node"], dump["rank"], dump["kind"]) == (1, 0, 0, "stacks")
    assert dump["text"] == "# an older hang\n"
    assert dump["uri"].endswith("/default/j-00000000000000aa/gpujobs-hang-dumps/attempt-1/rank-00000.txt")


def test_a_job_never_dumped_says_so_and_exits_3(stack_outputs: Outputs, capsys: pytest.CaptureFixture[str]) -> None:
    stack_outputs.add_job()
    stack_outputs.put("model.safetensors", b"w")

    code = main(["debug", "j-00000000000000aa"])

    assert code == 3
    assert "has no hang dump: a gang is dumped only when the control plane finds it hung" in capsys.readouterr().err


def test_an_unknown_job_exits_3(stack_outputs: Outputs, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["debug", "j-00000000000000ff"]) == 3
    assert "no job j-00000000000000ff" in capsys.readouterr().err


def test_the_cli_reads_the_folder_the_launcher_writes() -> None:
    assert debug.DUMPS_FOLDER == stack_dumps.DUMPS_FOLDER
