"""One gang per attempt: when a gang's leftovers must go so that no attempt ever runs two.

Two ways a gang ends up broken. A launcher that crashed after RunInstances leaves a gang that
nobody recorded; if some of its nodes died before the takeover finds it, the takeover holds a
partial gang that can never train (every rank must join), and relaunching under the same client
tokens would only get the same broken reservation back from EC2. And when spot reclaims one node of
a gang, the replacement launches at once while the rest of the old gang saves its checkpoint; a
trainer that hangs instead of exiting would keep those survivors, and the replacement waiting on
them, alive forever. These are the pure answers; the launcher and the reconciler act on them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from gpujobs.domain.job import Attempt

SPOT_WARNING_WINDOW = timedelta(minutes=2)
"""EC2's notice before it reclaims a spot instance."""
RECLAIM_GRACE = timedelta(minutes=3)
"""How long past the warning window the survivors of a reclaimed gang may take to save and exit."""


def is_partial_gang(found: Sequence[object], *, nodes: int) -> bool:
    """Some, but not all, of an attempt's gang is alive: it cannot train and must not be adopted."""
    return 0 < len(found) < nodes


def overdue_survivors(attempt: Attempt, *, now: datetime) -> tuple[str, ...]:
    """Instances of a reclaimed attempt still up after the warning window plus the grace."""
    if attempt.interrupted_at is None or attempt.is_over:
        return ()
    if now - attempt.interrupted_at < SPOT_WARNING_WINDOW + RECLAIM_GRACE:
        return ()
    return tuple(i for i in attempt.instance_ids if i not in attempt.gone)
