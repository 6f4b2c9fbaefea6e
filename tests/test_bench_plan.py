"""Suite validation, grid expansion, restart/re-register planning and the statistics rules."""

import textwrap

import pytest

from segserve.bench import plan
from segserve.bench.stats import latency_summary, spread, stable_tail
from segserve.bench.suite import load_suite
from segserve.cli import main
from segserve.errors import UsageError
from tests.conftest import ROOT


def write(tmp_path, text: str):
    path = tmp_path / "suite.yaml"
    path.write_text(textwrap.dedent(text))
    return path


SAMPLES = str(ROOT / "samples" / "*.jpg")


def test_typos_wrong_types_and_impossible_combinations_give_one_line_each(tmp_path, capsys):
    path = write(
        tmp_path,
        f"""
        targets: [seg, segjpeg]
        inputs:
          - images: ["{SAMPLES}"]
          - raw: {{dtype: float8}}
          - images: ["{SAMPLES}"]
            raw: {{count: 1}}
        grid:
          archive: {{batch_sise: [1, 8]}}
          runtime: {{workers: [0]}}
          load: {{concurrency: [1], request_rate_rps: [3]}}
        lod: {{warmup_s: 1}}
        constraints: {{latency_p99: {{max: 100}}}}
        objective: thruput
        """,
    )
    assert main(["bench", str(path), "--dry-run"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    expected = [
        "targets.1: Input should be 'seg', 'jpeg', 'seg_jpeg' or 'seg_jpeg_fused' (got 'segjpeg') — did you mean 'seg_jpeg'?",
        "inputs.1.raw.dtype: Input should be 'float16', 'float32' or 'bfloat16' (got 'float8') — did you mean 'float32'?",
        "inputs.2: give exactly one of 'images' or 'raw'",
        "grid.archive.batch_sise: unknown key — did you mean 'batch_size'?",
        "grid.runtime.workers.0: Input should be greater than or equal to 1 (got 0)",
        "grid.load: give exactly one of 'concurrency' (closed loop) or 'request_rate_rps' (open loop)",
        "lod: unknown key — did you mean 'load'?",
        "constraints: unknown metric 'latency_p99' — did you mean 'latency_p99_ms'?",
        "objective: unknown metric 'thruput'",
    ]
    assert len(lines) == len(expected)
    for fragment in expected:
        assert sum(fragment in line for line in lines) == 1, fragment
    assert all(line.startswith(f"error: {path}: ") for line in lines)


def test_inputs_that_match_no_file_are_refused(tmp_path):
    path = write(tmp_path, "targets: [seg]\ninputs:\n  - images: [nowhere/*.png]\n")
    with pytest.raises(UsageError, match=r"inputs: no file matches 'nowhere/\*\.png'"):
        load_suite(path)


def test_grid_expansion_keeps_only_parameters_a_target_uses(tmp_path):
    path = write(
        tmp_path,
        f"""
        targets: [seg_jpeg, jpeg, seg]
        inputs: [{{images: ["{SAMPLES}"]}}]
        grid:
          server: {{omp_num_threads: [1, 2]}}
          archive: {{batch_size: [1, 8], precision: [fp32, bf16], jpeg_quality: [80, 95]}}
          runtime: {{workers: [1, 2]}}
          load: {{concurrency: [4, 16]}}
        """,
    )
    points = plan.expand(load_suite(path))
    by_target = {t: [p for p in points if p.target == t] for t in ("seg", "jpeg", "seg_jpeg")}
    # seg: 2 threads × 2 batch × 2 precision × 2 workers × 2 loads; jpeg has quality instead of precision;
    # the workflow has both, and `workers` alone sets both nodes together (not every combination).
    assert [len(by_target[t]) for t in ("seg", "jpeg", "seg_jpeg")] == [32, 32, 64]
    assert all("jpeg_quality" not in p.params for p in by_target["seg"])
    assert all("precision" not in p.params for p in by_target["jpeg"])
    assert all(p.params["seg_workers"] == p.params["jpeg_workers"] for p in by_target["seg_jpeg"])
    assert len({p.run_id for p in points}) == len(points)
    assert plan.swept(points) == [
        "batch_size",
        "concurrency",
        "jpeg_quality",
        "jpeg_workers",
        "omp_num_threads",
        "precision",
        "seg_workers",
    ]


def test_plan_restarts_only_on_server_changes_and_reregisters_only_on_archive_changes(tmp_path):
    path = write(
        tmp_path,
        f"""
        targets: [seg, seg_jpeg]
        inputs: [{{images: ["{SAMPLES}"]}}]
        grid:
          server: {{netty_threads: [2, 4]}}
          archive: {{batch_size: [1, 8]}}
          runtime: {{seg_workers: [1, 2], jpeg_workers: [1]}}
          load: {{concurrency: [4, 16]}}
        """,
    )
    suite = load_suite(path)
    points = plan.expand(suite)
    cost = plan.cost(suite, points)
    # 2 server settings; per setting 2 targets × 2 batch sizes registrations; per registration 1 live scale (workers 1 → 2).
    assert (cost.points, cost.restarts, cost.registrations, cost.scale_calls) == (32, 2, 8, 8)
    servers = [p.server for p in points]
    assert servers == sorted(servers, key=repr)  # each server setting in one block
    assert "32 points, 2 server start(s), 8 registration(s), 8 live scale call(s)" in plan.describe(suite, points)


def test_run_ids_are_stable_and_name_the_target(tmp_path):
    path = write(tmp_path, f"targets: [jpeg]\ninputs: [{{images: ['{SAMPLES}']}}]\n")
    first = [p.run_id for p in plan.expand(load_suite(path))]
    second = [p.run_id for p in plan.expand(load_suite(path))]
    assert first == second and first[0].startswith("jpeg-")


def test_percentiles_come_from_the_recorded_latencies():
    latencies = [float(v) for v in range(1, 101)]  # 1..100 ms
    summary = latency_summary(latencies)
    assert summary["latency_mean_ms"] == pytest.approx(50.5)
    assert summary["latency_p50_ms"] == pytest.approx(50.5)
    assert summary["latency_p90_ms"] == pytest.approx(90.1)
    assert summary["latency_p99_ms"] == pytest.approx(99.01)
    assert summary["latency_max_ms"] == 100.0
    assert latency_summary([])["latency_p99_ms"] is None


def test_stability_needs_the_last_windows_to_agree():
    assert stable_tail([50, 80, 100, 102, 98], count=3, tolerance=0.05)
    assert not stable_tail([100, 102, 98, 120], count=3, tolerance=0.05)
    assert not stable_tail([100, 100], count=3, tolerance=0.05)  # too few windows
    assert spread([0, 0, 0]) == float("inf")
