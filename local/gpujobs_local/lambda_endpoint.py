"""Lambda's synchronous Invoke on 127.0.0.1, for what runs in another process (a local instance's bootstrap).

moto's Lambda runs functions in docker; the local cloud answers the functions invoked directly (the
credentials function) with their real handler instead. In process that is a botocore hook
(`MotoStack._invoke_directly`); a process points its Lambda client here with
`AWS_ENDPOINT_URL_LAMBDA` (botocore's service-specific endpoint variable). Both route through the
same `invoke(name, payload)` (`MotoStack.invoke`): `POST /2015-03-31/functions/<name or ARN>/invocations`
is answered 200 with the handler's JSON result, as Lambda does, and a function it does not know with
404 `ResourceNotFoundException`.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any

from gpujobs_local.serving import LocalServer

Invoke = Callable[[str, bytes], "bytes | None"]
"""(function name or ARN, payload) -> the handler's JSON result, or None for a function not served."""
PREFIX = "/2015-03-31/functions/"


def function_name(path: str) -> str | None:
    """The function an Invoke path names (`<name>`, `<arn>`, either with a `:qualifier`), or None."""
    path = urllib.parse.urlsplit(path).path
    if not path.startswith(PREFIX) or not path.endswith("/invocations"):
        return None
    return urllib.parse.unquote(path[len(PREFIX) : -len("/invocations")])


class LambdaEndpoint(LocalServer):
    """Lambda Invoke on 127.0.0.1 (ephemeral port), answered by `invoke`."""

    def __init__(self, invoke: Invoke, *, host: str = "127.0.0.1") -> None:
        self.invoke = invoke
        self.invocations: list[str] = []
        super().__init__(self._handler(), host=host, name="local-lambda")
        self._lock = threading.Lock()  # one invocation at a time, as on the loop thread

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _reply(self, code: int, body: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

            def _not_found(self, name: str) -> None:
                message = f"Function not found: {name}"
                body = json.dumps({"Type": "User", "Message": message}).encode()
                self._reply(404, body, {"x-amzn-ErrorType": "ResourceNotFoundException"})

            def do_POST(self) -> None:
                name = function_name(self.path)
                payload = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if name is None:
                    self._not_found(self.path)
                    return
                try:
                    with endpoint._lock:
                        endpoint.invocations.append(name)
                        result = endpoint.invoke(name, payload)
                except Exception as exc:  # the handler raised: Lambda answers 200 with FunctionError
                    body = json.dumps({"errorMessage": str(exc), "errorType": type(exc).__name__}).encode()
                    self._reply(200, body, {"X-Amz-Function-Error": "Unhandled"})
                    return
                if result is None:
                    self._not_found(name)
                else:
                    self._reply(200, result, {"X-Amz-Executed-Version": "$LATEST"})

        return Handler
