"""gpujobs_trainer: checkpoint/resume, interruption handling and reporting for DDP training
on spot GPU instances. A training script makes a few calls::

    env = gpujobs_trainer.setup_distributed()
    model = gpujobs_trainer.prepare_model(Net())
    run = gpujobs_trainer.init(model=model, optimizer=opt, scheduler=sched, state={"scaler": scaler})
    start = run.resume()
    for step in range(start.step, total):
        ...
        if run.step_done(step + 1, epoch=epoch, offset=offset):
            break
    sys.exit(run.finish())

See docs/training.md for the environment contract, exit codes, layout and events.
"""

from gpujobs_trainer.config import TrainerConfig
from gpujobs_trainer.data import SeededSamples, shield_workers
from gpujobs_trainer.distributed import DistEnv, prepare_model
from gpujobs_trainer.errors import (
    CONFIG_ERROR_EXIT_CODE,
    CRASH_EXIT_CODE,
    PREEMPTED_EXIT_CODE,
    SUCCESS_EXIT_CODE,
    CheckpointError,
    ConfigError,
    TrainerError,
)
from gpujobs_trainer.extra_state import per_rank
from gpujobs_trainer.run import ResumePoint, Run, init, setup_distributed

__all__ = [
    "CONFIG_ERROR_EXIT_CODE",
    "CRASH_EXIT_CODE",
    "PREEMPTED_EXIT_CODE",
    "SUCCESS_EXIT_CODE",
    "CheckpointError",
    "ConfigError",
    "DistEnv",
    "ResumePoint",
    "Run",
    "SeededSamples",
    "TrainerConfig",
    "TrainerError",
    "init",
    "per_rank",
    "prepare_model",
    "setup_distributed",
    "shield_workers",
]
