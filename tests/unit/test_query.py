"""`segserve results query`: rows of several result folders in one table, filtered, sorted, cut (no server)."""

import csv
import io
import json

import pytest

from segserve.cli import main


def result_folder(root, suite: str, timestamp: str, rows: list[dict]):
    folder = root / suite / timestamp
    folder.mkdir(parents=True)
    (folder / "summary.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


@pytest.fixture
def results(tmp_path):
    root = tmp_path / "results"
    result_folder(
        root,
        "quick",
        "20261130T100000Z",
        [
            {"run_id": "seg-1", "target": "seg", "throughput_rps": 60.0, "latency_p99_ms": 40.0, "error": None},
            {"run_id": "fused-1", "target": "seg_jpeg_fused", "throughput_rps": 90.0, "latency_p99_ms": 45.0, "error": None},
            {"run_id": "fused-2", "target": "seg_jpeg_fused", "throughput_rps": 95.0, "latency_p99_ms": 70.0, "error": None},
        ],
    )
    result_folder(
        root,
        "grid",
        "20261201T100000Z",
        [
            {"run_id": "fused-3", "target": "seg_jpeg_fused", "throughput_rps": 99.0, "latency_p99_ms": 30.0, "error": None},
            {"run_id": "fused-4", "target": "seg_jpeg_fused", "throughput_rps": None, "latency_p99_ms": None, "error": "boom"},
        ],
    )
    return root


def run_json(capsys, *args) -> list[dict]:
    assert main(["results", "query", *args, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_rows_of_every_run_filtered_and_sorted_with_their_suite_and_timestamp(results, capsys):
    rows = run_json(capsys, str(results), "--where", "latency_p99_ms<50", "--where", "target=seg_jpeg_fused", "--sort", "-throughput_rps")
    assert [(r["run_id"], r["suite"], r["timestamp"]) for r in rows] == [
        ("fused-3", "grid", "20261201T100000Z"),
        ("fused-1", "quick", "20261130T100000Z"),
    ]


def test_limit_ascending_sort_and_missing_values_last(results, capsys):
    rows = run_json(capsys, str(results / "quick" / "20261130T100000Z"), str(results / "grid"), "--sort", "throughput_rps")
    assert [r["run_id"] for r in rows] == ["seg-1", "fused-1", "fused-2", "fused-3", "fused-4"]
    rows = run_json(capsys, str(results), "--sort", "-throughput_rps", "--limit", "2")
    assert [r["run_id"] for r in rows] == ["fused-3", "fused-2"]
    rows = run_json(capsys, str(results), "--where", "throughput_rps>=95", "--where", "error!=boom")
    assert sorted(r["run_id"] for r in rows) == ["fused-2", "fused-3"]


def test_table_and_csv(results, capsys):
    assert main(["results", "query", str(results), "--where", "target=seg", "--where", "latency_p99_ms<=40"]) == 0
    table = capsys.readouterr().out
    assert "| suite | timestamp | run_id |" in table and "| quick | 20261130T100000Z | seg-1 |" in table
    assert main(["results", "query", str(results), "--sort", "-throughput_rps", "--format", "csv"]) == 0
    parsed = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["run_id"] for r in parsed][:2] == ["fused-3", "fused-2"] and parsed[0]["suite"] == "grid"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--where", "latency_p99<50"], "unknown column 'latency_p99' — did you mean 'latency_p99_ms'?"),
        (["--sort", "-throughput"], "--sort '-throughput': unknown column 'throughput' — did you mean 'throughput_rps'?"),
        (["--where", "throughput_rps~5"], "give COLUMN OP VALUE"),
        (["--limit", "0"], "--limit must be ≥ 1"),
    ],
)
def test_bad_queries_are_refused_in_one_line(results, capsys, args, message):
    assert main(["results", "query", str(results), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_folder_without_results_is_refused(tmp_path, capsys):
    assert main(["results", "query", str(tmp_path)]) == 2
    assert "no result folder (summary.jsonl) in it" in capsys.readouterr().err


def pipeline_row(name: str, rps: float, ratio_shared: float | None, note: str | None = None) -> dict:
    """A row of the efficiency table as pipelines.jsonl holds it (members seg 100 and jpeg 300: shared bound 75)."""
    return {
        "pipeline": name,
        "pipeline_rps": rps,
        "members": "seg 100.0, jpeg 300.0",
        "seg_rps": 100.0,
        "jpeg_rps": 300.0,
        "shared_bound_rps": 75.0,
        "disturbed": False,
        "ratio_shared": ratio_shared,
        "ratio_shared_ci_low": None if ratio_shared is None else ratio_shared * 0.95,
        "ratio_shared_ci_high": None if ratio_shared is None else ratio_shared * 1.05,
        "ratio_shared_uncertain": note,
    }


def test_pipelines_rows_are_filtered_and_sorted_like_points(results, capsys):
    from segserve.bench.results.store import write_pipelines

    write_pipelines(
        results / "quick" / "20261130T100000Z",
        [
            pipeline_row("seg_jpeg", 60.0, 0.8),
            pipeline_row("seg_jpeg_fused", 95.0, 1.27),
            pipeline_row("seg_fanout", 70.0, None, "uncertain (0.8–1.3): too few windows"),
        ],
    )
    # the grid run has no pipelines.jsonl (written before it existed): no rows, not an error
    rows = run_json(capsys, str(results), "--pipelines", "--where", "ratio_shared>1")
    assert [(r["pipeline"], r["suite"], r["timestamp"], r["ratio_shared_ci_low"]) for r in rows] == [
        ("seg_jpeg_fused", "quick", "20261130T100000Z", pytest.approx(1.2065))
    ]
    rows = run_json(capsys, str(results), "--pipelines", "--sort", "-ratio_shared")
    assert [r["pipeline"] for r in rows] == ["seg_jpeg_fused", "seg_jpeg", "seg_fanout"]  # the withheld ratio last
    # the table shows the pipeline's columns, and a withheld ratio's note in its place
    assert main(["results", "query", str(results), "--pipelines", "--where", "pipeline=seg_fanout"]) == 0
    table = capsys.readouterr().out
    assert "| suite | timestamp | pipeline | pipeline_rps | members | shared_bound_rps | ratio_shared |" in table
    assert "| quick | 20261130T100000Z | seg_fanout | 70.0 | seg 100.0, jpeg 300.0 | 75.0 | uncertain (0.8–1.3): too few windows |" in table


def test_runs_without_pipelines_give_no_pipeline_row(results, capsys):
    assert run_json(capsys, str(results), "--pipelines", "--where", "ratio_shared>1") == []
    assert main(["results", "query", str(results / "grid"), "--pipelines"]) == 0
    assert "no pipeline row: a run has one only where it measured a DAG target and each of its members" in capsys.readouterr().out
