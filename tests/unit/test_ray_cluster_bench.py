"""A suite's Ray points on a user's Ray cluster (`bench run --ray-address`, #67 item 3), the parts that need no cluster:
the flags' refusals, where the archives are built and what the point's engine is, no local server CPU for a cluster
point, each node's CPU over the measured windows from the samples its actor read, and the overhead harness's window
rates (tests/system/test_ray_cluster.py runs the cluster)."""

import json
import re

import pytest

from segserve.archives.catalog import Catalog
from segserve.bench.run.deploy import CLUSTER_SERVER_CPU, ClusterNodes, Deployment
from segserve.bench.run.measure import Endpoint
from segserve.bench.suite.spec import load_suite
from segserve.cli import main
from segserve.engines.ray.cluster import Cluster
from segserve.engines.ray.engine import RayServe
from segserve.engines.ray.node_usage import NodeUsage, busy_and_total_s, node_cpu_pct
from segserve.qa.ray_cluster import Sent
from segserve.qa.ray_overhead import even, window_rates
from tests.conftest import ROOT

CATALOG = Catalog(ROOT)
SAMPLES = str(ROOT / "samples" / "*.jpg")


def suite_file(tmp_path, engines: str, more: str = ""):
    path = tmp_path / "suite.yaml"
    grid = f"grid: {{server: {{engine: {engines}}}}}\n" if engines else ""
    path.write_text(f"targets: [seg_jpeg_fused]\ninputs: [{{images: ['{SAMPLES}']}}]\n" + grid + more)
    return path


@pytest.mark.parametrize(
    "engines, flags, said",
    [
        ("", ["--ray-address", "10.0.0.5:6379", "--ray-shared-dir", "{tmp}"], "this suite has no Ray point to deploy there"),
        ("[torchserve]", ["--ray-address", "10.0.0.5:6379", "--ray-shared-dir", "{tmp}"], r"add `engine: \[ray\]` under grid.server"),
        ("[ray]", ["--ray-shared-dir", "{tmp}"], "go with --ray-address HOST:PORT"),
        ("[ray]", ["--ray-allow-no-auth"], "go with --ray-address HOST:PORT"),
        ("[ray]", ["--ray-address", "10.0.0.5:6379"], "--ray-address needs --ray-shared-dir DIR"),
        ("[ray]", ["--ray-address", "ray://10.0.0.5:10001", "--ray-shared-dir", "{tmp}"], "Ray Client's ray:// is not taken"),
        ("[ray]", ["--ray-address", "10.0.0.5:6379", "--ray-shared-dir", "{tmp}/none"], "--ray-shared-dir .*/none: no such folder"),
    ],
)
def test_the_cluster_flags_are_refused_with_a_line_saying_why(tmp_path, capsys, engines, flags, said):
    suite = suite_file(tmp_path, engines)
    given = [flag.format(tmp=tmp_path) for flag in flags]
    assert main(["bench", "run", str(suite), "--dry-run", *given]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and len(error.strip().splitlines()) == 1
    assert re.search(said, error), error


def test_profiling_the_best_point_on_a_cluster_is_refused(tmp_path, capsys):
    suite = suite_file(tmp_path, "[ray]", "profile: best\n")
    assert main(["bench", "run", str(suite), "--dry-run", "--ray-address", "10.0.0.5:6379", "--ray-shared-dir", str(tmp_path)]) == 2
    assert "profile: best samples this host's processes, not a cluster's nodes" in capsys.readouterr().err


def test_a_suite_with_ray_points_takes_the_cluster_flags(tmp_path, capsys):
    suite = suite_file(tmp_path, "[torchserve, ray]")
    assert main(["bench", "run", str(suite), "--dry-run", "--ray-address", "10.0.0.5:6379", "--ray-shared-dir", str(tmp_path)]) == 0
    assert "2 points" in capsys.readouterr().out


def test_a_ray_point_on_a_cluster_is_built_in_the_shared_folder_and_deployed_onto_the_cluster_behind_serves_proxy(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    cluster = Cluster("10.0.0.5:6379", str(shared))
    suite = load_suite(suite_file(tmp_path, "[ray]"), CATALOG)
    with Deployment(suite, CATALOG, ROOT / "weights" / "seg.pt", lambda _: None, cluster=cluster) as deployment:
        targets = deployment.torchserve
        assert targets.store.parent == shared  # every node reads the archives there
        engine = targets.ray_engine(tmp_path / "run", {}, None, False)
        assert isinstance(engine, RayServe) and engine.cluster == cluster and not engine.haproxy
        targets.server = engine  # not started: what the bench watches of it is decided by what it is
        endpoint = Endpoint("http://127.0.0.1:1", "/predictions/seg", None, {}, None, ("seg",))
        assert targets.watched_processes(endpoint) is None  # its replicas' pids are other hosts'
        targets.server = None
    assert not any(shared.iterdir())  # the built archives went with the deployment
    local = Deployment(suite, CATALOG, ROOT / "weights" / "seg.pt", lambda _: None)
    try:
        assert local.torchserve.ray_engine(tmp_path / "run2", {}, None, False).haproxy  # a Ray of its own: HAProxy in front
    finally:
        local.close()


def test_a_nodes_busy_and_total_cpu_seconds_are_counted_as_psutil_counts_them():
    times = {"user": 10.0, "nice": 1.0, "system": 4.0, "idle": 80.0, "iowait": 5.0, "irq": 0.5, "softirq": 0.5, "steal": 1.0}
    assert busy_and_total_s(times | {"guest": 3.0, "guest_nice": 1.0}) == (17.0, 102.0)  # guest time is inside user


def test_each_nodes_cpu_is_its_busy_share_over_the_measured_windows_only():
    def sample(t, head_busy, worker_busy):  # 2 cores each: 2 CPU-seconds a second
        return {"t": 100 + t, "nodes": {"10.0.0.2": [head_busy, 2.0 * t], "10.0.0.3": [worker_busy, 2.0 * t]}}

    # the head busy on one core throughout; the worker on both cores in 2 s..4 s only (a warm-up and a gap elsewhere)
    samples = [sample(t, 1.0 * t, 2.0 * min(max(t - 2, 0), 2)) for t in (0, 1, 2, 3, 4, 5, 6)]
    assert node_cpu_pct(samples, 100, [(2, 4)]) == {"10.0.0.2": 50.0, "10.0.0.3": 100.0}
    assert node_cpu_pct(samples, 100, [(0, 2), (4, 6)]) == {"10.0.0.2": 50.0, "10.0.0.3": 0.0}
    assert node_cpu_pct(samples, 100, [(2, 3), (3, 4)]) == {"10.0.0.2": 50.0, "10.0.0.3": 100.0}
    # a node with fewer than two samples in every window: no share, not 0 %
    assert node_cpu_pct(samples + [{"t": 105.5, "nodes": {"10.0.0.4": [1.0, 1.0]}}], 100, [(5, 6)])["10.0.0.4"] is None
    assert node_cpu_pct(samples, 100, [(7, 9)]) == {"10.0.0.2": None, "10.0.0.3": None}


def test_a_cluster_points_record_has_its_nodes_replicas_and_cpu_and_no_server_cpu_from_this_host(tmp_path):
    usage = NodeUsage("10.0.0.5:6379", {}, tmp_path, started_s=100.0)
    lines = [{"nodes": {"10.0.0.2": 2, "10.0.0.3": 2}, "replicas": {"10.0.0.2": 1, "10.0.0.3": 2}}]
    lines += [{"t": 100 + t, "nodes": {"10.0.0.2": [0.5 * t, 2.0 * t], "10.0.0.3": [1.5 * t, 2.0 * t]}} for t in range(6)]
    usage.out.write_text("".join(json.dumps(line) + "\n" for line in lines))
    hook = ClusterNodes(deployment=None)
    hook.usage = usage  # as start() leaves it, its driver already gone
    added = hook.finish(None, {"measured_windows_s": [[1.0, 3.0], [3.0, 5.0]]})
    assert added == {
        "ray_nodes": 2,
        "node_cores": {"10.0.0.2": 2, "10.0.0.3": 2},
        "replicas_per_node": {"10.0.0.2": 1, "10.0.0.3": 2},
        "node_cpu_pct": {"10.0.0.2": 25.0, "10.0.0.3": 75.0},
        "server_cpu_ms_per_request": None,  # the local process tree holds none of the nodes' processes
        "server_cpu_unavailable": CLUSTER_SERVER_CPU,
    }
    assert hook.usage is None and ClusterNodes(deployment=None).finish(None, {}) == {}  # no cluster point: nothing added


def test_the_overhead_harness_counts_2xx_answers_per_window_after_the_warm_up():
    sent = [Sent(0, t / 10, 200) for t in range(100)] + [Sent(5, 6.5, 503), Sent(5, 7.0, 0, "timeout")]
    assert window_rates(sent, began_s=0.0, warm_s=2.0, window_s=4.0, load_s=10.0) == [10.0, 10.0]


def test_the_overhead_harness_takes_replicas_spread_as_evenly_as_they_divide():
    assert even({"head": 1, "w1": 1}, 2) and even({"head": 2}, 2) and even({"head": 2, "w1": 1}, 3)
    assert not even({"head": 2, "w1": 0}, 2) and not even({"head": 3, "w1": 1}, 4)
