"""Whether the image a job names is already on this host, and provably the one it asks for.

An AMI baked with the job's image (`gpujobs bake`; docs/deploy.md, "Faster replacements: a baked
AMI") holds it in docker's store, so the bootstrap may skip the pull. A tag can be moved in its
registry after the AMI was baked, though, so a copy on the host counts only when it is provably the
one the registry names now:

- **pinned by digest** (`repo@sha256:...`, with or without a tag): a digest names content, so
  `docker image inspect repo@sha256:...` finding it is the proof;
- **a tag of an ECR repository**: the local tag's `RepoDigests` (what docker recorded when it
  pulled it) must hold `repo@D`, where D is what the registry gives the tag now: the image digest
  of ECR's `BatchGetImage` answer, or the SHA-256 of the manifest it returns (either is a content
  address, so equality cannot come from a stale copy). The instance role may already call
  `ecr:BatchGetImage` on every repository it may pull from: a pull calls it;
- **anything else is pulled**: a tag outside ECR (its registry cannot be asked without a login and
  a registry client), a tag the registry cannot be asked about (refused, unreachable), no image
  under the tag, a local copy with no registry digest (built or loaded on the host).

A pull is docker's: it fetches only the layers the host lacks, so a baked AMI shortens even the
pull of a newer image whose base layers it holds. Stdlib only (the bootstrap runs on the AMI's
Python 3.9+).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, NamedTuple

_DOMAIN = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]{1,5})?"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
REFERENCE = re.compile(
    rf"^(?P<name>(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[a-f0-9]{64}))?$"
)
"""A docker image reference as the distribution project's grammar writes it (name, optional tag,
optional sha256 digest), and nothing else: no space, quote, shell character or line break. A name
whose first component is not a registry (no `.` or `:`) is still accepted: docker reads it as Docker
Hub's."""
MAX_REFERENCE_LENGTH = 512
"""Longer is no reference docker takes (a name has at most 255 characters, a tag 128)."""
INSPECT_DIGESTS = "{{json .RepoDigests}}"
"""`docker image inspect --format`: the registry digests docker recorded for a local image."""
MANIFEST_TYPES = [
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v1+json",
]
"""What `BatchGetImage` may answer with (ECR's documented values), so it returns a stored manifest as it is."""


class ImageReference(NamedTuple):
    """One image reference, split: `name` (registry and repository), `tag`, `digest` ("" when absent)."""

    name: str
    tag: str
    digest: str

    @property
    def local(self) -> str:
        """What docker resolves on this host: `name@digest` when pinned (a digest wins over a tag), else `name:tag`."""
        return f"{self.name}@{self.digest}" if self.digest else f"{self.name}:{self.tag or 'latest'}"

    @property
    def repository(self) -> str:
        """The repository within its registry (ECR's `repositoryName`): the name less its first component."""
        return self.name.split("/", 1)[1] if "/" in self.name else self.name


def parse(image: str) -> ImageReference | None:
    """`image` split into name, tag and digest; None when it is not a plain reference (REFERENCE)."""
    found = REFERENCE.match(image) if len(image) <= MAX_REFERENCE_LENGTH else None
    if found is None:
        return None
    return ImageReference(found.group("name"), found.group("tag") or "", found.group("digest") or "")


def repo_digests(inspect_output: str, name: str) -> set[str]:
    """The digests under `name` among a local image's RepoDigests (`docker image inspect --format INSPECT_DIGESTS`)."""
    try:
        listed = json.loads(inspect_output or "null")
    except ValueError:
        return set()
    if not isinstance(listed, list):
        return set()
    return {entry.split("@", 1)[1] for entry in listed if isinstance(entry, str) and entry.startswith(f"{name}@")}


def registry_digests(answer: dict[str, Any]) -> set[str]:
    """The digests an ECR `BatchGetImage` answer gives the one image asked for: its image id's, and the
    SHA-256 of the manifest it returned. Empty when the registry has no image under the tag."""
    found: set[str] = set()
    for image in answer.get("images") or []:
        digest = (image.get("imageId") or {}).get("imageDigest")
        if isinstance(digest, str) and digest:
            found.add(digest)
        manifest = image.get("imageManifest")
        if isinstance(manifest, str) and manifest:
            found.add("sha256:" + hashlib.sha256(manifest.encode("utf-8")).hexdigest())
    return found
