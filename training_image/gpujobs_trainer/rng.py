"""Per-rank random number generator states, stored as JSON beside the DCP shards.

Each rank draws different dropout masks and augmentations, so each rank saves and restores its
own states. JSON (base64 for byte tensors) keeps the file readable without unpickling anything.
"""

from __future__ import annotations

import base64
import random
from typing import Any

import numpy as np
import torch


def _encode(tensor: torch.Tensor) -> str:
    return base64.b64encode(tensor.cpu().numpy().tobytes()).decode("ascii")


def _decode(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


def capture_rng_states() -> dict[str, Any]:
    """Python, numpy, torch CPU and (if present) CUDA generator states of this process."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return {
        "python": {"version": version, "internal": list(internal), "gauss": gauss},
        "numpy": {
            "kind": kind,
            "keys": [int(k) for k in keys],
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
        "torch": _encode(torch.get_rng_state()),
        "cuda": [_encode(s) for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else [],
    }


def restore_rng_states(states: dict[str, Any]) -> None:
    py = states["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss"]))
    npy = states["numpy"]
    np.random.set_state(
        (npy["kind"], np.array(npy["keys"], dtype=np.uint32), npy["pos"], npy["has_gauss"], npy["cached"])
    )
    torch.set_rng_state(_decode(states["torch"]))
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_decode(s) for s in states["cuda"]])
