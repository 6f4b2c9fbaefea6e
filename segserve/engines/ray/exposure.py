"""What a running Ray engine listens on, and which of those listeners answer without a key (docs/security.md's
table; tests/integration/test_ray_management.py fails on a new one).

A listener is fine when it is bound to loopback, or when a request without a key is refused: an HTTP GET answered
400 (TorchServe's InvalidKeyException: the engine's own APIs, a replica's direct port) or 401 (Ray's token, its
agents' HTTP), or a gRPC call answered UNAUTHENTICATED (Ray's token on its gRPC servers: the GCS, raylets, every
worker's core worker, and Serve's replicas' inter-deployment server, which Serve binds to [::] in code). A listener
that answers such a GET with anything else is open. A local engine's Ray listens on loopback alone
(engine.LOOPBACK_ONLY); a cluster's nodes on their addresses, where Ray 2.60's own Prometheus exporters (the
autoscaler monitor's, the dashboard head's and the dashboard agent's metrics) answer without a key: reported apart
(`ray-metrics`), read-only metrics, named in docs/security.md.
"""

import http.client
import ipaddress
from dataclasses import dataclass

import grpc
import psutil

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


def on_loopback(ip: str) -> bool:
    """127.0.0.0/8 and ::1, and 127.x as an IPv6 socket shows it (::ffff:127.0.0.1: Ray's gRPC servers)."""
    address = ipaddress.ip_address(ip)
    return address.is_loopback or bool(getattr(address, "ipv4_mapped", None) and address.ipv4_mapped.is_loopback)


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


# Read-only methods of Ray's gRPC services, empty requests: Ray's token interceptor wraps a server's own methods (a
# method the server lacks is UNIMPLEMENTED before any check), so a probe names real ones, the first that a server has
# tells. Serve's replicas' inter-deployment server; the GCS; a raylet; a worker's core worker.
PROBE_METHODS = (
    "/ray.serve.ASGIService/HandleRequest",
    "/ray.rpc.NodeInfoGcsService/GetClusterId",
    "/ray.rpc.NodeManagerService/GetNodeStats",
    "/ray.rpc.CoreWorkerService/GetCoreWorkerStats",
)


def unkeyed_grpc_call(listener: Listener, timeout_s: float = 2) -> str | None:
    """The status code's name that a call without a token gets from the first of PROBE_METHODS the server has (OK,
    or the method's own error, where the server ran it); None when the port does not speak gRPC or has none of them."""
    host = "127.0.0.1" if listener.ip in ("0.0.0.0", "::") else listener.ip
    with grpc.insecure_channel(f"{host}:{listener.port}") as channel:
        for method in PROBE_METHODS:
            call = channel.unary_unary(method, request_serializer=bytes, response_deserializer=bytes)
            try:
                call(b"", timeout=timeout_s)
                return grpc.StatusCode.OK.name
            except grpc.RpcError as error:
                code = error.code()
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                return None  # no gRPC server: the channel never came up
            if code != grpc.StatusCode.UNIMPLEMENTED:
                return code.name
    return None


def verdict(listener: Listener, status: int | None, body: bytes, grpc_code: str | None = None) -> str:
    """`loopback`, `keyed` (refused without a key: HTTP 400/401/403, gRPC UNAUTHENTICATED), `ray-metrics` (one of Ray's
    own Prometheus exporters, open), `unknown` (neither HTTP/1 nor one of Ray's gRPC services answered), or `open`."""
    if on_loopback(listener.ip):
        return "loopback"
    if status in (400, 401, 403) or (status is None and grpc_code == grpc.StatusCode.UNAUTHENTICATED.name):
        return "keyed"
    if status is None and grpc_code is None:
        return "unknown"
    if status == 200 and body.startswith(b"# HELP") and listener.process in RAY_EXPORTER_PROCESSES:
        return "ray-metrics"
    return "open"


def exposure(pids: list[int]) -> dict[str, list[Listener]]:
    """The engine's listeners by verdict."""
    found: dict[str, list[Listener]] = {}
    for listener in listeners(pids):
        if on_loopback(listener.ip):
            found.setdefault("loopback", []).append(listener)
            continue
        status, body = unkeyed_get(listener)
        grpc_code = unkeyed_grpc_call(listener) if status is None else None
        found.setdefault(verdict(listener, status, body, grpc_code), []).append(listener)
    return found
