"""The bootstrap's own log: timestamped lines on stdout, and to every sink in `SINKS`.

On EC2 the shell part of the user data appends stdout to /var/log/gpujobs-bootstrap.log; the local
cloud writes it to <workdir>/instances/<id>/bootstrap.log. The bootstrap adds its CloudWatch Logs
shipper as a sink for as long as it runs, so the same lines outlive the instance.
"""

from __future__ import annotations

import time
from collections.abc import Callable

SINKS: list[Callable[[str], None]] = []


def log(message: str) -> None:
    line = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} gpujobs-bootstrap: {message}"
    print(line, flush=True)
    for sink in SINKS:
        sink(line)
