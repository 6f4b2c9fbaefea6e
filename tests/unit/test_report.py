"""Results rendering: summary files, the efficiency table, report.md with plots, and `bench compare`."""

import csv
import json

import pytest

from segserve.bench.results.analysis import Pipeline, analyse, served_vs_bare
from segserve.bench.results.compare import CompareRun, compare
from segserve.bench.results.plots import pareto_front
from segserve.bench.results.render import render_table
from segserve.bench.results.report import write_report
from segserve.bench.results.sinks import FinishedRun, Plots, Summary
from segserve.bench.results.store import IDENTITY_KEYS, read_pipelines, read_summary, write_summary
from segserve.bench.suite.columns import BASE_COLUMNS, EXTRA_COLUMNS
from segserve.bench.suite.spec import Suite

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PIPELINES = {"seg_jpeg": Pipeline(("seg", "jpeg"), "seg"), "seg_jpeg_fused": Pipeline(("seg", "jpeg"), "seg")}
P99_MAX = {"latency_p99_ms": {"max": 200}}


def tight(value: float) -> list[float]:
    """Windows or slices whose median is `value`, within ±1%: a ratio of them is printed as a number."""
    return [value * 0.99, value, value * 1.01]


BARE = [
    {"batch_size": 8, "threads": 4, "throughput_ips": 95.0, "slices_ips": tight(95.0)},  # faster, but not the pipeline's thread count
    {"batch_size": 8, "threads": 2, "throughput_ips": 80.0, "slices_ips": tight(80.0)},
    {"batch_size": 1, "threads": 2, "throughput_ips": 23.0, "slices_ips": tight(23.0)},
]


def efficiency(records, constraints, objective, bare):
    return analyse(records, constraints, objective, bare, PIPELINES).efficiency


def time_breakdown(records, constraints, objective):
    return analyse(records, constraints, objective, [], PIPELINES).breakdown


def report(out_dir, name, records, swept, constraints, objective, bare, environment):
    """report.md and the plots it links, as the sinks write them."""
    analysis = analyse(records, constraints, objective, bare, PIPELINES)
    suite = Suite(name=name, targets=["seg"], inputs=[{"images": ["x"]}], objective=objective)
    Plots().finish(FinishedRun(out_dir, suite, records, swept, bare, analysis, environment))
    return write_report(out_dir, name, records, swept, constraints, objective, analysis, environment)


def record(run_id: str, target: str, throughput_rps: float | None, latency_p99_ms: float | None, **extra) -> dict:
    """A full record as the bench engine writes it; `extra` overrides or adds keys."""
    row = {c: None for c in BASE_COLUMNS + EXTRA_COLUMNS}
    row.update(
        run_id=run_id,
        target=target,
        workers=1,
        batch_size=8,
        concurrency=8,
        duration_s=9.1,
        requests_ok=400,
        requests_failed=0,
        throughput_rps=throughput_rps,
        latency_p50_ms=None if latency_p99_ms is None else latency_p99_ms / 2,
        latency_p99_ms=latency_p99_ms,
        stable=True,
        client_saturated=False,
        reconfigure_s=2.0,
        warmup_s=1.0,
        omp_num_threads=2,
        measured_window_throughputs_rps=tight(throughput_rps) if throughput_rps else [],
    )
    row.update(extra)
    return row


@pytest.fixture
def records() -> list[dict]:
    return [
        record("seg-ok", "seg", 100.0, 150.0),
        record("seg-fast-but-slow-tail", "seg", 150.0, 500.0),  # violates P99_MAX
        record("jpeg-only", "jpeg", 300.0, 40.0, stable=False, reconfigure_s=4.0, warmup_s=2.0),
        record("wf-8", "seg_jpeg", 60.0, 180.0, client_saturated=True),
        record("wf-1", "seg_jpeg", 20.0, 120.0, batch_size=1),
        record("fused-1", "seg_jpeg_fused", 50.0, 100.0, seg_batch_size=1, omp_num_threads=4),
        record("wf-broken", "seg_jpeg", None, None, error="worker died | exit 137", requests_ok=None, requests_failed=None),
    ]


def test_summary_csv_puts_swept_columns_once_between_base_and_extra(tmp_path, records):
    # batch_size is already a base column and omp_num_threads is listed twice: each must appear once
    write_summary(tmp_path, records, ["batch_size", "omp_num_threads", "omp_num_threads", "seg_batch_size"])
    with open(tmp_path / "summary.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == BASE_COLUMNS + ["omp_num_threads", "seg_batch_size"] + EXTRA_COLUMNS
    assert len(rows) == 1 + len(records)
    broken = dict(zip(rows[0], rows[-1], strict=True))
    assert broken["throughput_rps"] == "" and broken["seg_batch_size"] == ""
    assert broken["error"] == "worker died | exit 137"


def test_summary_jsonl_round_trips(tmp_path, records):
    write_summary(tmp_path, records, ["omp_num_threads", "seg_batch_size"])
    loaded = read_summary(tmp_path)
    assert len(loaded) == len(records)
    for original, back in zip(records, loaded, strict=True):
        assert back == {k: original.get(k) for k in back}
        assert list(back) == BASE_COLUMNS + ["omp_num_threads", "seg_batch_size"] + EXTRA_COLUMNS + list(IDENTITY_KEYS)


def test_efficiency_bounds_and_bare_pick(records):
    rows = {row["pipeline"]: row for row in efficiency(records, P99_MAX, "throughput_rps", BARE)}
    assert set(rows) == {"seg_jpeg", "seg_jpeg_fused"}
    wf = rows["seg_jpeg"]
    # the 150 req/s seg point breaks the p99 constraint, so Ts is 100
    assert (wf["pipeline_rps"], wf["seg_rps"], wf["jpeg_rps"]) == (60.0, 100.0, 300.0)
    assert wf["shared_bound_rps"] == pytest.approx(75.0)
    assert wf["ratio_shared"] == pytest.approx(0.8)
    assert wf["disjoint_bound_rps"] == 100.0
    assert wf["ratio_disjoint"] == pytest.approx(0.6)
    # batch 8 with 2 threads matches exactly
    assert (wf["bare_rps"], wf["bare_batch_size"], wf["bare_threads"]) == (80.0, 8, 2)
    assert wf["ratio_bare"] == pytest.approx(0.75)
    # seg_batch_size wins over batch_size; no 4-thread entry, so any batch-1 entry
    fused = rows["seg_jpeg_fused"]
    assert (fused["bare_rps"], fused["bare_batch_size"], fused["bare_threads"]) == (23.0, 1, 2)


def test_efficiency_without_matching_bare_leaves_bare_fields_empty(records):
    rows = efficiency(records, P99_MAX, "throughput_rps", [{"batch_size": 32, "threads": 2, "throughput_ips": 50.0}])
    assert all(row["bare_rps"] is None and row["ratio_bare"] is None and row["bare_threads"] is None for row in rows)
    assert rows[0]["ratio_shared"] == pytest.approx(0.8)


def test_efficiency_is_empty_without_members_or_pipeline(records):
    no_jpeg = [r for r in records if r["target"] != "jpeg"]
    members_only = [r for r in records if r["target"] in ("seg", "jpeg")]
    assert efficiency(no_jpeg, P99_MAX, "throughput_rps", BARE) == []
    assert efficiency(members_only, P99_MAX, "throughput_rps", BARE) == []
    # members exist but none meets the constraint: the row stays, its served points flagged
    rows = {row["pipeline"]: row for row in efficiency(records, {"latency_p99_ms": {"max": 1}}, "throughput_rps", BARE)}
    assert rows["seg_jpeg"]["feasible"] is False and rows["seg_jpeg"]["pipeline_rps"] == 60.0
    assert rows["seg_jpeg"]["flags"].startswith("seg_jpeg: violates latency_p99_ms · seg: violates latency_p99_ms")


def test_render_table_rounds_and_marks_missing():
    table = render_table([{"a": 123.456, "b": None, "c": 0.123456, "d": 44.0, "e": "x|y", "f": True}], list("abcdef"))
    lines = table.splitlines()
    assert lines[0] == "| a | b | c | d | e | f |"
    assert lines[2] == "| 123 | – | 0.123 | 44.0 | x\\|y | yes |"


def test_pareto_front_keeps_only_undominated_points():
    points = [(10.0, 50.0), (20.0, 60.0), (15.0, 70.0), (30.0, 200.0), (5.0, 40.0)]
    # (15, 70) is beaten by (20, 60) on both throughput and p99
    assert pareto_front(points) == [(5.0, 40.0), (10.0, 50.0), (20.0, 60.0), (30.0, 200.0)]


def test_report_sections_best_under_constraints_and_plots(tmp_path, records):
    environment = {"cpu_model": "Test CPU", "cores": 2, "versions": {"torch": "2.9"}, "git_sha": "abc1234"}
    swept = ["batch_size", "omp_num_threads"]
    path = report(tmp_path, "quick", records, swept, P99_MAX, "throughput_rps", BARE, environment)
    text = path.read_text()
    assert path == tmp_path / "report.md"
    for heading in ["# Benchmark report: quick", "## Environment", "## Best configuration", "## Pipeline efficiency", "## seg", "## Flags"]:
        assert heading in text
    assert "| git_sha | abc1234 |" in text
    assert "throughput_rps (req/s, higher is better)" in text
    assert "latency_p99_ms ≤ 200 ms" in text

    best_seg = next(line for line in text.splitlines() if line.startswith("- **seg**"))
    assert "`seg-ok`" in best_seg  # the faster point breaks the p99 limit
    violating_row = next(line for line in text.splitlines() if "seg-fast-but-slow-tail" in line)
    assert "✗ violates latency_p99_ms" in violating_row
    lines = text.splitlines()
    assert "| ★ best | seg-ok | 8 | 2 | 100 | 75.0 | 150 |" in text
    # sorted by the objective alone: the faster (violating) point comes first
    assert lines.index(violating_row) < next(i for i, line in enumerate(lines) if line.startswith("| ★ best | seg-ok |"))

    # failed point listed with its error (pipe escaped), not in a table row
    assert "- `wf-broken`: worker died \\| exit 137" in text
    flags = text.split("## Flags")[1]
    assert "not stable: `jpeg-only`" in flags and "saturated (its numbers understate the server): `wf-8`" in flags
    # jpeg: reconfigure 4 + warm-up 2 = 6 s outside measurement
    assert "| jpeg | 1 | 6.0 | 6.0 | 6.0 | 6.0 |" in text

    links = [line.split("](")[1].rstrip(")") for line in text.splitlines() if line.startswith("![")]
    expected = {f"plots/throughput_vs_p99_{t}.png" for t in ["seg", "jpeg", "seg_jpeg", "seg_jpeg_fused"]}
    expected |= {"plots/throughput_by_batch_size.png", "plots/throughput_by_omp_num_threads.png"}
    assert set(links) == expected
    for link in links:
        assert (tmp_path / link).read_bytes()[:8] == PNG_SIGNATURE


def test_report_with_nothing_satisfying_and_only_failed_points(tmp_path):
    failed = record("seg-broken", "seg", None, None, error="startup timeout", reconfigure_s=None, warmup_s=None, stable=None)
    single = record("jpeg-one", "jpeg", 300.0, 400.0)
    path = report(tmp_path, "tiny", [failed, single], ["jpeg_quality"], P99_MAX, "latency_p99_ms", [], {})
    text = path.read_text()
    # why, in words that fit: its points failed; under constraints, "no point met the constraints"
    assert "- **seg**: no best point: startup timeout." in text
    assert "- **jpeg**: no best point: no point met the constraints." in text
    assert "## Pipeline efficiency" not in text
    assert "(ms, lower is better)" in text
    assert (tmp_path / "plots" / "throughput_vs_p99_seg.png").read_bytes()[:8] == PNG_SIGNATURE
    assert (tmp_path / "plots" / "throughput_by_jpeg_quality.png").read_bytes()[:8] == PNG_SIGNATURE


def write_results(directory, rows: list[dict]):
    """A results folder as a run leaves it: the summary and one run JSON per point (where the windows are)."""
    directory.mkdir()
    write_summary(directory, rows, [])
    (directory / "runs").mkdir()
    for row in rows:
        (directory / "runs" / f"{row['run_id']}.json").write_text(json.dumps(row))
    return directory


@pytest.mark.parametrize(
    ("new_windows", "verdict", "slower"),
    [
        ([89.0, 90.0, 91.0], "slower", True),  # -10%, the whole interval below zero
        ([97.5, 98.0, 98.5], "no detectable change", False),  # a real -2%, smaller than the minimum effect
        ([119.0, 120.0, 121.0], "faster", False),
        ([80.0, 100.0, 120.0], "too noisy to tell", False),  # the interval reaches past ±5% both ways
        ([99.5, 100.0, 100.5], "no detectable change", False),
    ],
)
def test_compare_decides_from_the_windows_and_fails_only_on_a_detected_slowdown(tmp_path, new_windows, verdict, slower):
    old = write_results(tmp_path / "old", [record("a", "seg", 100.0, 100.0, measured_window_throughputs_rps=[99.0, 100.0, 101.0])])
    rps = sum(new_windows) / len(new_windows)
    new = write_results(tmp_path / "new", [record("a", "seg", rps, 100.0, measured_window_throughputs_rps=new_windows)])
    text, got = compare(CompareRun(old, new, min_effect=0.05))
    assert got is slower
    line = text.splitlines()[0].split("; latency_p99_ms")[0]
    assert line.startswith("a: throughput_rps 100 → ") and line.endswith(" " + verdict), text
    # a change whose interval is wider than ±15% of new ÷ old is printed as that interval only, not as a number
    assert ("uncertain (" in line) is (new_windows == [80.0, 100.0, 120.0]), text


def test_compare_lists_unmatched_points_and_ignores_them_for_regression(tmp_path):
    none = {"measured_window_throughputs_rps": []}
    old = write_results(tmp_path / "old", [record("a", "seg", 100.0, 100.0, **none), record("gone", "seg", 1.0, 1.0)])
    new = write_results(tmp_path / "new", [record("a", "seg", 101.0, 100.0, **none), record("added", "jpeg", 1.0, 1.0)])
    text, regressed = compare(CompareRun(old, new))
    assert not regressed
    assert "too noisy to tell" in text.splitlines()[0]  # no windows recorded: nothing to decide from
    assert f"gone: only in old ({old})" in text
    assert f"added: only in new ({new})" in text


def test_compare_counts_a_newly_failing_point_as_regression(tmp_path):
    old = write_results(tmp_path / "old", [record("a", "seg", 100.0, 100.0)])
    new = write_results(tmp_path / "new", [record("a", "seg", None, None, error="timeout \x1b[2J\rby a worker")])
    text, regressed = compare(CompareRun(old, new))
    assert regressed and "now failing: timeout \\x1b[2J by a worker REGRESSED" in text  # its escapes shown, not obeyed


def test_compare_names_the_missing_summary(tmp_path):
    new = write_results(tmp_path / "new", [record("a", "seg", 1.0, 1.0)])
    with pytest.raises(FileNotFoundError, match="summary.jsonl"):
        compare(CompareRun(tmp_path / "nowhere", new))


def test_summary_jsonl_is_one_json_object_per_line(tmp_path, records):
    write_summary(tmp_path, records, [])
    lines = (tmp_path / "summary.jsonl").read_text().splitlines()
    assert [json.loads(line)["run_id"] for line in lines] == [r["run_id"] for r in records]


def test_the_summary_sink_writes_the_efficiency_table_to_pipelines_jsonl_key_for_key(tmp_path, records):
    records[3]["disturbed"] = True  # wf-8, seg_jpeg's best: its ratios are withheld as uncertain, with a note
    analysis = analyse(records, P99_MAX, "throughput_rps", BARE, PIPELINES)
    suite = Suite(name="quick", targets=["seg"], inputs=[{"images": ["x"]}])
    Summary().finish(FinishedRun(tmp_path, suite, records, [], BARE, analysis, {}))
    rows = read_pipelines(tmp_path)
    assert rows == analysis.efficiency and [list(r) for r in rows] == [list(r) for r in analysis.efficiency]
    by_name = {r["pipeline"]: r for r in rows}
    assert by_name["seg_jpeg"]["ratio_shared"] is None and "disturbed" in by_name["seg_jpeg"]["ratio_shared_uncertain"]
    assert by_name["seg_jpeg_fused"]["ratio_shared"] == pytest.approx(50 / 75) and by_name["seg_jpeg_fused"]["jpeg_rps"] == 300.0
    # a run without pipelines writes an empty file; a folder from before pipelines.jsonl has no pipeline rows
    Summary().finish(FinishedRun(tmp_path, suite, records, [], BARE, analyse(records, P99_MAX, "throughput_rps", BARE, {}), {}))
    assert (tmp_path / "pipelines.jsonl").read_text() == "" and read_pipelines(tmp_path) == []
    (tmp_path / "pipelines.jsonl").unlink()
    assert read_pipelines(tmp_path) == [] and len(read_summary(tmp_path)) == len(records)


def test_served_vs_bare_gives_the_best_batch_per_thread_count_against_the_matching_bare_entry():
    seg = [
        record("t2-b8", "seg", 70.0, 100.0, batch_size=8, omp_num_threads=2),
        record("t2-b1", "seg", 40.0, 100.0, batch_size=1, omp_num_threads=2),
        record("t1-b1", "seg", 22.0, 100.0, batch_size=1, omp_num_threads=1),
        record("t1-b8", "seg", 30.0, 100.0, batch_size=8, omp_num_threads=1, bare_forward_ips=37.5, bare_slices_ips=tight(37.5)),
        record("small-input", "seg", 90.0, 100.0, batch_size=8, omp_num_threads=2, input_size=[128, 224]),
    ]
    bare = [
        {
            "batch_size": 8,
            "threads": 2,
            "input_size": [256, 448],
            "throughput_ips": 80.0,
            "throughput_min_ips": 75.0,
            "slices_ips": tight(80.0),
        },
        {"batch_size": 8, "threads": 1, "input_size": [256, 448], "throughput_ips": 40.0},
        {"batch_size": 8, "threads": 2, "input_size": [128, 224], "throughput_ips": 300.0, "slices_ips": tight(300.0)},
    ]
    rows = served_vs_bare(seg, {}, "throughput_rps", bare)
    assert [r["run_id"] for r in rows] == ["small-input", "t2-b8", "t1-b8"]  # the overall winner first
    assert rows[0]["bare_end_rps"] == 300.0 and rows[0]["ratio_bare"] == pytest.approx(0.3)  # matched by input size too
    assert (rows[1]["bare_end_rps"], rows[1]["bare_end_min_rps"], rows[1]["ratio_bare"]) == (80.0, 75.0, pytest.approx(0.875))
    # measured beside the point, the bare forward is the one the ratio uses
    assert (rows[2]["threads"], rows[2]["bare_beside_rps"], rows[2]["bare_end_rps"]) == (1, 37.5, 40.0)
    assert rows[2]["ratio_bare"] == pytest.approx(0.8)


def test_time_breakdown_splits_the_mean_latency_into_nodes_and_frontend_hops():
    workflow = record(
        "wf",
        "seg_jpeg",
        60.0,
        300.0,
        latency_mean_ms=250.0,
        server_models={
            "seg_jpeg__seg": {"queue_ms": 80.0, "inference_ms": 200.0},
            "seg_jpeg__jpeg": {"queue_ms": 4.0, "inference_ms": 38.0},
        },
        server_stages={"seg_jpeg__seg": {"decode_ms": 2.0, "predict_ms": 13.0, "encode_ms": 0.5}},
        server_processes={"seg_jpeg__seg/11": {"cpu_pct": 100.0}, "seg_jpeg__jpeg/12": {"cpu_pct": 20.0}, "frontend": {"cpu_pct": 30.0}},
    )
    rows = time_breakdown([workflow, record("seg", "seg", 70.0, 100.0)], {}, "throughput_rps")
    assert [r["part"] for r in rows] == ["seg_jpeg__seg", "seg_jpeg__jpeg", "frontend hops + network (rest of mean latency)"]
    assert (rows[0]["node_ms"], rows[0]["of_which_queue_ms"], rows[0]["handler_ms_per_request"], rows[0]["cpu_pct"]) == (
        200.0,
        80.0,
        15.5,
        100.0,
    )
    assert rows[1]["handler_ms_per_request"] is None  # no stage counters for that node
    assert rows[2]["node_ms"] == pytest.approx(12.0) and rows[2]["cpu_pct"] == 30.0  # 250 - 200 - 38: queue is inside node time


def test_compare_refuses_points_measured_differently_and_says_what_differs(tmp_path):
    from segserve.errors import UsageError

    setup = {"load": "aaaa", "inputs": "bbbb", "recipe": "cccc", "server": "dddd"}
    old = write_results(tmp_path / "old", [record("seg-1", "seg", 100.0, 100.0, point_key="k1", setup=setup)])
    new_setup = {**setup, "load": "eeee", "inputs": "ffff"}
    new = write_results(tmp_path / "new", [record("seg-2", "seg", 100.0, 100.0, point_key="k1", setup=new_setup)])
    with pytest.raises(UsageError, match=r"seg seg-1 vs seg-2: measured with other inputs, load"):
        compare(CompareRun(old, new))
    same = write_results(tmp_path / "same", [record("seg-1", "seg", 99.0, 100.0, point_key="k1", setup=setup)])
    assert compare(CompareRun(old, same))[1] is False


def test_compare_refuses_folders_without_a_point_in_common(tmp_path):
    from segserve.errors import UsageError

    old = write_results(tmp_path / "old", [record("seg-1", "seg", 100.0, 100.0)])
    new = write_results(tmp_path / "new", [record("seg-2", "seg", 100.0, 100.0)])
    with pytest.raises(UsageError, match="no point in common"):
        compare(CompareRun(old, new))


def test_a_served_rate_above_the_bare_network_beyond_its_interval_is_suspect_not_a_result():
    from segserve.bench.run.baselines import served_vs_bare as beside

    sane = beside([70.0, 72.0, 71.0], [{"slices_ips": [100.0, 104.0, 98.0]}, {"slices_ips": [101.0, 99.0, 103.0]}])
    assert sane["ratio_bare"] == pytest.approx(71.0 / 100.5) and not sane["suspect"]
    assert sane["ratio_bare_ci_low"] <= sane["ratio_bare"] <= sane["ratio_bare_ci_high"] < 1
    absurd = beside(
        [49.0, 50.0, 49.5], [{"slices_ips": [5.7, 6.8]}, {"slices_ips": [6.0, 5.9]}]
    )  # the bare forward measured while something else ran
    assert absurd["suspect"] and absurd["ratio_bare_ci_low"] > 1
    rows = served_vs_bare([record("seg-x", "seg", 49.5, 100.0, **absurd)], {}, "throughput_rps", [])
    assert rows[0]["suspect"] and rows[0]["ratio_bare"] is None  # not printed as a result


def test_pipeline_ratios_carry_a_bootstrap_interval_from_the_measured_windows(records):
    windows = {"seg-ok": [98.0, 100.0, 102.0], "jpeg-only": [290.0, 300.0, 310.0], "wf-8": [58.0, 60.0, 62.0]}
    for r in records:
        r["measured_window_throughputs_rps"] = windows.get(r["run_id"], [])
    wf = {row["pipeline"]: row for row in efficiency(records, P99_MAX, "throughput_rps", BARE)}["seg_jpeg"]
    assert wf["ratio_shared"] == pytest.approx(0.8)
    assert wf["ratio_shared_ci_low"] < 0.8 < wf["ratio_shared_ci_high"]
    assert wf["ratio_disjoint_ci_low"] < 0.6 < wf["ratio_disjoint_ci_high"]


def test_the_suite_decides_from_every_points_change():
    from segserve.bench.results.compare import Change, overall_change

    def changes(values):
        return [Change(v, v - 0.1, v + 0.1, "too noisy to tell") for v in values]

    assert overall_change(changes([-0.09, -0.11, -0.08, -0.10, -0.07, -0.12]), 0.05).verdict == "slower"
    assert overall_change(changes([0.02, -0.03, 0.01, -0.01, 0.0, 0.02]), 0.05).verdict == "no detectable change"
    assert overall_change(changes([0.2, -0.25, 0.1, -0.3]), 0.05).verdict == "too noisy to tell"
    single = Change(-0.2, -0.3, -0.1, "slower")
    assert overall_change([single], 0.05) is single


def test_ratios_of_disturbed_points_are_not_printed_as_results(records):
    for r in records:
        if r["run_id"] == "jpeg-only":
            r["disturbed"] = True
    wf = {row["pipeline"]: row for row in efficiency(records, P99_MAX, "throughput_rps", BARE)}["seg_jpeg"]
    assert wf["disturbed"] and wf["ratio_shared"] is None and wf["ratio_disjoint"] is None and wf["pipeline_rps"] == 60.0
    seg = [
        record(
            "seg-d",
            "seg",
            50.0,
            100.0,
            ratio_bare=1.1,
            ratio_bare_ci_low=0.9,
            ratio_bare_ci_high=1.8,
            bare_forward_ips=45.0,
            disturbed=True,
        )
    ]
    assert served_vs_bare(seg, {}, "throughput_rps", [])[0]["ratio_bare"] is None


def test_a_point_measured_in_rounds_is_judged_from_its_rounds_side_by_side():
    from segserve.bench.results.compare import paired_change

    # every round's workers run at their own speed (80…120), but B is 10% slower than A within each round
    a = [100.0, 120.0, 80.0, 110.0]
    b = [90.0, 108.0, 72.0, 99.0]
    change = paired_change(a, b, 0.05)
    assert change.change == pytest.approx(-0.10) and change.verdict == "slower"
    # the same numbers unpaired (B's best round above A's worst) tell nothing
    assert paired_change(a, list(reversed(b)), 0.05).verdict == "too noisy to tell"
    assert paired_change([100.0], [90.0], 0.05).verdict == "too noisy to tell"  # one round: no interval


def test_two_objectives_give_a_pareto_front_and_the_report_a_search_section(tmp_path):
    from segserve.bench.results.analysis import pareto_front
    from segserve.bench.results.report import write_report

    rows = [
        record("fast", "seg_jpeg", 100.0, 400.0),
        record("quick", "seg_jpeg", 60.0, 90.0),
        record("both-worse", "seg_jpeg", 50.0, 100.0),  # beaten by "quick" on both
        record("tie-worse", "seg_jpeg", 60.0, 120.0),  # as fast as "quick", slower tail
        record("too-slow", "seg_jpeg", 120.0, 900.0),  # breaks the constraint
        record("predicted", "seg_jpeg", 80.0, 200.0, predicted_throughput_rps=100.0),
    ]
    constraints = {"latency_p99_ms": {"max": 500}}
    front = pareto_front(rows, ["throughput_rps", "latency_p99_ms"], constraints)
    assert [r["run_id"] for r in front] == ["fast", "predicted", "quick"]
    assert pareto_front(rows, ["throughput_rps"], constraints) == []
    analysis = analyse(rows, constraints, "throughput_rps", [], {}, ["throughput_rps", "latency_p99_ms"])
    assert analysis.infeasible == 1
    (prediction,) = analysis.predictions
    assert prediction["run_id"] == "predicted" and prediction["measured_over_predicted"] == 0.8
    search = {"strategy": "auto", "budget": "6 points (5%)", "candidates": 120, "measured": 6}
    search.update(restarts=1, registrations=4, scales=2)
    text = write_report(tmp_path, "s", rows, ["batch_size"], constraints, "throughput_rps", analysis, {}, search).read_text()
    assert "Strategy **auto**, budget 6 points (5%): 6 point(s) measured of 120 candidate(s); 0 stopped early" in text
    assert "1 server start(s), 4 registration(s) and 2 live scale call(s)" in text
    assert "### Pareto front" in text and "### Predicted vs measured (auto)" in text


def test_compare_refuses_runs_from_different_machines_unless_asked_and_then_says_so(tmp_path):
    from segserve.errors import UsageError
    from segserve.machine.identity import cpu_identity
    from tests.unit.test_machine import SAPPHIRE_RAPIDS, ZEN3

    zen3, spr = ({**cpu_identity(text), "gpu": None} for text in (ZEN3, SAPPHIRE_RAPIDS))
    old = write_results(tmp_path / "old", [record("a", "seg", 100.0, 100.0, environment=zen3)])
    new = write_results(tmp_path / "new", [record("a", "seg", 60.0, 100.0, environment=spr)])
    with pytest.raises(UsageError, match=r"different machines \(cpu_family, .*cpu_isa.*\)[\s\S]*--across-machines"):
        compare(CompareRun(old, new))
    text, slower = compare(CompareRun(old, new, across_machines=True))
    assert text.startswith("ACROSS MACHINES") and "family 25 model 1" in text and "Platinum 8488C" in text and slower
    same = write_results(tmp_path / "same", [record("a", "seg", 100.0, 100.0, environment=zen3)])
    assert "ACROSS" not in compare(CompareRun(old, same))[0]
    # a baseline from before the CPU was identified still compares, by CPU name and cores, and says so
    before = write_results(tmp_path / "before", [record("a", "seg", 100.0, 100.0, environment={"cpu_model": "AMD EPYC", "cpu_cores": 2})])
    assert "compared by CPU name and cores only" in compare(CompareRun(before, same))[0]


def test_a_bare_forward_that_moved_in_the_run_makes_every_ratio_to_it_uncertain(records):
    """#59: seg's bare forward measured 108 img/s beside its point and 161 at the suite's end. The pipeline's ratio
    to the end's (0.496, a tight interval) and seg's ratio to its own must both say `uncertain`, with the reason."""
    bare = [{"batch_size": 8, "threads": 2, "throughput_ips": 161.0, "slices_ips": tight(161.0)}]
    seg = record("seg-ok", "seg", 100.0, 150.0, bare_forward_ips=108.0, bare_slices_ips=tight(108.0))
    runs = [seg, record("jpeg-only", "jpeg", 300.0, 40.0), record("wf-8", "seg_jpeg", 79.9, 180.0)]
    rows = {row["pipeline"]: row for row in efficiency(runs, P99_MAX, "throughput_rps", bare)}
    wf = rows["seg_jpeg"]
    assert wf["ratio_bare"] is None and wf["ratio_bare_uncertain"].startswith("uncertain (0.49–0.5")
    assert "the bare forward measured 108 img/s beside the points and 161 at the end" in wf["ratio_bare_uncertain"]
    assert wf["ratio_shared"] is not None  # the members' bounds do not depend on the bare forward
    served = served_vs_bare([seg], P99_MAX, "throughput_rps", bare)[0]
    assert served["ratio_bare"] is None and "108 img/s beside the points and 161 at the end" in served["ratio_bare_uncertain"]
    # the same run with a bare forward that agreed with itself (150 beside, 161 at the end): a number
    steady = record("seg-ok", "seg", 100.0, 150.0, bare_forward_ips=150.0, bare_slices_ips=tight(150.0))
    wf = {r["pipeline"]: r for r in efficiency([steady, *runs[1:]], P99_MAX, "throughput_rps", bare)}["seg_jpeg"]
    assert wf["ratio_bare"] == pytest.approx(79.9 / 161.0) and wf["ratio_bare_uncertain"] is None
