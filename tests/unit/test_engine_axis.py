"""The suite's engine axis (grid.server.engine): Ray points beside TorchServe's, TorchServe's own settings refused on
a Ray point by name, a TorchServe point's run id as it was, the record's `engine`, and Ray's processes by role."""

import textwrap

import pytest

from segserve.archives.catalog import Catalog
from segserve.bench.run.point import record_for
from segserve.bench.suite import plan
from segserve.bench.suite.spec import load_suite
from segserve.engines.ray.engine import process_role
from segserve.errors import UsageError
from tests.conftest import ROOT

SAMPLES = str(ROOT / "samples" / "*.jpg")
CATALOG = Catalog(ROOT)


def suite_file(tmp_path, grid: str, targets: str = "[seg_jpeg_fused]"):
    path = tmp_path / "suite.yaml"
    path.write_text(f"targets: {targets}\ninputs: [{{images: ['{SAMPLES}']}}]\n" + textwrap.dedent(grid))
    return path


def test_a_torchserve_points_run_id_is_as_it_was_and_a_ray_point_is_a_point_of_its_own(tmp_path):
    before = plan.expand(load_suite(suite_file(tmp_path, ""), CATALOG), CATALOG)
    both = plan.expand(load_suite(suite_file(tmp_path, "grid: {server: {engine: [torchserve, ray]}}"), CATALOG), CATALOG)
    assert [p.engine for p in both] == ["ray", "torchserve"] or [p.engine for p in both] == ["torchserve", "ray"]
    torchserve = next(p for p in both if p.engine == "torchserve")
    ray = next(p for p in both if p.engine == "ray")
    assert [p.run_id for p in before] == [torchserve.run_id]
    assert ray.run_id != torchserve.run_id and ray.run_id.startswith("seg_jpeg_fused-")
    assert plan.cost(load_suite(suite_file(tmp_path, "grid: {server: {engine: [torchserve, ray]}}"), CATALOG), both).restarts == 2


@pytest.mark.parametrize(
    "grid, named",
    [
        ("grid: {server: {engine: [ray], netty_threads: [4]}}", "grid.server.netty_threads [4]"),
        ("grid: {server: {engine: [torchserve, ray], jvm_options: ['-Xmx1g']}}", "grid.server.jvm_options"),
        ("grid: {server: {engine: [ray], prefer_direct_buffer: [true]}}", "grid.server.prefer_direct_buffer"),
        ("grid: {server: {engine: [ray], pinning: [none, torchserve]}}", "grid.server.pinning ['torchserve']"),
        ("grid: {server: {engine: [ray], venv: [.venv-ipex]}}", "grid.server.venv"),
        ("grid: {server: {engine: [ray]}, load: {concurrency: [8], protocol: [grpc]}}", "grid.load.protocol ['grpc']"),
        ("grid: {server: {engine: [ray]}, runtime: {autoscale: [true]}}", "grid.runtime.autoscale [True]"),
    ],
)
def test_torchserves_own_settings_on_a_ray_point_are_refused_by_name(tmp_path, grid, named):
    with pytest.raises(UsageError) as refused:
        load_suite(suite_file(tmp_path, grid), CATALOG)
    assert named in str(refused.value) and "Ray point" in str(refused.value)


@pytest.mark.parametrize(
    "grid",
    [
        "grid: {server: {netty_threads: [4], pinning: [torchserve]}, load: {concurrency: [8], protocol: [grpc]}}",
        "grid: {server: {engine: [ray], pinning: [none], omp_num_threads: [1]}, load: {concurrency: [8], protocol: [http]}}",
        f"core_plan: {ROOT / 'core_plan.yaml'}\ngrid: {{server: {{engine: [torchserve, ray], pinning: [none, plan]}}}}",
    ],
)
def test_settings_both_engines_take_are_not_refused(tmp_path, grid):
    assert load_suite(suite_file(tmp_path, grid), CATALOG).grid.server is not None


def test_the_record_names_the_engine_torchserve_where_the_suite_gives_none():
    torchserve = plan.Point("seg", (), (), (("workers", 1),), (("concurrency", 8),))
    ray = plan.Point("seg", (("engine", "ray"),), (), (("workers", 1),), (("concurrency", 8),))
    assert record_for(torchserve, 1.0, {}, None)["engine"] == "torchserve"
    assert record_for(ray, 1.0, {}, None)["engine"] == "ray"


@pytest.mark.parametrize(
    "name, cmdline, role",
    [
        ("python3.11", ["/x/python", "-m", "segserve.engines.ray.haproxy_loopback", "-f", "cfg"], "frontend"),
        ("haproxy", ["/x/haproxy", "-f", "/tmp/segray-x/h/haproxy.cfg"], "frontend"),
        ("ray::ProxyActor", ["ray::ProxyActor"], "frontend"),
        ("gcs_server", ["/x/gcs_server", "--gcs_server_port=1"], "other"),
        ("raylet", ["/x/raylet"], "other"),
        ("ray::ServeReplica:torchserve:ingress", ["ray::ServeReplica:torchserve:ingress"], "other"),
        ("python3.11", ["/x/python", "-m", "segserve.engines.ray.driver", "plan.json"], "other"),
    ],
)
def test_rays_processes_that_are_no_replica_are_the_frontend_or_the_rest(name, cmdline, role):
    assert process_role(name, cmdline) == role


def measured(engine: str | None, rates: list[float], cpu: float, **params) -> dict:
    record = {"target": "seg", "run_id": f"seg-{engine}", "throughput_rps": sorted(rates)[len(rates) // 2], **params}
    record |= {"measured_window_throughputs_rps": rates, "server_cpu_ms_per_request": cpu}
    return record | ({"engine": engine} if engine else {})


def test_points_measured_on_both_engines_are_paired_and_the_faster_named_only_where_the_interval_says_so():
    from segserve.bench.results.engines import engine_rows, engine_verdict

    records = [
        measured(None, [100, 102, 98, 101], 3.0, concurrency=16),  # before the Ray engine: TorchServe's
        measured("ray", [150, 149, 152, 151], 2.4, concurrency=16),
        measured("torchserve", [100, 150, 60, 120], 3.0, concurrency=128),
        measured("ray", [110, 70, 140, 95], 2.0, concurrency=128),
        measured("ray", [500, 500, 500], 1.0, concurrency=4),  # no TorchServe point beside it: no row
    ]
    rows = engine_rows(records, ["engine", "concurrency"])
    by_point = {row["point"]: row for row in rows}
    assert set(by_point) == {"concurrency=16", "concurrency=128"}
    assert by_point["concurrency=16"]["faster"] == "ray" and by_point["concurrency=16"]["ray_vs_torchserve"] == pytest.approx(1.5, rel=0.03)
    assert by_point["concurrency=16"]["ray_vs_torchserve_cpu"] == pytest.approx(0.8)
    assert by_point["concurrency=128"]["faster"] == "neither"  # the windows spread too far
    assert engine_verdict(rows).startswith("Faster: **ray** on 1 of 2 point(s)")
    assert engine_verdict([]) is None
    slower = [measured("torchserve", [200, 201, 199], 1.0), measured("ray", [100, 101, 99], 2.0)]
    assert engine_verdict(engine_rows(slower, ["engine"])).startswith("Faster: **torchserve** on 1 of 1")


def test_best_names_the_engine_its_point_was_measured_on_and_how_to_serve_it(tmp_path):
    from types import SimpleNamespace

    from segserve.bench.results.analysis import analyse
    from segserve.bench.run.targets.best import Best

    for engine, says in (("ray", "segserve serve --engine ray --config best/config.properties"), (None, "Engine: TorchServe")):
        record = {"run_id": "fused-1", "target": "seg_jpeg_fused", "throughput_rps": 60.0, "workers": 1, "requests_failed": 0}
        record |= {"engine": engine} if engine else {}
        run = SimpleNamespace(
            analysis=analyse([record], {}, "throughput_rps", [], {}),
            out_dir=(tmp_path / str(engine)),
            environment={},
            suite=SimpleNamespace(core_plan=None, archive_worker_env=()),
        )
        run.out_dir.mkdir()
        Best(CATALOG, lambda _: None).finish(run)
        assert says in (tmp_path / str(engine) / "best" / "config.properties").read_text()


def test_report_sizes_a_best_ray_point_for_the_target_rate_or_says_why_not(monkeypatch):
    from segserve.bench.results.analysis import analyse
    from segserve.bench.results.report import _sizing_section

    ray = {"run_id": "seg-r", "target": "seg", "engine": "ray", "workers": 2, "throughput_rps": 100.0, "requests_failed": 0}
    ray |= {"latency_p99_ms": 80.0, "latency_mean_ms": 40.0, "server_cpu_ms_per_request": 15.0, "environment": {"cpu_cores": 2}}
    constraints = {"latency_p99_ms": {"max": 100}}
    monkeypatch.setenv("SEGSERVE_TARGET_RPS", "450")
    text = "\n".join(_sizing_section(analyse([ray], constraints, "throughput_rps", [], {})))
    assert "**seg**: sized for 450 req/s" in text and "replicas needed seg 9" in text  # ⌈2 × 450 ÷ 100⌉
    monkeypatch.delenv("SEGSERVE_TARGET_RPS")
    text = "\n".join(_sizing_section(analyse([ray], constraints, "throughput_rps", [], {})))
    assert "not sized: no target rate: set SEGSERVE_TARGET_RPS" in text
    torchserve = ray | {"engine": "torchserve"}
    assert _sizing_section(analyse([torchserve], constraints, "throughput_rps", [], {})) == []
