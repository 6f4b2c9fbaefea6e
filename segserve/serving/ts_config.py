"""TorchServe's config.properties for one instance: read it, write it with some keys replaced, choose its
loopback ports and a worker-socket range no other instance uses."""

import fcntl
import os
import socket
import stat
import threading
from pathlib import Path

from segserve.errors import RuntimeFailure

ADDRESS_KEYS = ("inference_address", "management_address", "metrics_address")
# Claims are shared by every segserve process of a user, whatever its TMPDIR: in /tmp, in a folder of the user's own
# (mode 0700), so that another user can neither hold our ports nor plant a link where we open files.
CLAIMS_ROOT = Path(f"/tmp/segserve-{os.getuid()}")
WORKER_BASE_CLAIMS_DIR = CLAIMS_ROOT / "worker-bases"
PORT_CLAIMS_DIR = CLAIMS_ROOT / "ports"
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


# Ports and worker-port bases this process handed to a TorchServe: it binds them a moment later, so another
# instance started meanwhile (`bench ab` starts two at once) must not be handed the same ones.
_HANDED_OUT_PORTS: dict[int, object] = {}  # port -> its claim (an open, locked file), until released
_HANDED_OUT_WORKER_BASES: set[int] = set()
_HANDING_OUT = threading.Lock()
_WORKER_BASE_CLAIMS: list = []  # open, locked files: released when this process ends


def ephemeral_port_range() -> tuple[int, int]:
    """The kernel's ports for outgoing connections (Linux: 32768–60999 by default)."""
    try:
        low, high = (int(v) for v in EPHEMERAL_RANGE_FILE.read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _candidate_ports(count: int) -> range:
    """Where to look for free ports: below the kernel's ephemeral range where it leaves room, else above it."""
    low, high = ephemeral_port_range()
    if low - 1024 >= 1000 + count:
        return range(max(1024, low - 10000), low - count + 1)
    if 65535 - high >= 1000 + count:
        return range(high + 1, 65536 - count)
    return range(1024, 65536 - count)


def free_port_base(count: int = 5) -> int:
    """The first of `count` loopback ports in a row that nothing uses (`serve --port-base` takes 5), for a server
    to bind a few seconds later (the JVM's start-up).

    Chosen outside the kernel's ephemeral range: a port there can be taken in between by any process's outgoing
    connection (a load generator opens hundreds), which made a server start fail with "Address already in use"
    while another test process was benchmarking. Each is claimed with an flock under /tmp/segserve-<uid>/ports until
    release_ports() or this process's end, so that two processes choosing at once do not pick the same ones."""
    candidates = _candidate_ports(count)
    offset = (os.getpid() * 101) % len(candidates)  # processes start their searches apart
    with _HANDING_OUT:
        for i in range(len(candidates)):
            base = candidates[(offset + i) % len(candidates)]
            ports = range(base, base + count)
            if any(port in _HANDED_OUT_PORTS or not _bindable(port) for port in ports):
                continue
            claims = [_claim(PORT_CLAIMS_DIR, port) for port in ports]
            if all(claim is not None for claim in claims):
                _HANDED_OUT_PORTS.update(zip(ports, claims, strict=True))
                return base
            for claim in claims:
                if claim is not None:
                    claim.close()
    raise RuntimeFailure(f"no {count} free loopback port(s) in a row in {candidates.start}–{candidates.stop - 1}")


def free_port() -> int:
    return free_port_base(1)


def release_ports(ports) -> None:
    """Give back ports handed out by free_port(), once their server listens on them (or gave up)."""
    with _HANDING_OUT:
        for port in ports:
            if port in _HANDED_OUT_PORTS:
                _HANDED_OUT_PORTS.pop(port).close()  # the lock goes with it


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

    Free ports are chosen here (free_port) and bound by TorchServe a moment later: should another process take
    one in between, start() chooses again, once.

    gRPC is listed because TorchServe always opens it (7070/7071 by default), which
    would collide between instances.
    """
    ports = [port_base + i for i in range(5)] if port_base else [free_port() for _ in range(5)]
    addresses = {key: f"http://127.0.0.1:{port}" for key, port in zip(ADDRESS_KEYS, ports[:3], strict=True)}
    return {**addresses, "grpc_inference_port": str(ports[3]), "grpc_management_port": str(ports[4])}


def _claim(folder: Path, number: int):
    """The open, flock-ed file folder/<number>, or None where another live process holds it: a port or range
    a server still starting has not bound yet, which another process would take too."""
    private_folder(folder.parent)
    private_folder(folder)
    # O_NOFOLLOW: a link in its place is refused, never followed
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
    try:
        claim = os.fdopen(os.open(folder / str(number), flags, 0o600), "a")
    except OSError as error:  # ELOOP: a link
        raise RuntimeFailure(f"{folder / str(number)}: {error.strerror}: remove it, and segserve makes it again") from None
    try:
        fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        claim.close()
        return None
    return claim


def private_folder(folder: Path) -> Path:
    """`folder`, made with mode 0700 where missing; a RuntimeFailure naming it when it is a link, not a folder, not
    this user's, or open to others (someone else's in the shared /tmp)."""
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        pass
    found = os.lstat(folder)  # the entry itself: a link is not followed
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or stat.S_IMODE(found.st_mode) & 0o077:
        raise RuntimeFailure(
            f"{folder}: expected a folder of user {os.getuid()} with mode 0700 (got mode {stat.filemode(found.st_mode)}, "
            f"user {found.st_uid}): remove it, and segserve makes it again"
        )
    return folder


def _claim_worker_base(base: int) -> bool:
    """Claim a worker range for this process's life (two bench processes sharing a study would take it too)."""
    claim = _claim(WORKER_BASE_CLAIMS_DIR, base)
    if claim is not None:
        _WORKER_BASE_CLAIMS.append(claim)
    return claim is not None


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
