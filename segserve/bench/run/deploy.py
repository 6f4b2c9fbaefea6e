"""Put a point in place: the kind of its target (bench/run/targets/) deploys it, and the other kinds' servers are
stopped first (two servers would share the machine). The catalog's targets and a user's archives run on a
TorchServe of the bench's own, changed as little as possible; a command target's command is started, and started
again when its own values change; an http target is not ours: only checked and measured. A Ray point goes onto a
user's running Ray cluster where `bench run --ray-address` names one (`cluster`); ClusterNodes then records its
nodes, replicas per node and each node's CPU (engines/ray/node_usage.py) beside the point.
"""

import tempfile
from pathlib import Path

from segserve.archives.catalog import Catalog
from segserve.bench.run.measure import Endpoint
from segserve.bench.run.targets.command_targets import CommandTargets
from segserve.bench.run.targets.http_targets import HttpTargets
from segserve.bench.run.targets.kind import Kind
from segserve.bench.run.targets.torchserve_targets import TorchServeTargets
from segserve.bench.suite.plan import Point
from segserve.bench.suite.spec import Suite
from segserve.engines.ray.cluster import Cluster
from segserve.engines.ray.engine import RayServe
from segserve.engines.ray.node_usage import NodeUsage

# why a cluster point has no server CPU per request: the local process tree holds none of its nodes' processes
CLUSTER_SERVER_CPU = "a Ray cluster's replicas and proxies run on its nodes, out of this host's sight: node_cpu_pct is each node's CPU"


class Deployment:
    """The suite's points deployed one after another, each by its target's kind."""

    def __init__(
        self,
        suite: Suite,
        catalog: Catalog,
        weights: Path,
        log=print,
        env: dict | None = None,
        port_base: int | None = None,
        cluster: Cluster | None = None,
    ):
        self.suite, self.catalog, self.weights, self.log = suite, catalog, weights, log
        self.changes = {"restarts": 0, "registrations": 0, "scales": 0}  # what the points cost (a search reports it)
        # the bench's own TorchServe: also what bench ab warms, captures answer on and the baselines use (its
        # server, compile cache and archive recipe); asked for by that name, not passed through
        self.torchserve = TorchServeTargets(suite, catalog, weights, self.changes, log, env, port_base, cluster)
        self.kinds: list[Kind] = [HttpTargets(suite, self.changes), CommandTargets(suite, self.changes, log), self.torchserve]
        self.active: Kind | None = None

    def kind_of(self, name: str) -> Kind:
        return next(kind for kind in self.kinds if kind.owns(name))

    def deploy(self, point: Point) -> Endpoint:
        kind = self.kind_of(point.target)
        for other in self.kinds:
            if other is not kind:
                other.stop()
        self.active = kind
        kind.fresh_workers, kind.load_s = False, None
        return kind.deploy(point)

    @property
    def fresh_workers(self) -> bool:
        """The last deploy started workers (registered, scaled, or a command's server started)."""
        return self.active is not None and self.active.fresh_workers

    @property
    def load_s(self) -> float | None:
        return self.active.load_s if self.active is not None else None

    @property
    def archive_overrides(self) -> dict | None:
        """The spec values the deployed point's .war copy changed (registration.spec_overrides); None: not a .war."""
        return self.active.archive_overrides if self.active is not None else None

    def watched_processes(self, endpoint: Endpoint) -> dict[str, list[int]] | None:
        """The deployed point's processes by role, for their CPU and RSS; None for an http target (not ours)."""
        return self.active.watched_processes(endpoint) if self.active is not None else None

    def release(self) -> None:
        """What is registered unregistered, so that the next point starts fresh workers."""
        self.torchserve.release()

    def stop_servers(self) -> None:
        """Every kind's server: the next point starts clean."""
        for kind in self.kinds:
            kind.stop()

    def close(self) -> None:
        for kind in self.kinds:
            kind.close()

    def __enter__(self) -> "Deployment":
        """`with Deployment(...) as deployment:` stops every server its points started on the way out."""
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class ClusterNodes:
    """A point's companion (point.py's Hook) where a Ray point runs on a user's cluster: each node's CPU sampled on
    the node while it is measured, then the record's ray_nodes, node_cores, replicas_per_node and node_cpu_pct over
    the measured windows, and no server CPU per request (CLUSTER_SERVER_CPU says why)."""

    def __init__(self, deployment: Deployment):
        self.deployment = deployment
        self.usage: NodeUsage | None = None

    def _server(self) -> RayServe | None:
        server = self.deployment.torchserve.server
        on_cluster = self.deployment.active is self.deployment.torchserve and isinstance(server, RayServe) and server.cluster
        return server if on_cluster else None

    def start(self, point) -> None:
        if (server := self._server()) is not None:
            folder = Path(tempfile.mkdtemp(prefix="node-usage-", dir=server.run_dir))
            interval_s = self.deployment.suite.load.window_s / 4  # as the local server's CPU is sampled
            self.usage = NodeUsage(server.cluster.address, server.cluster_environment(), folder, interval_s).start()

    def finish(self, point, metrics: dict | None) -> dict:
        usage, self.usage = self.usage, None
        if usage is None:
            return {}
        if metrics is None:
            usage.stop()
            return {}
        spans = [tuple(span) for span in metrics.get("measured_windows_s") or [(0.0, float("inf"))]]  # load phases: all of it
        return {**usage.columns(spans), "server_cpu_ms_per_request": None, "server_cpu_unavailable": CLUSTER_SERVER_CPU}
