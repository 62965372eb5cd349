"""Invoking the real handlers as Lambda does: one `Delivery` per invocation, retries, destinations.

`LambdaInvoker` loads each function the template routes events to (`functions/<name>/app.py`, as
a cold start would) and calls its handler with a Lambda context. Every call becomes a `Delivery`
record that `DeliveryLog` keeps and hands to its observers (the `local up` printout, the demo, the
tests). A `DeliveryLog` outlives the invokers of one local cloud, so observers subscribed before
`start()` see everything.

Asynchronous invocations (`invoke_async`: EventBridge rules, SNS, the schedule) follow the function's
`EventInvokeConfig`: an invocation that raises is retried up to `MaximumRetryAttempts` times
(Lambda's default 2 when absent), and once those are used up a Lambda destination record goes to
its `OnFailure` destination, the events dead-letter queue when it names none: never dropped
silently, never retried forever. The caller decides when the retry runs (an SQS visibility timeout,
or at once for the schedule); the invoker decides whether there is one.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpujobs_local import router
from gpujobs_local.router import ACCOUNT, Route
from gpujobs_local.stack import LambdaContext, load_function

log = logging.getLogger(__name__)

EVENTS_DEAD_LETTER_QUEUE = "EventsDeadLetterQueue"
"""The logical id of the queue a failed asynchronous invocation goes to when it names no destination."""


@dataclass(frozen=True)
class Delivery:
    """One handler invocation, as observers see it."""

    function: str  # logical id, e.g. SubmitFunction
    kind: str  # "SQS", "SNS", "Scheduled Event" or the EventBridge detail-type
    summary: str
    result: Any = None
    error: BaseException | None = None
    attempt: int = 1
    dead_lettered: bool = False
    seconds: float = 0.0
    event: Any = None

    @property
    def ok(self) -> bool:
        if self.error is not None:
            return False
        return not (isinstance(self.result, dict) and self.result.get("batchItemFailures"))

    @property
    def outcome(self) -> str:
        if self.error is not None:
            what = f"{type(self.error).__name__}: {str(self.error).splitlines()[0] if str(self.error) else ''}"
            return f"{'dead-lettered' if self.dead_lettered else 'failed, will retry'} ({what[:120]})"
        if isinstance(self.result, dict) and self.result.get("batchItemFailures"):
            return f"{len(self.result['batchItemFailures'])} item(s) failed, will retry"
        return "ok"

    def line(self) -> str:
        attempt = f" attempt {self.attempt}" if self.attempt > 1 else ""
        return f"{self.function:<22} {self.kind} [{self.summary}]{attempt} -> {self.outcome} ({self.seconds:.2f}s)"


class DeliveryLog:
    """The last 10 000 deliveries, and the observers told of each one as it happens."""

    def __init__(self) -> None:
        self.deliveries: deque[Delivery] = deque(maxlen=10_000)
        self._observers: list[Callable[[Delivery], None]] = []
        self._lock = threading.Lock()

    def subscribe(self, observer: Callable[[Delivery], None]) -> None:
        with self._lock:
            self._observers.append(observer)

    def record(self, delivery: Delivery) -> None:
        """Keep `delivery` and tell every observer; an observer that raises is logged, not propagated."""
        self.deliveries.append(delivery)
        with self._lock:
            observers = list(self._observers)
        for observer in observers:
            try:
                observer(delivery)
            except Exception:
                log.exception("delivery observer %r failed", observer)


class LambdaInvoker:
    """The stack's functions, each loaded once, invoked as Lambda would (see the module docstring)."""

    def __init__(
        self,
        *,
        routes: Iterable[Route],
        stack_name: str,
        region: str,
        sqs: Any,
        destinations: Mapping[str, str],
        log_to: DeliveryLog,
    ) -> None:
        """`destinations`: queue URL by logical id, for the `OnFailure` destinations (and the default)."""
        self.stack_name = stack_name
        self.region = region
        self._sqs = sqs
        self._destinations = dict(destinations)
        self._log = log_to
        self._handlers: dict[str, Callable[[dict[str, Any], Any], Any]] = {}
        for route in routes:
            if route.function not in self._handlers:
                self._handlers[route.function] = load_function(route.module).handler

    def function_arn(self, function: str) -> str:
        return f"arn:aws:lambda:{self.region}:{ACCOUNT}:function:{self.stack_name}-{function}"

    def invoke(self, route: Route, kind: str, event: dict[str, Any], *, attempt: int, last: bool) -> Delivery:
        """Call the handler once; `last` marks a failure as final (dead-lettered) in the record."""
        handler = self._handlers[route.function]
        context = LambdaContext(
            function_name=f"{self.stack_name}-{route.function}",
            invoked_function_arn=self.function_arn(route.function),
            aws_request_id=str(uuid.uuid4()),
        )
        started = time.perf_counter()
        result: Any = None
        error: BaseException | None = None
        try:
            result = handler(event, context)
        except Exception as exc:
            error = exc
            log.info("%s failed on %s (attempt %d): %s", route.function, kind, attempt, exc, exc_info=True)
        delivery = Delivery(
            function=route.function,
            kind=kind,
            summary=router.summarize(route.kind if route.kind in ("SQS", "SNS", "DynamoDB") else "event", event),
            result=result,
            error=error,
            attempt=attempt,
            dead_lettered=error is not None and last,
            seconds=time.perf_counter() - started,
            event=event,
        )
        self._log.record(delivery)
        return delivery

    def invoke_async(self, route: Route, kind: str, event: dict[str, Any], *, attempt: int) -> Delivery:
        """An asynchronous invocation's `attempt`: past the function's retries, a failure is dead-lettered.

        A failed delivery that is not `dead_lettered` is for the caller to retry.
        """
        last = attempt > route.async_retries
        delivery = self.invoke(route, kind, event, attempt=attempt, last=last)
        if delivery.error is not None and last:
            self.dead_letter(route, event, delivery.error, attempt)
        return delivery

    def dead_letter(self, route: Route, event: dict[str, Any], error: BaseException, invocations: int) -> None:
        """Send Lambda's destination record for `event` to the route's `OnFailure` destination."""
        record = router.destination_record(
            function_arn=self.function_arn(route.function), event=event, error=error, invocations=invocations
        )
        self.send_to_destination(route, record)
        log.warning("%s gave up after %d invocation(s): %s; event dead-lettered", route.function, invocations, error)

    def send_to_destination(self, route: Route, record: Mapping[str, Any]) -> None:
        """`record` to the route's `OnFailure` destination (the events dead-letter queue when it names none)."""
        url = self._destinations.get(route.on_failure or "", self._destinations[EVENTS_DEAD_LETTER_QUEUE])
        self._sqs.send_message(QueueUrl=url, MessageBody=json.dumps(record, default=str))
