"""What a Ray cluster's second node costs on the same cores (#67's goal: two nodes ≥ 0.9× one node's rate): a one-node
cluster (the head, 2 logical CPUs) and a two-node cluster (head and a worker, 1 each) side by side on this machine
(segserve/qa/ray_cluster.py: each node a network namespace, so both share this machine's cores), the same .mar
with the same replicas on each (`segserve serve --engine ray --ray-address` on the head), loaded in turn at the
same connections from this host through the head's ingress, the order alternating each round; the two-node
cluster's replicas spread one per node (registered again until Serve places them so). The ratio is the
median of the two-node windows' rates over the one-node's, with its bootstrap interval (bench/results/stats.py).
Both clusters run throughout: the idle one's background costs each measurement alike.

    sudo .venv/bin/python -m segserve.qa.ray_overhead ECHO.mar [--rounds 3] [--connections 16] [--load-s 20]
"""

import argparse
import json
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from itertools import pairwise
from pathlib import Path

from segserve.bench.results.stats import ratio_of_medians
from segserve.qa.ray_cluster import RayCluster, Sent, closed_loop, outcome, placed, segserve, serve_engine

SUBNETS = {"one": "10.233.68", "two": "10.233.69"}  # beside ray_cluster.SUBNET: the lost-node test's
# Serve's SPREAD placement is a preference (both replicas landed on the head of the two-node cluster once): the
# model registered again until its replicas are spread evenly, at most this often (the placement is reported)
PLACEMENT_TRIES = 6


def serve_on(cluster: RayCluster, mar: Path, folder: Path, model: str, replicas: int):
    """The .mar served on the cluster by `segserve serve --ray-address` run on its head, with `replicas` replicas
    spread evenly where Serve places them so within PLACEMENT_TRIES; the engine and the options that stop it."""
    shared = folder / "shared"
    store = shared / "store"
    store.mkdir(parents=True)
    shutil.copy(mar, store / f"{model}.mar")
    engine, options = serve_engine(cluster, store, shared, folder)
    for _ in range(PLACEMENT_TRIES):
        engine.register_model(f"{model}.mar", model, workers=replicas, log=lambda *_: None)
        if even(placed(cluster, engine, model), replicas):
            break
        engine.unregister("models", model)
    return engine, options


def even(placement: dict[str, int], replicas: int) -> bool:
    """The replicas as evenly over the nodes as they divide: what the two-node cluster is meant to serve with."""
    share = replicas // len(placement)
    return all(share <= count <= share + (replicas % len(placement) > 0) for count in placement.values())


def window_rates(sent: list[Sent], began_s: float, warm_s: float, window_s: float, load_s: float) -> list[float]:
    """2xx answers per second in each window_s after the warm-up (by when they were answered)."""
    edges = [began_s + warm_s + k * window_s for k in range(int((load_s - warm_s) // window_s) + 1)]
    return [sum(1 for s in sent if 200 <= s.status < 300 and a <= s.ended_s < b) / window_s for a, b in pairwise(edges)]


def measure(engine, model: str, connections: int, load_s: float, warm_s: float, window_s: float) -> dict:
    began = time.monotonic()
    sent = closed_loop(engine.url("inference"), f"/predictions/{model}", engine.token("inference"), b"x" * 1024, connections, load_s)
    rates = window_rates(sent, began, warm_s, window_s, load_s)
    return {"windows_rps": rates, "rps": round(sum(rates) / len(rates), 1) if rates else 0.0, "load": outcome(sent)}


def overhead(
    mar: Path, rounds: int = 3, connections: int = 16, load_s: float = 20, warm_s: float = 5, window_s: float = 3, replicas: int = 2
) -> dict:
    """Both clusters up, the .mar on each, `rounds` rounds of one load on each in alternating order; what each
    measured and the two-node ÷ one-node ratio with its interval."""
    model = mar.stem
    base = Path(tempfile.mkdtemp(prefix="segray-overhead-"))
    tag = str(int(time.time()) % 1000)
    layouts = {"one": (0, 2), "two": (1, 1)}  # (worker nodes, logical CPUs per node): 2 logical CPUs in all, alike
    with ExitStack() as stack:
        clusters, engines = {}, {}
        for name, (workers, cpus) in layouts.items():
            clusters[name] = stack.enter_context(RayCluster(workers=workers, tag=f"{tag}{name[0]}", subnet=SUBNETS[name], node_cpus=cpus))
        for name, cluster in clusters.items():
            (base / name).mkdir()
            engines[name], options = serve_on(cluster, mar, base / name, model, replicas)
            stack.callback(segserve, "serve", "--stop", *options, env=cluster.environment)
        placement = {name: placed(clusters[name], engines[name], model) for name in clusters}
        measured: dict[str, list[dict]] = {"one": [], "two": []}
        for round_index in range(rounds):
            order = ("one", "two") if round_index % 2 == 0 else ("two", "one")
            for name in order:
                measured[name].append(measure(engines[name], model, connections, load_s, warm_s, window_s))
    shutil.rmtree(base, ignore_errors=True)
    one, two = ([w for m in measured[name] for w in m["windows_rps"]] for name in ("one", "two"))
    ratio, interval = ratio_of_medians(two, one)
    return {
        "connections": connections,
        "rounds": rounds,
        "replicas": replicas,
        "placement": placement,
        "one_node_rps": [m["rps"] for m in measured["one"]],
        "two_node_rps": [m["rps"] for m in measured["two"]],
        "round_ratios": [
            round(b["rps"] / a["rps"], 3) if a["rps"] else None for a, b in zip(measured["one"], measured["two"], strict=True)
        ],
        "ratio": round(ratio, 3) if ratio is not None else None,
        "ratio_interval": [round(v, 3) for v in interval] if interval else None,
        "failed": {name: sum(m["load"]["failed"] for m in measured[name]) for name in measured},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m segserve.qa.ray_overhead", description=__doc__.split("\n\n")[0])
    parser.add_argument("mar", type=Path, help="the .mar both clusters serve")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--load-s", type=float, default=20)
    parser.add_argument("--replicas", type=int, default=2)
    args = parser.parse_args(argv)
    if reason := RayCluster.unavailable():
        print(f"error: {reason}", file=sys.stderr)
        return 2
    print(json.dumps(overhead(args.mar.resolve(), args.rounds, args.connections, args.load_s, replicas=args.replicas), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
