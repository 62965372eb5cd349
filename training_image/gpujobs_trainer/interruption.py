"""Learning that the instance is about to go away, or that a checkpoint is wanted now.

Two sources set two local flags; the training loop combines them across ranks at every step:
- ``preempt``: the IMDSv2 spot ``instance-action`` notice (the only signal with a ~2 minute
  budget) or SIGTERM (last-chance path: docker stop, torchrun forwarding).
- ``checkpoint_now``: an EC2 rebalance recommendation, SIGUSR1 (the control plane's
  ``docker kill --signal SIGUSR1``) or a call from user code.
Signal handlers only record; all real work happens at the step boundary, where `coalescing`
turns what every rank recorded into one decision. A checkpoint-now request also makes the watcher
look at the spot notice at once: the control plane sends one when a warning comes, and finding the
notice turns the request into the preemption save instead of a save of its own.
"""

from __future__ import annotations

import json
import logging
import queue
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType

log = logging.getLogger("gpujobs_trainer")

TOKEN_PATH = "/latest/api/token"  # noqa: S105 (a URL path, not a secret)
INSTANCE_ACTION_PATH = "/latest/meta-data/spot/instance-action"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
TOKEN_TTL_SECONDS = 21600


@dataclass
class StopFlags:
    """What the signal handlers and the watcher thread recorded, without locks: a handler runs in
    the main thread between two bytecodes, so a lock the main thread holds would deadlock it.
    Attribute writes and ``list.append`` / ``del list[:n]`` are atomic under the GIL."""

    preempt: bool = False
    preempt_reason: str = ""
    on_checkpoint_request: Callable[[], None] | None = None
    """Called (signal-safe) after each checkpoint-now request: the IMDS watcher's ``poll_now``."""
    _requests: list[float] = field(default_factory=list, repr=False)
    """Monotonic arrival times of the checkpoint-now requests not served yet, oldest first."""

    def request_preempt(self, why: str) -> None:
        if not self.preempt:
            self.preempt_reason = why
        self.preempt = True

    def request_checkpoint(self) -> None:
        self._requests.append(time.monotonic())
        if self.on_checkpoint_request is not None:
            self.on_checkpoint_request()

    @property
    def checkpoint_now(self) -> bool:
        return bool(self._requests)

    def pending_requests(self) -> tuple[int, float | None]:
        """How many requests are waiting, and when the oldest of them arrived."""
        requests = list(self._requests)
        return len(requests), (requests[0] if requests else None)

    def serve_requests(self, count: int) -> None:
        """The ``count`` oldest requests are served by a checkpoint; newer ones stay pending."""
        del self._requests[:count]


def install_signal_handlers(flags: StopFlags) -> None:
    """SIGTERM -> preempt (final save, exit 75); SIGUSR1 -> checkpoint now and keep training."""

    def on_term(_signum: int, _frame: FrameType | None) -> None:
        flags.request_preempt("SIGTERM")

    def on_usr1(_signum: int, _frame: FrameType | None) -> None:
        flags.request_checkpoint()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGUSR1, on_usr1)


class ImdsUnreachableError(Exception):
    """The metadata service did not answer (not on EC2, or hop limit 1 from a container)."""


class ImdsClient:
    """Minimal IMDSv2 client: token PUT, then GETs with the token; 404 = nothing scheduled."""

    def __init__(self, endpoint: str, *, timeout: float = 1.0) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.timeout = timeout
        self._token: str | None = None

    def _fetch_token(self) -> str:
        request = urllib.request.Request(  # noqa: S310 (endpoint is http(s) from config)
            self.endpoint + TOKEN_PATH,
            method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_SECONDS)},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                return str(response.read().decode("utf-8"))
        except (urllib.error.URLError, OSError) as exc:
            raise ImdsUnreachableError(f"IMDS token request to {self.endpoint} failed: {exc}") from exc

    def get(self, path: str) -> str | None:
        """Body of ``path``, or None on 404. Refreshes the token once on 401."""
        for _ in range(2):
            if self._token is None:
                self._token = self._fetch_token()
            request = urllib.request.Request(  # noqa: S310
                self.endpoint + path, headers={"X-aws-ec2-metadata-token": self._token}
            )
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                    return str(response.read().decode("utf-8"))
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return None
                if exc.code == 401:
                    self._token = None
                    continue
                raise ImdsUnreachableError(f"IMDS GET {path}: HTTP {exc.code}") from exc
            except (urllib.error.URLError, OSError) as exc:
                raise ImdsUnreachableError(f"IMDS GET {path} failed: {exc}") from exc
        raise ImdsUnreachableError(f"IMDS GET {path}: token rejected twice")


class ImdsWatcher:
    """Polls the spot notice and the rebalance recommendation every ``interval`` seconds, and at
    once when ``poll_now`` is called (every checkpoint-now request calls it).

    ``required=False`` (the default off EC2): the first failure logs one line and stops the
    watcher. ``required=True`` (an endpoint was configured explicitly): keep polling, logging
    once per outage.
    """

    def __init__(self, client: ImdsClient, flags: StopFlags, *, interval: float, required: bool) -> None:
        self.client = client
        self.flags = flags
        self.interval = interval
        self.required = required
        self.disabled = False
        self._seen_rebalance: str | None = None
        # SimpleQueue.put is reentrant, so a signal handler may call poll_now: False = poll now, True = stop.
        self._wake: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="gpujobs-imds", daemon=True)

    def start(self) -> None:
        self.flags.on_checkpoint_request = self.poll_now
        self._thread.start()

    def stop(self) -> None:
        self.flags.on_checkpoint_request = None
        self._wake.put(True)
        if self._thread.is_alive():
            self._thread.join(timeout=self.client.timeout * 3 + 1)

    def poll_now(self) -> None:
        """Look at the notice without waiting for the next poll (signal-safe)."""
        self._wake.put(False)

    def poll_once(self) -> None:
        """One poll; raises ImdsUnreachableError when the service does not answer."""
        action = self.client.get(INSTANCE_ACTION_PATH)
        if action is not None:
            self.flags.request_preempt(f"spot instance-action {_summary(action)}")
            return
        rebalance = self.client.get(REBALANCE_PATH)
        if rebalance is not None and rebalance != self._seen_rebalance:
            self._seen_rebalance = rebalance
            log.info("rebalance recommendation %s: checkpointing now", _summary(rebalance))
            self.flags.request_checkpoint()

    def _run(self) -> None:
        in_outage = False
        while True:
            try:
                self.poll_once()
                in_outage = False
            except ImdsUnreachableError as exc:
                if not self.required:
                    log.info("instance metadata unreachable (%s): interruption watcher disabled", exc)
                    self.disabled = True
                    return
                if not in_outage:
                    log.warning("instance metadata unreachable, will keep polling: %s", exc)
                in_outage = True
            if self.flags.preempt or self._wait():
                return

    def _wait(self) -> bool:
        """Sleep until the next poll is due or wanted; True when the watcher is to stop."""
        try:
            stop = self._wake.get(timeout=self.interval)
        except queue.Empty:
            return False
        while not stop and not self._wake.empty():  # wake-ups that piled up need one poll
            stop = self._wake.get_nowait()
        return stop


def _summary(body: str) -> str:
    try:
        return json.dumps(json.loads(body), sort_keys=True)
    except ValueError:
        return body[:200]
