"""The bootstrap's own log: timestamped lines on stdout.

On EC2 the shell part of the user data appends stdout to /var/log/gpujobs-bootstrap.log; the local
cloud writes it to <workdir>/instances/<id>/bootstrap.log.
"""

from __future__ import annotations

import time


def log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} gpujobs-bootstrap: {message}", flush=True)
