"""`run.export(model)` and `python -m gpujobs_trainer.export` give the weights the job trained.

Real 2-process torchrun (gloo, CPU) through the trainer's launcher, for DDP and for FSDP2: rank 0
writes the consolidated weights as safetensors into $GPUJOBS_OUTPUT_DIR, and they equal the model
as rank 0 holds it (gathered by another route: DDP's own replica, FSDP2's `full_tensor()`). The
final DCP checkpoint, converted offline with one call, holds the same parameters.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import boto3
import pytest
import torch
from moto import mock_aws
from safetensors import safe_open
from safetensors.torch import load_file

from gpujobs_trainer import export
from tests.iam.recorder import RECORDER
from tests.training.harness import JOB_TIMEOUT, PYTHON, REPO, job_env

pytestmark = [pytest.mark.training, pytest.mark.slow]

SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    import gpujobs_trainer

    mode, reference = sys.argv[1], sys.argv[2]
    env = gpujobs_trainer.setup_distributed()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))
    model = gpujobs_trainer.prepare_model(model) if mode == "ddp" else fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run = gpujobs_trainer.init(model=model, optimizer=optimizer)
    run.resume()
    data = torch.Generator().manual_seed(100 + env.rank)  # each rank its own batches: buffers differ by rank
    for step in range(6):
        loss = model(torch.randn(32, 8, generator=data)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        run.step_done(step + 1)
    exported = run.export(model)
    if mode == "ddp":
        held = model.module.state_dict()
    else:  # every rank takes part in gathering each sharded parameter
        held = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}
    if env.rank == 0:
        assert exported is not None and exported.name == "model.safetensors", exported
        torch.save({k: v.detach().clone() for k, v in held.items()}, reference)
    else:
        assert exported is None
    sys.exit(run.finish())
    """
)


def train_and_export(tmp_path: Path, mode: str) -> tuple[Path, Path, Path]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    outputs, checkpoints, reference = tmp_path / "outputs", tmp_path / "checkpoints", tmp_path / "reference.pt"
    env = job_env(str(checkpoints), GPUJOBS_OUTPUT_DIR=str(outputs))
    done = subprocess.run(
        [PYTHON, "-m", "gpujobs_trainer.launch", "--", PYTHON, str(script), mode, str(reference)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return outputs, checkpoints, reference


@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
def test_rank_0_exports_the_trained_weights_as_safetensors(tmp_path: Path, mode: str) -> None:
    outputs, _, reference = train_and_export(tmp_path, mode)

    exported = load_file(outputs / "model.safetensors")
    trained = torch.load(reference, weights_only=True)
    assert exported.keys() == trained.keys()
    assert "1.running_mean" in exported, "buffers are exported too"
    for name, tensor in trained.items():
        assert torch.equal(exported[name], tensor), name
    with safe_open(str(outputs / "model.safetensors"), framework="pt") as file:
        assert file.metadata()["step"] == "6"
    # no half-written file is left; `tensorboard/` is the launcher's $GPUJOBS_TB_DIR, created empty
    assert sorted(p.name for p in outputs.iterdir()) == ["model.safetensors", "tensorboard"]
    assert not any((outputs / "tensorboard").iterdir())


def test_the_final_checkpoint_converts_to_the_same_parameters_with_one_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outputs, checkpoints, _ = train_and_export(tmp_path, "ddp")
    exported = load_file(outputs / "model.safetensors")
    converted = {"s3://.../ckpt": _converted_from_s3(checkpoints, tmp_path / "from-s3.safetensors", monkeypatch)}

    for source, out in [
        (str(checkpoints), tmp_path / "newest.safetensors"),
        (str(checkpoints / "step-00000006"), tmp_path / "step-6.pt"),
    ]:
        done = subprocess.run(
            [PYTHON, "-m", "gpujobs_trainer.export", source, str(out)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=JOB_TIMEOUT,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert "step 6:" in done.stdout
        converted[source] = load_file(out) if out.suffix == ".safetensors" else torch.load(out, weights_only=True)

    # Parameters are equal on every rank; buffers differ by rank here, and which rank's copy the
    # checkpoint keeps is the checkpoint's business (the online export takes rank 0's, asserted above).
    parameters = [name for name in exported if name.endswith(("weight", "bias"))]
    assert parameters
    for source, weights in converted.items():
        assert weights.keys() == exported.keys(), source
        for name in parameters:
            assert torch.equal(weights[name], exported[name]), (source, name)


def _converted_from_s3(checkpoints: Path, out: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, torch.Tensor]:
    """The checkpoints copied to a (moto) bucket, converted from their s3:// URI as the docs show."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "t",
        "AWS_SECRET_ACCESS_KEY": "t",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="ckpt")
        for path in checkpoints.rglob("*"):
            if path.is_file():
                s3.upload_file(str(path), "ckpt", f"jobs/j-1/ckpt/{path.relative_to(checkpoints).as_posix()}")
        # on the ML engineer's machine, with their credentials: no principal of the stack
        with RECORDER.unattributed("gpujobs-export run by a user, not by the training container"):
            assert export.main(["s3://ckpt/jobs/j-1/ckpt", str(out)]) == 0
    return load_file(out)


def test_converting_a_folder_without_a_committed_checkpoint_fails_with_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpujobs_trainer.export", str(tmp_path), str(tmp_path / "out.safetensors")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT,
        check=False,
    )

    assert done.returncode == 1
    assert done.stderr.strip() == f"gpujobs_trainer.export: no committed checkpoint at {tmp_path}"
    assert not (tmp_path / "out.safetensors").exists()
