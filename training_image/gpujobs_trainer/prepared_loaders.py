"""Data loaders a framework prepared (Hugging Face Accelerate's ``accelerator.prepare(loader)``).

Accelerate returns a ``DataLoaderShard``: an adapter around a new loader it builds
(``base_dataloader``) that reports the inner loader's class as its own, so it passes
``isinstance(x, DataLoader)``, yet takes attribute writes on itself. Three surprises follow, each
handled here so that a prepared loader given to ``init(state=...)`` resumes like a plain one:

- **Attribute writes miss the loader that runs.** `shield_workers` and `prepare_loader` set
  ``worker_init_fn``, ``multiprocessing_context`` and ``generator``; on the adapter they would land
  on the adapter and do nothing (workers killed by torchrun's SIGTERM, worker seeds drawn from the
  training RNG: dropout masks differ after a resume). They are applied to `underlying_loader`.
- **Only a stateful inner loader has a position.** Accelerate builds a plain ``DataLoader`` unless
  told ``use_stateful_dataloader=True``; its adapter still has ``state_dict()``, which then fails.
- **The default shuffle is not reproducible.** Without ``use_seedable_sampler=True`` Accelerate
  gives the ``RandomSampler`` a generator seeded once from the global RNG, and each epoch's order
  continues that generator's stream, which no checkpoint holds: a resumed run shuffles differently.
  ``SeedableRandomSampler`` seeds each epoch from ``(seed, epoch)``, so the saved position replays.

Both settings live in one place, ``Accelerator(dataloader_config=DataLoaderConfiguration(...))``;
a loader without them is a `ConfigError` at ``init`` naming that line, before any step runs.
Accelerate is never imported here: the adapter is recognised by its ``base_dataloader``.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader, RandomSampler

from gpujobs_trainer.errors import ConfigError

_FIX = "Accelerator(dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True, use_seedable_sampler=True))"


def underlying_loader(loader: Any) -> Any:
    """The loader that actually iterates: Accelerate's ``base_dataloader``, else ``loader`` itself."""
    inner = vars(loader).get("base_dataloader") if hasattr(loader, "__dict__") else None
    return inner if isinstance(inner, DataLoader) else loader


def is_prepared(loader: Any) -> bool:
    return underlying_loader(loader) is not loader


def check_prepared_loader(name: str, loader: Any) -> None:
    """ConfigError when a prepared loader cannot resume exactly (see the module docstring)."""
    if not is_prepared(loader):
        return
    inner = underlying_loader(loader)
    if not callable(getattr(inner, "state_dict", None)):
        raise ConfigError(
            f"init(state=...): {name!r} was prepared by Accelerate around a plain DataLoader, which has no "
            f"position to save; prepare it with {_FIX}"
        )
    for sampler in _samplers(inner):
        if type(sampler) is RandomSampler:  # SeedableRandomSampler subclasses it
            raise ConfigError(
                f"init(state=...): {name!r} shuffles with Accelerate's default RandomSampler, whose order after a "
                f"resume is not the order the checkpoint was taken in; prepare it with {_FIX}"
            )


def _samplers(loader: Any) -> list[Any]:
    """The samplers under a loader's batch sampler (Accelerate nests BatchSamplerShard > BatchSampler > sampler)."""
    found: list[Any] = []
    pending = [getattr(loader, "batch_sampler", None), getattr(loader, "sampler", None)]
    while pending:
        item = pending.pop()
        if item is None or any(item is seen for seen in found) or len(found) > 8:
            continue
        found.append(item)
        pending += [getattr(item, "batch_sampler", None), getattr(item, "sampler", None)]
    return found
