"""Data loading that resumes at the exact next batch, with the same augmentation randomness.

The loader itself is torchdata's ``StatefulDataLoader`` (a drop-in ``DataLoader`` with
``state_dict``/``load_state_dict``, pinned in the training image): given to ``init(state=...)`` it
is saved per rank and, with the ``DistributedSampler`` set to the saved epoch before ``iter()``,
continues after the last batch the checkpointed step trained on. Three things it does not do are
done here:

- **Augmentation randomness.** Workers seed their RNGs once per epoch, and the loader's state does
  not hold them: after a resume the workers' random streams start the epoch over, so the resumed
  batches are augmented differently (docs/training.md). `SeededSamples` seeds torch's, Python's
  and numpy's global RNGs for every sample from ``(seed, epoch, index)``, so a sample's
  augmentation depends on nothing else: not on the worker that loads it, the number of workers,
  the rank, or a restart. The epoch lives in a shared-memory tensor, so workers that outlive an
  epoch (``persistent_workers=True``) see ``set_epoch`` too.
- **SIGTERM.** torchrun stops a rank by signalling its whole process group, DataLoader workers
  included; a worker killed that way makes the rank raise ``DataLoader worker ... is killed by
  signal`` at whatever line it is running, and the attempt ends "crashed" instead of saving the
  preemption checkpoint. `shield_workers` makes the workers ignore SIGTERM from anyone but the
  rank (the rank decides when to stop; the workers still end with their loader, when the rank
  exits, or by the launcher's final SIGKILL).
- **The training RNG stream.** Every new loader iterator draws its workers' base seed from the
  global torch RNG unless the loader has a generator of its own; the iterator a resumed run
  creates mid-epoch would then shift the global stream (dropout masks) against an uninterrupted
  run. `prepare_loader` gives such a loader its own generator.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import sys
import threading
from collections.abc import Callable
from multiprocessing import context as mp_context
from typing import Any, Generic, TypeVar

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from gpujobs_trainer.prepared_loaders import underlying_loader

_T_co = TypeVar("_T_co", covariant=True)

WorkerInitFn = Callable[[int], None]


class SeededSamples(Dataset[_T_co], Generic[_T_co]):
    """A map-style dataset whose every sample is loaded with RNGs seeded from (seed, epoch, index).

    Wrap the dataset whose ``__getitem__`` augments (random crops, flips, noise through
    ``torch.rand``, ``random`` or ``np.random``), and call ``set_epoch(epoch)`` next to
    ``sampler.set_epoch(epoch)``, before iterating. The caller's own RNG states are left as
    they were (``num_workers=0`` loads samples in the training process).
    """

    def __init__(self, dataset: Dataset[_T_co], *, seed: int) -> None:
        self.dataset = dataset
        self.seed = seed
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]

    def set_epoch(self, epoch: int) -> None:
        self._epoch[0] = epoch

    @property
    def epoch(self) -> int:
        return int(self._epoch[0])

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]  # map-style datasets have a length

    def __getitem__(self, index: int) -> _T_co:
        torch_seed, python_seed, numpy_seed = sample_seeds(self.seed, self.epoch, index)
        python_state = random.getstate()
        numpy_state = np.random.get_state()
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(torch_seed)  # CPU only: CUDA streams are training's
            random.seed(python_seed)
            np.random.seed([numpy_seed & 0xFFFFFFFF, numpy_seed >> 32])
            try:
                return self.dataset[index]
            finally:
                random.setstate(python_state)
                np.random.set_state(numpy_state)


def sample_seeds(seed: int, epoch: int, index: int) -> tuple[int, int, int]:
    """Three 64-bit seeds (torch, Python, numpy) for every (seed, epoch, index), the same in every
    process. Each RNG gets its own: Python's and numpy's Mersenne Twisters seeded alike would draw
    the same numbers, and a flip decided by one would follow a scale drawn by the other."""
    digest = hashlib.blake2b(f"{seed}/{epoch}/{index}".encode(), digest_size=24).digest()
    torch_seed, python_seed, numpy_seed = (int.from_bytes(digest[i : i + 8], "little") for i in (0, 8, 16))
    return torch_seed, python_seed, numpy_seed


class _IgnoreSigterm:
    """A worker_init_fn that makes the worker ignore SIGTERM from anyone but its parent, then runs
    the loader's own (picklable, for loaders that start workers with spawn or forkserver).

    SIGTERM is blocked and taken by a thread with ``sigwaitinfo``, which knows who sent it: the
    parent's (multiprocessing terminates daemonic workers as the rank exits) ends the worker as
    torch's own handler does; anyone else's (torchrun's signal to the rank's process group) is
    dropped. Plain SIG_IGN would make the rank's exit wait for ever on workers it cannot stop.
    """

    def __init__(self, inner: WorkerInitFn | None) -> None:
        self.inner = inner

    def __call__(self, worker_id: int) -> None:
        if hasattr(signal, "sigwaitinfo"):  # Linux, where training runs; not macOS
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # inherited by later threads
            threading.Thread(
                target=_exit_on_sigterm_from, args=(os.getppid(),), name="gpujobs-worker-sigterm", daemon=True
            ).start()
        if self.inner is not None:
            self.inner(worker_id)


def _exit_on_sigterm_from(parent: int) -> None:
    while True:
        if signal.sigwaitinfo({signal.SIGTERM}).si_pid == parent:
            os._exit(0)


class _BornShielded:
    """A worker process started with SIGTERM blocked, when its worker_init_fn is the shield.

    torch installs its own SIGTERM handler in a new worker (it kills the worker when anyone but
    the rank sent the signal) before the worker_init_fn runs; a signal in between, which torchrun
    sends whenever it likes (workers start again every epoch unless they persist), would kill the
    worker. A child inherits its parent thread's signal mask, through exec too: blocked from
    birth, the signal waits until the shield's thread takes it.

    Not for ``forkserver`` loaders: their workers are the fork server's children (it would keep
    SIGTERM blocked for every process it forks later), and torchrun's signal to the group ends the
    fork server and, with it, the workers (torch's watchdog sees their parent gone). Use ``fork``
    (the default on Linux up to Python 3.13) or ``spawn`` with a shielded loader."""

    _args: tuple[Any, ...]

    def start(self) -> None:
        if not any(isinstance(arg, _IgnoreSigterm) for arg in self._args):
            super().start()  # type: ignore[misc]  # the process class this is mixed into
            return
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            super().start()  # type: ignore[misc]
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)


if sys.platform != "win32":

    class _ShieldedForkProcess(_BornShielded, mp_context.ForkProcess):
        pass

    class _ShieldedSpawnProcess(_BornShielded, mp_context.SpawnProcess):
        pass

    class _ShieldedForkContext(mp_context.ForkContext):
        Process = _ShieldedForkProcess

    class _ShieldedSpawnContext(mp_context.SpawnContext):
        Process = _ShieldedSpawnProcess

    _SHIELDED_CONTEXTS: dict[str, type[mp_context.BaseContext]] = {
        "fork": _ShieldedForkContext,
        "spawn": _ShieldedSpawnContext,
    }
else:  # pragma: no cover  # training runs on Linux
    _SHIELDED_CONTEXTS = {}


def shield_workers(loader: DataLoader[Any]) -> None:
    """Make the loader's worker processes ignore SIGTERM (see the module docstring), from the
    moment they start. Call it before the loader starts its workers; calling it twice is harmless.
    A loader Accelerate prepared is shielded underneath (`prepared_loaders`)."""
    loader = underlying_loader(loader)
    if not isinstance(loader.worker_init_fn, _IgnoreSigterm):
        loader.worker_init_fn = _IgnoreSigterm(loader.worker_init_fn)
    if loader.num_workers > 0 and hasattr(signal, "pthread_sigmask"):
        current = loader.multiprocessing_context or torch.multiprocessing.get_context()
        if not isinstance(current, tuple(_SHIELDED_CONTEXTS.values())):
            shielded = _SHIELDED_CONTEXTS.get(current.get_start_method())
            if shielded is not None:
                loader.multiprocessing_context = shielded()


def prepare_loader(loader: DataLoader[Any], *, rank: int) -> None:
    """What a loader given to ``init(state=...)`` needs to resume exactly and survive SIGTERM:
    shielded workers, and worker seeds drawn from a generator of its own (seeded from the
    global RNG, per rank) instead of the training RNG stream. Applied to the loader underneath
    one Accelerate prepared (`prepared_loaders`)."""
    loader = underlying_loader(loader)
    restart = getattr(loader, "load_state_dict", None)
    if getattr(loader, "_initial_iter_for_state_dict", False) and callable(restart):
        # Its workers were started only to read its initial state (Accelerate's prepare asks for it),
        # unshielded and seeded from the training RNG; no batch was taken, so start them again.
        restart({})
    shield_workers(loader)
    if loader.generator is None:
        generator = torch.Generator()
        generator.manual_seed(int(torch.randint(0, 2**62, (1,))) + rank)
        loader.generator = generator
