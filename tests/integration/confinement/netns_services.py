"""What runs beside the container in the runc test's private network namespaces, one process each.

`imds`: a fake EC2 IMDSv2 on 169.254.169.254:80 and [fd00:ec2::254]:80 (in the namespace that
plays the hypervisor's side), answering the token PUT and, with a token, the instance role's
credentials and a spot notice. `agent`: the bootstrap's real host agent (`HostAgent`) on the
"host" namespace's loopback, serving job credentials from a granting credentials function and relaying the spot notice
from that IMDS. Each prints one JSON line when it is serving (what the test waits for, instead of
sleeping), then serves until its stdin closes.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

INSTANCE_ROLE_PATH = "/latest/meta-data/iam/security-credentials/gpujobs-instance-role"
INSTANCE_ROLE_KEY = "ASIAINSTANCEROLE0001"
SPOT_NOTICE = {"action": "terminate", "time": "2030-01-01T00:00:00Z"}
JOB_KEY = "ASIAJOBSESSION000001"


class _Imds(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""

    def _reply(self, code: int, body: bytes = b"") -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self) -> None:
        ok = self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
        self._reply(200, b"imds-token") if ok else self._reply(400)

    def do_GET(self) -> None:
        if self.headers.get("X-aws-ec2-metadata-token") != "imds-token":
            self._reply(401)
        elif self.path == INSTANCE_ROLE_PATH:
            creds = {"Code": "Success", "AccessKeyId": INSTANCE_ROLE_KEY, "SecretAccessKey": "s", "Token": "t"}
            self._reply(200, json.dumps(creds).encode())
        elif self.path == "/latest/meta-data/spot/instance-action":
            self._reply(200, json.dumps(SPOT_NOTICE).encode())
        else:
            self._reply(404)


class _Server6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def serve_imds() -> None:
    servers = [ThreadingHTTPServer(("169.254.169.254", 80), _Imds), _Server6(("fd00:ec2::254", 80), _Imds)]
    for server in servers:
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
    print(json.dumps({"serving": "imds"}), flush=True)


class _GrantingCredentialsFunction:
    """Lambda's `Invoke` of the credentials function, granting every ask a job session."""

    def invoke(self, **request: Any) -> dict[str, Any]:
        expiration = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
        vended = {
            "AccessKeyId": JOB_KEY,
            "SecretAccessKey": "s",
            "SessionToken": "t",
            "Expiration": expiration.isoformat(),
        }
        return {"StatusCode": 200, "Payload": io.BytesIO(json.dumps({"credentials": vended}).encode())}


def _unsigned_proof(purpose: str) -> dict[str, Any]:
    return {"headers": {}, "body": ""}  # what the function would verify; this one grants without


def serve_agent() -> None:
    from gpujobs.instance.credentials import JobCredentials
    from gpujobs.instance.hostagent import HostAgent
    from gpujobs.instance.imds import Imds

    doc = {"job_id": "job-7", "attempt": 3, "stack": "gpujobs", "credentials_function": "gpujobs-CredentialsFunction"}
    credentials = JobCredentials(_GrantingCredentialsFunction(), doc, sign=_unsigned_proof)
    agent = HostAgent(credentials, Imds("http://169.254.169.254", tries=1)).start()
    public, private = agent.workload_env()
    print(json.dumps({"serving": "agent", "public": public, "private": private}), flush=True)


if __name__ == "__main__":
    {"imds": serve_imds, "agent": serve_agent}[sys.argv[1]]()
    sys.stdin.read()  # serve until the test closes our stdin
