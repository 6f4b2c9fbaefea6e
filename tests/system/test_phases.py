"""Time-varying load in a suite (#16): load.phases, autoscaled points beside the static splits, their tables;
and one short run on a real TorchServe."""

import json

from segserve.cli import main
from tests.unit.test_phases import CATALOG, SAMPLES, record, suite_file  # noqa: F401 (fixtures among them)


def test_a_phased_suite_measures_static_and_autoscaled_points_on_a_real_torchserve(tmp_path, trained_weights):
    path = suite_file(
        tmp_path,
        """
        grid:
          archive: {batch_size: [4]}
          runtime: {seg_workers: [2], jpeg_workers: [1], autoscale: [false, true]}
          load: {concurrency: [6]}
        load:
          warmup_s: 1
          window_s: 2
          bare_forward_s: 0.6
          phases:
            - {name: small, duration_s: 5}
            - {name: large, duration_s: 8, inputs: [{synthetic: {height: 1080, width: 1920, count: 2}}]}
        autoscaler: {interval_s: 1.5, min_interval_s: 2, hysteresis: 0.1, min_queue_ms: 1}
        """,
    )
    assert main(["bench", str(path), "--results", str(tmp_path / "results"), "--weights", str(trained_weights)]) == 0
    (folder,) = (tmp_path / "results" / "phases").iterdir()
    records = {r["autoscale"]: r for r in map(json.loads, (folder / "summary.jsonl").read_text().splitlines())}
    runs = {r["autoscale"]: json.loads((folder / "runs" / f"{r['run_id']}.json").read_text()) for r in records.values()}
    for run in runs.values():
        assert run["error"] is None and run["requests_failed"] == 0
        assert [p["phase"] for p in run["phases"]] == ["small", "large"]
        assert all(p["requests_ok"] > 0 and p["latency_p99_ms"] > 0 for p in run["phases"])
    # TorchServe ignores a workflow node's own min-workers: the static point's seg node must still have had 2
    static_workers = [name for name in runs[False]["server_processes"] if name.startswith("seg_jpeg__seg/")]
    assert len(static_workers) == 2, runs[False]["server_processes"]
    decisions = runs[True]["autoscale_decisions"]
    assert decisions and runs[True]["autoscaler_cpu_pct"] >= 0 and runs[True]["autoscaler_failure"] is None
    for decision in decisions:  # within the budget of three workers, whatever it decided
        assert sum(decision["target"].values()) <= 3 and sum(m["workers"] for m in decision["metrics"]) <= 3, decision
    report = (folder / "report.md").read_text()
    assert "## Load phases" in report and "### The autoscaler against the static splits" in report
