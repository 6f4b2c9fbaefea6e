"""A workflow that loses answers is measured, not hidden (segserve/bench/results/shown.py): its efficiency row stays,
flagged with what it lost, beside its members and its fused twin; a target without a best point is said why in
words that fit ("no point met the constraints" only where there are constraints); best/ holds the best point that
did not stall and names what the workflow lost."""

from types import SimpleNamespace

from segserve.archives.catalog import Catalog
from segserve.bench.results.analysis import Pipeline, analyse
from segserve.bench.results.render import terminal_summary
from segserve.bench.results.report import write_report
from segserve.bench.results.store import read_pipelines, write_pipelines
from segserve.bench.run.targets.best import Best
from tests.conftest import ROOT

LOST = (
    "1 answer of pre lost (TorchServe's DagExecutor race, docs/torchserve_workflows.md); its request waits timeout-ms 300000, "
    "longer than the client's timeout (30 s)"
)
STALL = f"stalled 27 s: requests in flight and none completed at 7.0–34.0 s (8 waiting) of the load: {LOST}"
PIPELINES = {"seg_jpeg": Pipeline(("seg", "jpeg"), "seg", "seg_jpeg_fused")}


def point(run_id: str, target: str, rps: float, **extra) -> dict:
    windows = [rps * 0.99, rps, rps * 1.01] if rps else []
    return {"run_id": run_id, "target": target, "throughput_rps": rps, "error": None, "latency_p99_ms": 80.0, "workers": 1} | {
        "measured_window_throughputs_rps": windows,
        "requests_failed": 0,
        **extra,
    }


def stalled_workflow() -> list[dict]:
    stalled = {"stalled": True, "stalled_s": 27.0, "stall_cause": STALL, "lost_answers": {"pre": 1}, "lost_cause": LOST}
    return [
        point("wf-1", "seg_jpeg", 40.0, **stalled, requests_failed=1, failures_by_status={"timeout": 1}),
        point("wf-2", "seg_jpeg", 30.0, **stalled),
        point("seg-1", "seg", 100.0),
        point("jpeg-1", "jpeg", 300.0),
        point("fused-1", "seg_jpeg_fused", 60.0),
    ]


def test_a_workflow_whose_every_point_stalled_keeps_its_row_with_what_it_lost():
    analysis = analyse(stalled_workflow(), {}, "throughput_rps", [], PIPELINES)
    assert analysis.winners["seg_jpeg"] is None  # a stalled point is never feasible
    (row,) = analysis.efficiency
    assert (row["pipeline"], row["pipeline_run_id"], row["pipeline_rps"], row["feasible"]) == ("seg_jpeg", "wf-1", 40.0, False)
    assert (row["seg_rps"], row["jpeg_rps"], row["fused_rps"], row["lost_answers"], row["requests_failed"]) == (100.0, 300.0, 60.0, 1, 1)
    assert row["flags"] == f"seg_jpeg: {STALL}; 1 request(s) failed (timeout: 1)"
    # its rate is not what its configuration serves: the bounds are there, no ratio printed as a result
    assert row["shared_bound_rps"] == 75.0 and row["ratio_shared"] is None and "seg_jpeg's point stalled" in row["ratio_shared_uncertain"]
    assert analysis.efficiency_notes == []
    summary = terminal_summary(stalled_workflow(), ["target"], analysis)
    assert f"seg_jpeg: NOT FEASIBLE: seg_jpeg: {STALL}" in summary


def test_the_row_is_in_pipelines_jsonl_and_report_md_says_why_without_a_word_of_constraints(tmp_path):
    records = stalled_workflow()
    analysis = analyse(records, {}, "throughput_rps", [], PIPELINES)
    write_pipelines(tmp_path, analysis.efficiency)
    assert [row["pipeline"] for row in read_pipelines(tmp_path)] == ["seg_jpeg"]
    text = write_report(tmp_path, "s", records, ["batch_size"], {}, "throughput_rps", analysis, {}).read_text()
    assert "- **seg_jpeg**: no best point: 2 of 2 point(s) stalled (\\`wf-1\\`: stalled 27 s" in text  # cell() escapes the ticks
    assert "no point met the constraints" not in text and "no point satisfied the constraints" not in text
    assert "| seg_jpeg | 40.0 | wf-1 | no |" in text  # the efficiency row, flagged not feasible
    flags = text.split("## Flags")[1]
    assert "- Lost answers (a workflow node's answers its executor never received" in flags and "`wf-1` (pre: 1), `wf-2` (pre: 1)" in flags


def test_no_point_met_the_constraints_is_said_only_where_there_are_constraints(tmp_path):
    records = [point("wf-1", "seg_jpeg", 40.0, latency_p99_ms=900.0), point("seg-1", "seg", 100.0), point("jpeg-1", "jpeg", 300.0)]
    constraints = {"latency_p99_ms": {"max": 200}}
    analysis = analyse(records, constraints, "throughput_rps", [], PIPELINES)
    assert analysis.no_winner == {"seg_jpeg": "no point met the constraints"}
    assert analysis.efficiency[0]["flags"] == "seg_jpeg: violates latency_p99_ms"
    # a target whose points failed or were disturbed says that, constraints or not
    failed = [point("wf-1", "seg_jpeg", None, error="RuntimeFailure: no request completed"), point("wf-2", "seg_jpeg", 9.0, stalled=True)]
    failed[1]["disturbed"] = True
    reason = analyse(failed, {}, "throughput_rps", [], PIPELINES).no_winner["seg_jpeg"]
    assert reason == "1 of 2 point(s) stalled (`wf-2`: stalled); 1 failed: RuntimeFailure: no request completed; 1 disturbed"


def test_best_holds_the_fused_point_and_names_what_the_workflow_lost(tmp_path):
    records = stalled_workflow()
    analysis = analyse(records, {}, "throughput_rps", [], PIPELINES)
    catalog = Catalog(ROOT)
    said = []
    run = SimpleNamespace(analysis=analysis, out_dir=tmp_path, environment={}, suite=SimpleNamespace(core_plan=None, archive_worker_env=()))
    Best(catalog, said.append).finish(run)
    config = (tmp_path / "best" / "config.properties").read_text()
    assert "# Best point of this suite: fused-1 (seg_jpeg_fused, 60.0 req/s)." in config
    assert f"# Not seg_jpeg, which has no best point: 2 of 2 point(s) stalled (`wf-1`: {STALL})" in config
    assert (tmp_path / "best" / "seg_jpeg.yaml").is_file() and any("Not seg_jpeg" in line for line in said)
