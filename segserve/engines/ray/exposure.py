"""What a running Ray engine listens on, and which of those listeners answer without a key (docs/security.md's
table; tests/integration/test_ray_management.py fails on a new one).

A listener is fine when it is bound to loopback, or when a request without a key is refused: an HTTP GET answered
400 (TorchServe's InvalidKeyException: the engine's own APIs, a replica's direct port) or 401 (Ray's token, its
agents' HTTP), or a port that does not speak HTTP/1 (Ray's gRPC servers: GCS, raylet, every worker's and actor's
core worker; Ray's token auth answers UNAUTHENTICATED to a call without the token, checked on the GCS). A listener
that answers such a GET with anything else is open. Ray 2.60's own Prometheus exporters (the autoscaler monitor's,
the dashboard head's and the dashboard agent's metrics) are open on all interfaces: Ray resolves a node IP of
127.0.0.1 to the machine's address for them, and no setting binds them to loopback; they are reported apart
(RAY_METRICS), read-only metrics, named in docs/security.md.
"""

import http.client
from dataclasses import dataclass

import psutil

LOOPBACK = ("127.0.0.1", "::1")
RAY_EXPORTER_PROCESSES = ("python", "ray::DashboardAgent")  # the monitor and dashboard head run as plain python


@dataclass(frozen=True)
class Listener:
    pid: int
    process: str  # its name (Ray's workers: ray::<actor>)
    ip: str
    port: int


def listeners(pids: list[int]) -> list[Listener]:
    """Every TCP socket in state LISTEN of these processes."""
    found = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            name = process.name()
            for conn in process.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN:
                    found.append(Listener(pid, name, conn.laddr.ip, conn.laddr.port))
        except psutil.Error:  # gone meanwhile
            continue
    return found


def unkeyed_get(listener: Listener, timeout_s: float = 2) -> tuple[int | None, bytes]:
    """What a GET / without any key gets: (status, the body's first bytes); (None, b"") when the port does not
    answer HTTP/1 (a gRPC server closes or answers with an HTTP/2 frame)."""
    host = "127.0.0.1" if listener.ip in ("0.0.0.0", "::") else listener.ip
    connection = http.client.HTTPConnection(host, listener.port, timeout=timeout_s)
    try:
        connection.request("GET", "/")
        answer = connection.getresponse()
        return answer.status, answer.read(64)
    except (OSError, http.client.HTTPException):
        return None, b""
    finally:
        connection.close()


def verdict(listener: Listener, status: int | None, body: bytes) -> str:
    """`loopback`, `keyed` (refused without a key, or not HTTP: Ray's gRPC, token-guarded), `ray-metrics` (one of
    Ray's own Prometheus exporters, open), or `open`."""
    if listener.ip in LOOPBACK:
        return "loopback"
    if status is None or status in (400, 401, 403):
        return "keyed"
    if status == 200 and body.startswith(b"# HELP") and listener.process in RAY_EXPORTER_PROCESSES:
        return "ray-metrics"
    return "open"


def exposure(pids: list[int]) -> dict[str, list[Listener]]:
    """The engine's listeners by verdict."""
    found: dict[str, list[Listener]] = {}
    for listener in listeners(pids):
        status, body = (None, b"") if listener.ip in LOOPBACK else unkeyed_get(listener)
        found.setdefault(verdict(listener, status, body), []).append(listener)
    return found
