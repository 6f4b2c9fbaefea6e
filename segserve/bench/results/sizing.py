"""A Ray point sized for a target rate (#67): from the best point's own measurements, at a p99 bound the user gives,
the replicas and nodes the rate needs and Ray Serve's autoscaling_config. best/rayservice.yaml carries the result
(rayservice.py), each figure with the record keys it came from. Pure: the tests give records.

- The bound: the suite's constraint `latency_p99_ms: {max: N}`, the bound its best point was chosen under; a suite
  without one is not sized (a rate without a latency bound is any rate). A point whose p99 passes the bound is refused.
- The target rate: SEGSERVE_TARGET_RPS when the suite finished (as SEGSERVE_STORAGE_URI); unset: not sized.
- Rate per replica: throughput_rps ÷ the point's replicas (`workers`, a .war node's `<node>_workers`): each request
  passes every deployment once, so a deployment's replicas scale with the rate; replicas needed = ⌈replicas × target ÷
  measured rate⌉ per deployment (linear: the measured replicas' rate, no more, is assumed of each added one).
- Cores a replica uses: server_cpu_ms_per_request × throughput_rps ÷ 1000 ÷ the point's replicas: every process of
  the server (proxy, replicas, Ray's own) shared out per replica, rounded up to a tenth; it is the replica's Ray
  `num_cpus`, so Ray places ⌊node cores ÷ it⌋ replicas on a node. A node: the cores the point was measured on.
- target_ongoing_requests by Little's law: rate per replica × latency_mean_ms (the mean time in the system, which
  Little's law relates, not the p50): the requests a replica held at the measured point, queued ones included, which
  is what Serve counts (queued at the handles and running in the replica). Measured from the client, so it holds the
  network's time too: the autoscaler keeps a replica at most as loaded as measured. Only for one deployment (a .mar):
  a .war's nodes each take a part of the request's time that the client does not see, so they get fixed replicas.
- min_replicas: the point's replicas (the fewest measured answering within the bound; fewer would have to start a
  replica, a model load, before a rise is answered), at most max_replicas: the replicas the target rate needs.
"""

import math
import os
from dataclasses import dataclass

TARGET_ENV = "SEGSERVE_TARGET_RPS"
BOUND_METRIC = "latency_p99_ms"


class NotSized(Exception):
    """Why a point is not sized: one line, what to give or measure."""


@dataclass(frozen=True)
class Sizing:
    run_id: str
    bound_ms: float
    target_rps: float
    measured_rps: float
    p99_ms: float
    mean_ms: float
    measured: dict[str, int]  # deployment → the point's replicas
    needed: dict[str, int]  # deployment → the replicas the target rate needs
    cores_per_replica: float
    node_cores: int
    replicas_per_node: int
    nodes: int
    target_ongoing_requests: float | None  # None: fixed replicas (a .war)

    def rate_per_replica_rps(self, deployment: str) -> float:
        return self.measured_rps / self.measured[deployment]

    def autoscaling(self, deployment: str) -> dict | None:
        """Serve's autoscaling_config of the deployment, or None (fixed replicas: needed[deployment])."""
        if self.target_ongoing_requests is None:
            return None
        most = self.needed[deployment]
        return {
            "min_replicas": min(self.measured[deployment], most),
            "max_replicas": most,
            "target_ongoing_requests": self.target_ongoing_requests,
        }

    def lines(self) -> list[str]:
        """What each figure is and which record key it came from (best/rayservice.yaml's header)."""
        run = self.run_id
        total = sum(self.needed.values())
        per = ", ".join(f"{name} {count}" for name, count in self.needed.items())
        said = [
            f"sized for {self.target_rps:g} req/s ({TARGET_ENV}) at p99 ≤ {self.bound_ms:g} ms (the suite's {BOUND_METRIC} max);",
            f"{run} measured {self.measured_rps:.1f} req/s (throughput_rps) at p99 {self.p99_ms:.1f} ms ({BOUND_METRIC}) with",
            "replicas " + ", ".join(f"{name} {count}" for name, count in self.measured.items()) + " (workers): replicas needed "
            f"{per} = ⌈replicas × {self.target_rps:g} ÷ {self.measured_rps:.1f}⌉;",
            f"a replica uses {self.cores_per_replica:g} cores (server_cpu_ms_per_request × throughput_rps ÷ 1000 ÷ replicas, every",
            f"process of the server, up to a tenth: its num_cpus); a node has the {self.node_cores} cores of {run}: "
            f"{self.replicas_per_node} replicas a node, {self.nodes} worker nodes for {total} replicas",
        ]
        if self.target_ongoing_requests is None:
            said.append("fixed replicas, no autoscaling: a .war node's own time in a request is not measured (Little's law needs it)")
        else:
            (name,) = self.needed
            said.append(
                f"autoscaling: target_ongoing_requests {self.target_ongoing_requests:g} = {self.rate_per_replica_rps(name):.2f} req/s a "
                f"replica × latency_mean_ms {self.mean_ms:.1f} (Little's law); min_replicas {self.autoscaling(name)['min_replicas']}"
                f" (the point's), max_replicas {self.needed[name]} (the target's)"
            )
        return said


def p99_bound_ms(constraints: dict) -> float | None:
    """The suite's p99 bound: its constraint `latency_p99_ms: {max: N}`, else None."""
    return (constraints.get(BOUND_METRIC) or {}).get("max")


def target_rps(environ=os.environ) -> float | None:
    text = environ.get(TARGET_ENV)
    if not text:
        return None
    try:
        rate = float(text)
    except ValueError:
        rate = 0.0
    if not math.isfinite(rate) or rate <= 0:
        raise NotSized(f"{TARGET_ENV}={text!r}: must be a rate in requests a second above 0")
    return rate


def node_cores(chosen: dict) -> int | None:
    """The cores the point was measured on (its affinity, else the machine's)."""
    environment = chosen.get("environment") or {}
    return len(environment.get("cpu_affinity") or []) or environment.get("cpu_cores") or None


def size(chosen: dict, replicas: dict[str, int], bound_ms: float | None, rate_rps: float | None) -> Sizing:
    """The point sized for `rate_rps` at p99 ≤ `bound_ms`; `replicas`: each deployment's replicas at the point.
    Raises NotSized with what is missing."""
    run = chosen.get("run_id", "the point")
    engine = chosen.get("engine") or "torchserve"  # records before the engine key: TorchServe
    if engine != "ray":
        raise NotSized(f"{run} ran on {engine}: sizing reads a Ray point's replicas (a point with engine: ray)")
    if bound_ms is None:
        raise NotSized(f"no p99 bound: give the suite a constraint {BOUND_METRIC}: {{max: N}} (the latency the sizing keeps)")
    p99, measured_rps, mean = chosen.get(BOUND_METRIC), chosen.get("throughput_rps"), chosen.get("latency_mean_ms")
    if p99 is None or not measured_rps or mean is None:
        raise NotSized(f"{run} has no throughput_rps, latency_mean_ms or {BOUND_METRIC}: nothing measured to size from")
    if p99 > bound_ms:
        raise NotSized(f"{run}'s p99 {p99:.1f} ms is over the bound {bound_ms:g} ms: its rate is not one within the bound")
    if rate_rps is None:
        raise NotSized(f"no target rate: set {TARGET_ENV} (requests a second) before `segserve bench`")
    if not replicas or min(replicas.values()) < 1:
        raise NotSized(f"{run} names no replicas (workers): nothing to scale")
    cpu_ms, cores = chosen.get("server_cpu_ms_per_request"), node_cores(chosen)
    if not cpu_ms or not cores:
        raise NotSized(f"{run} has no server_cpu_ms_per_request or machine cores: the cores a replica uses are not measured")
    per_replica = max(math.ceil(cpu_ms * measured_rps / 1000 / sum(replicas.values()) * 10 - 1e-9) / 10, 0.1)
    per_node = math.floor(cores / per_replica + 1e-9)
    if per_node < 1:
        raise NotSized(f"a replica uses {per_replica:g} cores, more than the {cores} of a node")
    needed = {name: max(math.ceil(count * rate_rps / measured_rps - 1e-9), 1) for name, count in replicas.items()}
    ongoing = None
    if len(replicas) == 1:
        (count,) = replicas.values()
        ongoing = max(round(measured_rps / count * mean / 1000, 2), 0.01)
    nodes = math.ceil(sum(needed.values()) / per_node)
    return Sizing(run, bound_ms, rate_rps, measured_rps, p99, mean, dict(replicas), needed, per_replica, cores, per_node, nodes, ongoing)
