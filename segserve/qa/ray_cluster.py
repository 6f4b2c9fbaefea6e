"""A Ray cluster across "hosts" on this machine, for the tests (#67): a head and worker nodes, each `ray start --block`
in a Linux network namespace of its own, joined by a bridge, so that Ray's nodes reach each other (and this host, at
the bridge's .1, reaches every node) the way hosts on one network do. tests/system/test_hosts.py's namespaces each
reach only this host: Ray's nodes must talk to one another.

Each node has its own Ray temp folder (`--temp-dir`: Ray's fixed /tmp/ray would be shared) and no HAProxy (Serve's
default proxy: HAProxy mode's fixed /tmp/haproxy-serve/ files are per machine); token auth is on
(RAY_AUTH_MODE=token, one token file per cluster, mode 0600). Everything is stopped by pid (every process in each
namespace, as `ip netns pids` lists it) and the namespaces, the bridge and the folders are removed afterwards, also
when starting failed. It needs root and iproute2's `ip`.

The subnet: SUBNET.0/24 (10.233.67.0/24), used by nothing else here (test_hosts.py takes 10.231.<n>.0/24); a start
on a machine where an interface already has an address in it is refused.

    python -m segserve.qa.ray_cluster nodes ADDRESS   # the alive nodes' IPs, as JSON (RAY_AUTH_* from the environment)
"""

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from segserve.errors import RuntimeFailure, UsageError

SUBNET = "10.233.67"  # this host .1 on the bridge, the head .2, worker n .2+n
GCS_PORT = 6379
IFNAMSIZ = 15  # the longest interface name Linux takes
NODE_OBJECT_STORE_BYTES = 100 * 1024 * 1024  # each node's default is 30% of memory, in one /dev/shm for all
# How soon the GCS counts a lost node dead, and so how soon Serve replaces its replicas: Ray's health checks of each
# raylet (src/ray/common/ray_config_def.h, read from RAY_<name> by the GCS at the head's `ray start`). Ray 2.60's
# defaults: one every 3000 ms, dead after 5 failed in a row (a check answered by a refused connection fails at
# once; one left unanswered after health_check_timeout_ms, 10000). 15 s of a 30 s recovery goal went there; one
# check a second keeps the 5 failures (a raylet busy for a moment is not dead) and finds a lost node in about 5 s.
# docs/ray.md ("A lost node") says what a user sets for the same.
HEALTH_CHECKS = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "5"}


@dataclass(frozen=True)
class Layout:
    """The names and addresses of one cluster: `tag` tells two clusters (or a leftover) apart."""

    tag: str
    workers: int = 2
    subnet: str = SUBNET

    def __post_init__(self):
        if len(self.veth(self.workers)[1]) > IFNAMSIZ or len(self.bridge) > IFNAMSIZ:
            raise UsageError(f"tag {self.tag!r} makes interface names longer than {IFNAMSIZ} characters: a shorter tag")

    @property
    def nodes(self) -> list[str]:
        return ["head", *(f"w{n}" for n in range(1, self.workers + 1))]

    @property
    def bridge(self) -> str:
        return f"srb{self.tag}"

    @property
    def host_address(self) -> str:
        return f"{self.subnet}.1"

    def namespace(self, node: str) -> str:
        return f"segray-{self.tag}-{node}"

    def address(self, node: str) -> str:
        return f"{self.subnet}.{2 + self.nodes.index(node)}"

    def veth(self, index: int) -> tuple[str, str]:
        """(this host's end, on the bridge; the node's end, in its namespace)."""
        return f"sr{self.tag}{index}o", f"sr{self.tag}{index}i"

    @property
    def gcs_address(self) -> str:
        return f"{self.address('head')}:{GCS_PORT}"


def network_commands(layout: Layout) -> list[list[str]]:
    """The `ip` commands that make the network: the bridge with this host's address, then per node its namespace,
    a veth pair from the bridge into it, its address and loopback."""
    commands = [
        ["ip", "link", "add", layout.bridge, "type", "bridge"],
        ["ip", "addr", "add", f"{layout.host_address}/24", "dev", layout.bridge],
        ["ip", "link", "set", layout.bridge, "up"],
    ]
    for index, node in enumerate(layout.nodes):
        namespace, (outer, inner) = layout.namespace(node), layout.veth(index)
        inside = ["ip", "netns", "exec", namespace, "ip"]
        commands += [
            ["ip", "netns", "add", namespace],
            ["ip", "link", "add", outer, "type", "veth", "peer", "name", inner],
            ["ip", "link", "set", inner, "netns", namespace],
            ["ip", "link", "set", outer, "master", layout.bridge],
            ["ip", "link", "set", outer, "up"],
            [*inside, "addr", "add", f"{layout.address(node)}/24", "dev", inner],
            [*inside, "link", "set", inner, "up"],
            [*inside, "link", "set", "lo", "up"],
        ]
    return commands


def teardown_commands(layout: Layout) -> list[list[str]]:
    """What network_commands made, removed (a namespace takes its veth end, and so the pair, with it)."""
    return [*(["ip", "netns", "del", layout.namespace(node)] for node in layout.nodes), ["ip", "link", "del", layout.bridge]]


def node_command(layout: Layout, node: str, temp_dir: Path, num_cpus: int = 1, ray: str | None = None) -> list[str]:
    """`ray start --block` of one node inside its namespace: the head's GCS on GCS_PORT, a worker joining it."""
    ray = ray or str(Path(sys.executable).with_name("ray"))
    command = ["ip", "netns", "exec", layout.namespace(node), ray, "start", "--block", "--disable-usage-stats"]
    command += ["--node-ip-address", layout.address(node), "--temp-dir", str(temp_dir), "--num-cpus", str(num_cpus)]
    command += ["--object-store-memory", str(NODE_OBJECT_STORE_BYTES)]
    if node == "head":
        return command + ["--head", "--port", str(GCS_PORT), "--include-dashboard=false"]
    return command + ["--address", layout.gcs_address]


def node_environment(base: dict[str, str], token_file: Path) -> dict[str, str]:
    """A node's environment: token auth with the cluster's token file, usage stats off, no HAProxy, the health
    checks of HEALTH_CHECKS, nothing of a cluster the caller's environment names."""
    env = {k: v for k, v in base.items() if not k.startswith(("RAY_SERVE_", "RAY_AUTH_", "RAY_health_check_")) and k != "RAY_ADDRESS"}
    return env | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file), "RAY_USAGE_STATS_ENABLED": "0"} | HEALTH_CHECKS


def subnet_in_use(subnet: str, addresses: str) -> bool:
    """Whether `ip -o -4 addr` output has an address in subnet.0/24."""
    return any(f" {subnet}." in line for line in addresses.splitlines())


def _ip(command: list[str], check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, check=check)


@dataclass
class RayCluster:
    """A head and `workers` worker nodes, each in its own namespace (a context manager)."""

    workers: int = 2
    tag: str = field(default_factory=lambda: str(os.getpid() % 10000))
    subnet: str = SUBNET
    node_cpus: int = 1  # Ray's logical CPUs per node

    def __post_init__(self):
        self.layout = Layout(self.tag, self.workers, self.subnet)
        self.folder = Path(tempfile.mkdtemp(prefix=f"src{self.tag}-"))  # short: Ray's sockets go under it
        self.token_file = self.folder / "token"
        self.started: dict[str, subprocess.Popen] = {}
        self.network_made = False
        self.killed: set[str] = set()

    @staticmethod
    def unavailable() -> str | None:
        """Why no cluster can be made here (None: it can)."""
        if os.geteuid() != 0:
            return "network namespaces need root"
        if shutil.which("ip") is None or _ip(["ip", "netns", "list"], check=False).returncode != 0:
            return "network namespaces need iproute2's `ip netns`"
        return None

    @property
    def environment(self) -> dict[str, str]:
        """What a driver or client of this cluster needs (its token auth)."""
        return node_environment(dict(os.environ), self.token_file)

    def start(self, timeout_s: float = 120) -> "RayCluster":
        if reason := self.unavailable():
            raise RuntimeFailure(reason)
        if subnet_in_use(self.subnet, _ip(["ip", "-o", "-4", "addr"]).stdout):
            raise RuntimeFailure(f"{self.subnet}.0/24 is in use on this machine: a leftover cluster? (`ip -o -4 addr`)")
        try:
            self.network_made = True
            for command in network_commands(self.layout):
                _ip(command)
            self.token_file.write_text(secrets.token_hex(32))
            self.token_file.chmod(0o600)
            self._start_node("head")
            _wait_port(self.layout.address("head"), GCS_PORT, timeout_s)
            for node in self.layout.nodes[1:]:
                self._start_node(node)
            self.wait_nodes(len(self.layout.nodes), timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_node(self, node: str) -> None:
        temp = self.folder / node
        temp.mkdir()
        with open(self.folder / f"{node}.log", "wb") as log:
            command = node_command(self.layout, node, temp, self.node_cpus)
            self.started[node] = subprocess.Popen(command, env=self.environment, stdout=log, stderr=log, start_new_session=True)

    def node_log(self, node: str) -> str:
        try:
            return (self.folder / f"{node}.log").read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def alive_nodes(self) -> list[str]:
        """The IPs of the nodes the GCS counts alive (asked from a process of its own: Ray reads its auth settings
        once per process)."""
        command = [sys.executable, "-m", "segserve.qa.ray_cluster", "nodes", self.layout.gcs_address]
        done = subprocess.run(command, env=self.environment, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeFailure(f"could not list the cluster's nodes: {done.stderr.strip()[-500:]}")
        return json.loads(done.stdout)

    def wait_nodes(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(alive := self.alive_nodes()) != count:
            for node, process in self.started.items():
                if process.poll() is not None and node not in self.killed:
                    raise RuntimeFailure(f"Ray node {node} ended with status {process.returncode}:\n{self.node_log(node)}")
            if time.monotonic() > deadline:
                raise RuntimeFailure(f"{len(alive)} of {count} Ray nodes alive after {timeout_s:.0f} s: {alive}")
            time.sleep(1)

    def pids(self, node: str) -> list[int]:
        """Every process in the node's namespace: its raylet, its workers, its agents (and a driver run there)."""
        listed = _ip(["ip", "netns", "pids", self.layout.namespace(node)], check=False).stdout
        return [int(pid) for pid in listed.split()]

    def kill_node(self, node: str) -> list[int]:
        """The node lost: SIGKILL to every process in its namespace, by pid. The pids killed."""
        self.killed.add(node)
        pids = self.pids(node)
        for pid in pids:
            _signal(pid, signal.SIGKILL)
        return pids

    def stop(self) -> None:
        """Every node's processes ended by pid (SIGTERM, then SIGKILL after 10 s), the network and folders removed."""
        if self.network_made:
            for sent, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
                deadline = time.monotonic() + wait_s
                while (left := [pid for node in self.layout.nodes for pid in self.pids(node)]) and time.monotonic() < deadline:
                    for pid in left:
                        _signal(pid, sent)
                    time.sleep(0.5)
                    sent = 0  # signal 0: only whether it is still there, until the wait is over
            for command in teardown_commands(self.layout):
                _ip(command, check=False)
            self.network_made = False
        for process in self.started.values():
            if process.poll() is None:
                _signal(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> "RayCluster":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()


def segserve(*args: str, namespace: str | None = None, env=None) -> subprocess.CompletedProcess:
    """A segserve command run as a user runs it, inside a node's namespace where one is named."""
    command = [sys.executable, "-m", "segserve.cli", *args]
    if namespace:
        command = ["ip", "netns", "exec", namespace, *command]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def serve_engine(cluster: RayCluster, store: Path, shared: Path, folder: Path):
    """`segserve serve --engine ray --ray-address` run on the cluster's head (in its namespace) with nothing
    registered, `store` inside the shared folder; the engine as `token`, `scale`, `predict` open it (the recorded
    cluster) and the options that stop it (`serve --stop`)."""
    from segserve.engines.engine_interface import open_engine

    head = cluster.layout.address("head")
    config = folder / "config.properties"  # the head's address: this host reaches it over the bridge
    config.write_text(f"inference_address=http://{head}:8080\nmanagement_address=http://{head}:8081\n")
    options = ["--config", str(config), "--run-dir", str(folder / "run")]
    started = segserve(
        *("serve", "--engine", "ray", "--ray-address", cluster.layout.gcs_address, "--ray-shared-dir", str(shared)),
        *("--model-store", str(store), "--no-targets", *options),
        namespace=cluster.layout.namespace("head"),
        env=cluster.environment,
    )
    if started.returncode != 0:
        raise RuntimeFailure(f"segserve serve on the {len(cluster.layout.nodes)}-node cluster failed:\n{started.stdout}{started.stderr}")
    return open_engine(None, folder / "run", store, config), options


def placed(cluster: RayCluster, engine, model: str) -> dict[str, int]:
    """The model's running replicas per node (their pids in each node's namespace)."""
    pids = {int(w["pid"]) for w in engine.describe(model)["workers"] if w["status"] == "READY"}
    return {node: len(pids & set(cluster.pids(node))) for node in cluster.layout.nodes}


def _signal(pid: int, sent: int) -> None:
    try:
        os.kill(pid, sent)
    except ProcessLookupError:
        pass


def _wait_port(host: str, port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeFailure(f"nothing listens on {host}:{port} after {timeout_s:.0f} s") from None
            time.sleep(0.5)


def _alive_nodes(address: str) -> list[str]:
    from ray._raylet import GcsClient

    nodes = GcsClient(address=address).get_all_node_info(timeout=30)
    return sorted(info.node_manager_address for info in nodes.values() if info.state == 0)  # GcsNodeInfo.ALIVE


if __name__ == "__main__":
    if sys.argv[1:2] == ["nodes"]:
        print(json.dumps(_alive_nodes(sys.argv[2])))


@dataclass(frozen=True)
class Sent:
    """One request of closed_loop: when it was sent and answered (monotonic s), its status (0: no HTTP answer,
    `error` says why: refused, reset, or the client's timeout)."""

    began_s: float
    ended_s: float
    status: int
    error: str = ""


def closed_loop(url: str, path: str, token: str, body: bytes, connections: int, duration_s: float, timeout_s: float = 30) -> list[Sent]:
    """`connections` clients, each sending the next request once the last was answered, for duration_s; each
    request bounded by timeout_s (an answer that never comes is a Sent with status 0 and error "timeout")."""
    import http.client
    import threading
    from urllib.parse import urlsplit

    where = urlsplit(url)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/octet-stream"}
    sent: list[Sent] = []
    end = time.monotonic() + duration_s

    def client() -> None:
        connection = None
        while time.monotonic() < end:
            began = time.monotonic()
            try:
                connection = connection or http.client.HTTPConnection(where.hostname, where.port, timeout=timeout_s)
                connection.request("POST", path, body, headers)
                answer = connection.getresponse()
                answer.read()
                sent.append(Sent(began, time.monotonic(), answer.status))
            except (OSError, http.client.HTTPException) as failed:
                kind = "timeout" if isinstance(failed, TimeoutError) else type(failed).__name__
                sent.append(Sent(began, time.monotonic(), 0, kind))
                if connection is not None:
                    connection.close()
                connection = None
                time.sleep(0.05)  # a refused connection answers at once: no busy loop while a proxy is down

    threads = [threading.Thread(target=client) for _ in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sorted(sent, key=lambda s: s.began_s)


def outcome(sent: list[Sent], timeout_s: float = 30) -> dict:
    """What the load saw: requests sent, answered (any HTTP status), 2xx, failed (an error status or no answer),
    unanswered (no answer within timeout_s), the share of 2xx, the slowest answer."""
    ok = sum(1 for s in sent if 200 <= s.status < 300)
    unanswered = sum(1 for s in sent if s.error == "timeout" or s.ended_s - s.began_s >= timeout_s)
    return {
        "sent": len(sent),
        "answered": sum(1 for s in sent if s.status),
        "ok_2xx": ok,
        "failed": len(sent) - ok,
        "unanswered": unanswered,
        "ok_share": ok / len(sent) if sent else 0.0,
        "slowest_s": round(max((s.ended_s - s.began_s for s in sent), default=0.0), 3),
        "errors": sorted({s.error or str(s.status) for s in sent if not 200 <= s.status < 300}),
    }
