"""File digests for checkpoints: BLAKE3 for what is written now, SHA-256 still read.

A checkpoint's marker (and a synced folder's manifest) records a digest of every file, so a resume
trusts only bytes that are exactly those committed. Computing them is on the save's critical path
(each writer thread hashes its own file as it writes it), so the hash is BLAKE3: a cryptographic
hash that ran 1.6 to 1.7 times as fast as SHA-256 on the development VM, whose CPU has SHA
extensions (AVX2, no AVX-512; BLAKE3's lead is larger without SHA extensions or with AVX-512).
`bench/checkpoint_bench.py` measures both, alternating. Markers written before it recorded
SHA-256; those are still verified with SHA-256.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Protocol

import blake3

BLAKE3, SHA256 = "blake3", "sha256"
ALGORITHMS = (BLAKE3, SHA256)
DEFAULT_ALGORITHM = BLAKE3
_HEX64 = re.compile(r"[0-9a-f]{64}")
_CHUNK = 4 * 1024 * 1024


class Hasher(Protocol):
    def update(self, data: bytes | memoryview, /) -> object: ...
    def hexdigest(self) -> str: ...


def new_hasher(algorithm: str = DEFAULT_ALGORITHM) -> Hasher:
    """A streaming hasher; both release the GIL on large buffers, so writer threads hash in parallel."""
    if algorithm == BLAKE3:
        return blake3.blake3()
    if algorithm == SHA256:
        return hashlib.sha256()
    raise ValueError(f"unknown digest algorithm {algorithm!r}")


def is_digest(text: str) -> bool:
    """A 256-bit digest in lower-case hex (both algorithms give 32 bytes)."""
    return _HEX64.fullmatch(text) is not None


def file_digest(path: Path, algorithm: str = DEFAULT_ALGORITHM) -> str:
    hasher = new_hasher(algorithm)
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            hasher.update(chunk)
    return hasher.hexdigest()


def bytes_digest(data: bytes, algorithm: str = DEFAULT_ALGORITHM) -> str:
    hasher = new_hasher(algorithm)
    hasher.update(data)
    return hasher.hexdigest()
