"""The job's outputs: what the workload writes to $GPUJOBS_OUTPUT_DIR is uploaded to S3 by the bootstrap.

The bootstrap uploads, not the container: it outlives the workload, so the upload at the end happens
whatever the exit (a crash, a kill after the stop timeout, an image that is not ours), and it uses
the job's credentials, whose session policy allows writing `outputs/<own job id>/` only. Before the
end, the workload asks for an upload by creating `OUTPUT_UPLOAD_REQUEST_FILE` in the folder
(`run.save_outputs()` does; any script can `touch` it): a thread here polls for it every second,
renames it to `OUTPUT_UPLOAD_TAKEN_FILE`, uploads, then removes that. So a workload that waits until
neither name exists knows that what it wrote before asking is in S3: the trainer's launcher does so
before it reports the exit, since that report may end the job and terminate the instance. Node 0
uploads to the document's `outputs_uri`, node K > 0 under `node-K/` in it.

An upload sends each regular file whose (size, mtime) differs from what this node sent last, so
asking twice sends nothing twice; it adds and overwrites objects, never deletes one. Names starting
with `OUTPUT_UNSENT_PREFIX` are never sent: the request, and files being written under a temporary
name (renamed once complete), which would otherwise stay in S3 beside the finished file. The workload
owns the folder and the bootstrap runs as root, so nothing is followed out of it: `os.fwalk` never
enters a symlinked folder (and notices one swapped in), each file is opened with O_NOFOLLOW and must
be a regular file with a single link (a hard link could name a file outside the folder).
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading

from gpujobs.instance.aws import Clients
from gpujobs.instance.contract import OUTPUT_UNSENT_PREFIX, OUTPUT_UPLOAD_REQUEST_FILE, OUTPUT_UPLOAD_TAKEN_FILE
from gpujobs.instance.log import log


class Outputs:
    """One node's output folder (`folder`, on this host) and its uploads to `uri`."""

    def __init__(self, folder: str, clients: Clients, *, uri: str, node_rank: int, poll: float = 1.0) -> None:
        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        self.folder, self.clients, self.bucket, self.poll = folder, clients, bucket, poll
        self.prefix = prefix.rstrip("/") + "/" + (f"node-{node_rank}/" if node_rank else "")
        self.sent: dict[str, tuple[int, int]] = {}
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve_requests, daemon=True)

    def upload(self) -> int:
        """Upload what changed since the last upload; returns how many files were sent."""
        s3, count = self.clients("s3"), 0  # a new client each time: the job's session is renewed
        for top, _, names, top_fd in os.fwalk(self.folder):
            relative = os.path.relpath(top, self.folder).replace(os.sep, "/")
            for name in names:
                if name.startswith(OUTPUT_UNSENT_PREFIX):
                    continue
                key = self.prefix + ("" if relative == "." else relative + "/") + name
                try:
                    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=top_fd)
                except OSError:
                    continue  # a symlink, or gone
                with os.fdopen(fd, "rb") as file:
                    info = os.fstat(fd)
                    seen = (info.st_size, info.st_mtime_ns)
                    if stat.S_ISREG(info.st_mode) and info.st_nlink == 1 and self.sent.get(key) != seen:
                        s3.upload_fileobj(file, self.bucket, key)
                        self.sent[key], count = seen, count + 1
        return count

    def __enter__(self) -> Outputs:
        """Serve upload requests until the block ends."""
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        """The upload at the end, however the block ended: after a requested one still running, never raising."""
        self.stopping.set()
        self.thread.join()
        self._upload_logged("the end")

    def _serve_requests(self) -> None:
        taken = os.path.join(self.folder, OUTPUT_UPLOAD_TAKEN_FILE)
        while not self.stopping.wait(self.poll):
            try:
                os.replace(os.path.join(self.folder, OUTPUT_UPLOAD_REQUEST_FILE), taken)
            except OSError:
                continue
            self._upload_logged("request")
            with contextlib.suppress(OSError):
                os.unlink(taken)

    def _upload_logged(self, why: str) -> None:
        where = f"s3://{self.bucket}/{self.prefix}"
        try:
            log(f"outputs ({why}): {self.upload()} file(s) uploaded to {where}")
        except Exception as exc:  # an upload that fails must not change the job's exit
            log(f"outputs ({why}): upload to {where} failed: {exc}")
