"""TorchServe's config.properties for one instance: read it, write it with some keys replaced, choose its
loopback ports and a worker-socket range no other instance uses."""

import fcntl
import os
import socket
import threading
from pathlib import Path

from segserve.errors import RuntimeFailure

ADDRESS_KEYS = ("inference_address", "management_address", "metrics_address")
WORKER_BASE_CLAIMS_DIR = Path("/tmp/segserve-worker-bases")


# Ports and worker-port bases this process handed to a TorchServe: it binds them a moment later, so another
# instance started meanwhile (`bench ab` starts two at once) must not be handed the same ones.
_HANDED_OUT_PORTS: set[int] = set()
_HANDED_OUT_WORKER_BASES: set[int] = set()
_HANDING_OUT = threading.Lock()
_WORKER_BASE_CLAIMS: list = []  # open, locked files: released when this process ends


def free_port() -> int:
    with _HANDING_OUT:
        while True:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            if port not in _HANDED_OUT_PORTS:
                _HANDED_OUT_PORTS.add(port)
                return port


def read_properties(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "!")) and "=" in line:
            key, value = line.split("=", 1)
            values[key.strip()] = value.strip()
    return values


def render_config(template: Path, target: Path, overrides: dict[str, str]) -> None:
    """Copy config.properties with some keys replaced (comments and order kept)."""
    lines, seen = [], set()
    for line in template.read_text().splitlines():
        key = line.split("=", 1)[0].strip()
        if "=" in line and not line.lstrip().startswith("#") and key in overrides:
            line, _ = f"{key}={overrides[key]}", seen.add(key)
        lines.append(line)
    lines += [f"{key}={value}" for key, value in overrides.items() if key not in seen]
    target.write_text("\n".join(lines) + "\n")


def loopback_ports(port_base: int | None) -> dict[str, str]:
    """HTTP addresses on 127.0.0.1 at port_base, +1, +2 and gRPC ports at +3, +4 (free ports when None).

    Free ports are chosen here and bound by TorchServe a moment later: another process
    could take one in between, which start() then reports.

    gRPC is listed because TorchServe always opens it (7070/7071 by default), which
    would collide between instances.
    """
    ports = [port_base + i for i in range(5)] if port_base else [free_port() for _ in range(5)]
    addresses = {key: f"http://127.0.0.1:{port}" for key, port in zip(ADDRESS_KEYS, ports[:3], strict=True)}
    return {**addresses, "grpc_inference_port": str(ports[3]), "grpc_management_port": str(ports[4])}


def _claim_worker_base(base: int) -> bool:
    """Lock /tmp/segserve-worker-bases/<base> for this process's life: a range whose server is still starting
    has no sockets yet, and another process (two bench processes sharing a study) would take it too."""
    WORKER_BASE_CLAIMS_DIR.mkdir(exist_ok=True)
    claim = open(WORKER_BASE_CLAIMS_DIR / str(base), "a")  # noqa: SIM115 (held open: the lock lives with it)
    try:
        fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        claim.close()
        return False
    _WORKER_BASE_CLAIMS.append(claim)
    return True


def free_worker_port_base() -> int:
    """A worker-port range whose unix sockets (/tmp/.ts.sock.<port>) no other instance uses: none exists (a
    running server's) and no other live process claimed it (a server still starting)."""
    with _HANDING_OUT:
        for base in range(20000 + (os.getpid() % 300) * 100, 60000, 100):
            if base in _HANDED_OUT_WORKER_BASES or any(Path(f"/tmp/.ts.sock.{base + i}").exists() for i in range(100)):
                continue
            if _claim_worker_base(base):
                _HANDED_OUT_WORKER_BASES.add(base)
                return base
    raise RuntimeFailure("no free worker port range under /tmp/.ts.sock.*")
