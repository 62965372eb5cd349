"""`Ports.time_left` in a Lambda container is the remaining time of the invocation in progress:
each launching handler binds its context first, and a thread that has bound none has no deadline."""

from __future__ import annotations

import threading
from datetime import timedelta

from gpujobs.runtime.bootstrap import TIME_LEFT, InvocationTimeLeft, bind_context


class Context:
    def __init__(self, remaining_ms: int) -> None:
        self.remaining_ms = remaining_ms

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


def test_the_time_left_is_the_bound_contexts_remaining_time_read_when_asked() -> None:
    context = Context(42_000)
    bind_context(context)
    assert TIME_LEFT() == timedelta(seconds=42)

    context.remaining_ms = 9_500  # the walk asks again before each rung
    assert TIME_LEFT() == timedelta(seconds=9.5)

    bind_context(Context(60_000))  # the next invocation replaces it
    assert TIME_LEFT() == timedelta(minutes=1)
    TIME_LEFT.bind(None)


def test_a_thread_that_bound_no_context_has_no_deadline() -> None:
    time_left = InvocationTimeLeft()
    time_left.bind(lambda: 1_000)
    seen: list[timedelta | None] = []

    other = threading.Thread(target=lambda: seen.append(time_left()))
    other.start()
    other.join()

    assert seen == [None]
    assert time_left() == timedelta(seconds=1)
