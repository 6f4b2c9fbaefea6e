"""Each node's CPU while a point on a Ray cluster is measured (#67): another host's /proc cannot be read from here, so
a small actor of ours runs on every alive node (NodeAffinitySchedulingStrategy, hard, no logical CPU taken from the
replicas) and reads its node's CPU times (/proc/stat, through psutil); a driver of the cluster in a process of its
own (`python -m segserve.engines.ray.node_usage ADDRESS INTERVAL_S OUT`: Ray reads its auth settings once per
process, and the bench is no Ray driver) asks every actor each interval_s and stamps the answers with this machine's
monotonic clock, the clock the bench's windows are measured by. It also writes the replicas of our model
applications per node, as Serve's controller places them. The arithmetic (busy share of a node's cores over the
measured windows) is node_cpu_pct's, without Ray.

On the test harness's cluster (segserve/qa/ray_cluster.py) every node is a network namespace of one machine: each
node's /proc/stat is that machine's, so every node reads the same share. On hosts of their own they differ.
"""

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from segserve.errors import RuntimeFailure

READY_TIMEOUT_S = 120  # a driver joining a cluster and an actor placed on every node


def busy_and_total_s(times: dict[str, float]) -> tuple[float, float]:
    """(busy, total) CPU seconds of a node's cores from its /proc/stat times (psutil.cpu_times()._asdict()), as
    psutil's cpu_percent counts them: idle and iowait are not busy; guest time is already in user (Linux), so not
    counted twice."""
    total = sum(v for k, v in times.items() if k not in ("guest", "guest_nice"))
    return total - times.get("idle", 0.0) - times.get("iowait", 0.0), total


def node_cpu_pct(samples: list[dict], started_s: float, spans: list[tuple[float, float]]) -> dict[str, float | None]:
    """Each node's busy share of its cores (%) over the spans (seconds since started_s, the load's start), from
    samples [{"t": monotonic s, "nodes": {node: [busy_s, total_s]}}]: per span, the first sample at or after its
    start and the last at or before its end; a node without two samples in any span: None."""
    nodes = sorted({node for sample in samples for node in sample["nodes"]})
    shares: dict[str, float | None] = {}
    for node in nodes:
        seen = [(s["t"] - started_s, *s["nodes"][node]) for s in samples if node in s["nodes"]]
        busy = total = 0.0
        for begin, end in spans:
            inside = [row for row in seen if begin <= row[0] <= end]
            if len(inside) >= 2:
                busy += inside[-1][1] - inside[0][1]
                total += inside[-1][2] - inside[0][2]
        shares[node] = round(100 * busy / total, 1) if total > 0 else None
    return shares


@dataclass
class NodeUsage:
    """The sampling driver of one measured point: start() (its actors placed, replicas listed), stop() → samples."""

    address: str  # the GCS's HOST:PORT
    environment: dict[str, str]  # a driver of the cluster's environment (its token auth: RayServe.cluster_environment)
    folder: Path  # where the driver writes what it reads
    interval_s: float = 0.5
    started_s: float = 0.0  # this machine's monotonic clock when the load starts (set by start())
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def out(self) -> Path:
        return self.folder / "node_usage.jsonl"

    def start(self) -> "NodeUsage":
        self.folder.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "segserve.engines.ray.node_usage", self.address, str(self.interval_s), str(self.out)]
        log = open(self.folder / "node_usage.log", "wb")  # noqa: SIM115 (the child's, closed with it)
        with log:
            self.process = subprocess.Popen(command, env=self.environment, stdin=subprocess.PIPE, stdout=log, stderr=log)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self._lines():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = (self.folder / "node_usage.log").read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
                raise RuntimeFailure(f"the node CPU sampler on the Ray cluster at {self.address} did not start: {tail[0][:300]}")
            time.sleep(0.2)
        self.started_s = time.monotonic()
        return self

    def _lines(self) -> list[dict]:
        try:
            return [json.loads(line) for line in self.out.read_text().splitlines() if line.endswith("}")]
        except (OSError, ValueError):
            return []

    def stop(self) -> tuple[dict, list[dict]]:
        """(the placement: {"nodes": {node: cores}, "replicas": {node: count}}, the CPU samples); the driver ended."""
        if self.process is not None and self.process.poll() is None:
            self.process.stdin.close()  # its cue to remove its actors and disconnect
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        lines = self._lines()
        placement = next((line for line in lines if "replicas" in line), {"nodes": {}, "replicas": {}})
        return placement, [line for line in lines if "t" in line]

    def columns(self, spans: list[tuple[float, float]]) -> dict:
        """The record's keys of a cluster point: ray_nodes, node_cores, replicas_per_node, node_cpu_pct (spans:
        the measured windows, seconds since the load started)."""
        placement, samples = self.stop()
        return {
            "ray_nodes": len(placement["nodes"]),
            "node_cores": placement["nodes"],
            "replicas_per_node": placement["replicas"],
            "node_cpu_pct": node_cpu_pct(samples, self.started_s, spans),
        }


# The driver (its own process) --------------------------------------------------------------------------------------
def _cpu_times() -> tuple[float, float, int]:
    import psutil

    return (*busy_and_total_s(psutil.cpu_times()._asdict()), psutil.cpu_count() or 1)


def _replicas_by_node() -> dict[str, int]:
    """Our model applications' running replicas per node IP, as Serve's controller lists them."""
    from ray import serve

    from segserve.engines.ray.app import model_app_name

    serve.status()  # connects this driver to Serve's controller
    details = serve.context._get_global_client().get_serve_details()
    counts: dict[str, int] = {}
    for name, application in details.get("applications", {}).items():
        if name.startswith(model_app_name("")):
            for deployment in application.get("deployments", {}).values():
                for replica in deployment.get("replicas", []):
                    if replica.get("state") == "RUNNING":
                        counts[replica.get("node_ip") or "?"] = counts.get(replica.get("node_ip") or "?", 0) + 1
    return counts


def _sample(address: str, interval_s: float, out: Path) -> None:
    import threading

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(address=address, log_to_driver=False)
    reader = ray.remote(num_cpus=0)(_CpuReader)
    alive = [node for node in ray.nodes() if node["Alive"]]
    actors = {
        node["NodeManagerAddress"]: reader.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)).remote()
        for node in alive
    }
    first = dict(zip(actors, ray.get([a.read.remote() for a in actors.values()], timeout=READY_TIMEOUT_S), strict=True))
    ended = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), ended.set()), daemon=True).start()
    with open(out, "a") as written:
        placement = {"nodes": {node: read[2] for node, read in first.items()}, "replicas": _replicas_by_node()}
        written.write(json.dumps(placement) + "\n")
        written.flush()
        while not ended.wait(interval_s):
            asked = time.monotonic()
            read = ray.get([a.read.remote() for a in actors.values()], timeout=30)
            # stamped halfway through the round trip: the actors answered in between
            stamp = (asked + time.monotonic()) / 2
            written.write(json.dumps({"t": stamp, "nodes": {n: r[:2] for n, r in zip(actors, read, strict=True)}}) + "\n")
            written.flush()
    for actor in actors.values():
        ray.kill(actor)
    ray.shutdown()


class _CpuReader:
    """The actor on one node: its node's CPU times (busy s, total s, cores)."""

    def read(self) -> tuple[float, float, int]:
        return _cpu_times()


if __name__ == "__main__":
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    _sample(sys.argv[1], float(sys.argv[2]), Path(sys.argv[3]))
