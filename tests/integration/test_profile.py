"""`segserve profile` against a real TorchServe: py-spy from outside every worker, a torch.profiler trace per node."""

import json

from segserve.bench.run.profiler import profile
from tests.conftest import ROOT


def test_profile_samples_every_worker_of_a_workflow_and_traces_each_node(server, tmp_path):
    from segserve.archives.catalog import Catalog

    target = Catalog(ROOT).target("seg_jpeg")
    bodies = [(ROOT / "samples" / "shapes_0.jpg").read_bytes()]
    summary = profile(server, target, server.run_dir, 2.0, tmp_path, bodies, connections=4, rate_hz=50, log=lambda _: None)
    assert summary["errors"] == [], {
        k: summary.get(k) for k in ("errors", "workers", "throughput_rps", "requests_failed", "cpu_pct", "seconds")
    }
    folder = tmp_path / summary["folder"].split("/")[-1]
    for model, pids in summary["workers"].items():
        assert {f"{model}-{pid}.svg" for pid in pids} <= set(summary["flame_graphs"])
        assert (folder / f"{model}-{pids[0]}.svg").read_text().lstrip().startswith("<?xml")
        trace = json.loads((folder / f"{model}.trace.json").read_text())
        assert trace["traceEvents"], model
        assert "Self CPU" in (folder / f"{model}.ops.txt").read_text()
        assert summary["top_functions"][model] and sum(r["self_pct"] for r in summary["top_functions"][model]) <= 100.5
        assert any("(handlers/" in r["function"] for r in summary["handler_costs"][model])
    assert set(summary["workers"]) == {"seg_jpeg__seg", "seg_jpeg__jpeg"}
    assert all(rate > 0 for rate in summary["throughput_rps"].values()) and summary["requests_failed"] == 0, {
        k: v for k, v in summary.items() if k in ("throughput_rps", "requests_failed", "failures", "errors", "status_counts")
    }
    assert summary["profiler_cost_pct"] is not None
    assert (folder / "report.md").read_text().startswith("# Profile of seg_jpeg")
    assert not list((server.run_dir / "profile-requests").glob("*"))  # every request was taken
