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
