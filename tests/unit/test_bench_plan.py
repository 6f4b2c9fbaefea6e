"""Suite validation, grid expansion, restart/re-register planning and the statistics rules."""

import textwrap

import pytest

from segserve.archives.catalog import Catalog
from segserve.bench.results.stats import latency_summary, spread, stable_tail
from segserve.bench.suite import plan
from segserve.bench.suite.spec import load_suite
from segserve.cli import main
from segserve.errors import UsageError
from tests.conftest import ROOT


def write(tmp_path, text: str, name: str = "suite.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


SAMPLES = str(ROOT / "samples" / "*.jpg")
CATALOG = Catalog(ROOT)


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
        "targets.1: unknown target 'segjpeg' — did you mean 'seg_jpeg'?",
        "inputs.1.raw.dtype: Input should be 'float16', 'float32' or 'bfloat16' (got 'float8') — did you mean 'float32'?",
        "inputs.2: give exactly one of 'images', 'files', 'raw', 'tensor', 'json_template', 'multipart' or 'synthetic'",
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
        load_suite(path, CATALOG)


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
    points = plan.expand(load_suite(path, CATALOG), CATALOG)
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
    suite = load_suite(path, CATALOG)
    points = plan.expand(suite, CATALOG)
    cost = plan.cost(suite, points)
    # 2 server settings; per setting 2 targets × 2 batch sizes registrations; per registration 1 live scale (workers 1 → 2).
    assert (cost.points, cost.restarts, cost.registrations, cost.scale_calls) == (32, 2, 8, 8)
    servers = [p.server for p in points]
    assert servers == sorted(servers, key=repr)  # each server setting in one block
    assert "32 points, 2 server start(s), 8 registration(s), 8 live scale call(s)" in plan.describe(suite, points)


def test_run_ids_are_stable_and_name_the_target(tmp_path):
    path = write(tmp_path, f"targets: [jpeg]\ninputs: [{{images: ['{SAMPLES}']}}]\n")
    first = [p.run_id for p in plan.expand(load_suite(path, CATALOG), CATALOG)]
    second = [p.run_id for p in plan.expand(load_suite(path, CATALOG), CATALOG)]
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


def test_a_node_can_batch_differently_and_stage_settings_go_to_the_worker_that_runs_them(tmp_path):
    path = write(
        tmp_path,
        f"""
        targets: [seg_jpeg, seg_jpeg_fused]
        inputs: [{{images: ["{SAMPLES}"]}}]
        grid:
          archive:
            batch_size: [8]
            encode_threads: [1, 2]
            threads: [1]
            nodes: {{jpeg: {{batch_size: [16, 32], jpeg_quality: [70]}}}}
        """,
    )
    suite = load_suite(path, CATALOG)
    points = plan.expand(suite, CATALOG)
    workflow = [p for p in points if p.target == "seg_jpeg"]
    fused = [p for p in points if p.target == "seg_jpeg_fused"]
    assert len(workflow) == 4 and {p.params["jpeg_batch_size"] for p in workflow} == {16, 32}
    assert len(fused) == 2 and all("jpeg_batch_size" not in p.params for p in fused)  # one worker, one batch
    point = next(p for p in workflow if p.params["jpeg_batch_size"] == 32 and p.params["encode_threads"] == 2)
    nodes, stage, registration = plan.settings_for(point, CATALOG.targets["seg_jpeg"])
    assert registration == {"seg": {"batch-size": 8, "max-batch-delay": 5}, "jpeg": {"batch-size": 32, "max-batch-delay": 5}}
    assert nodes["jpeg"] == {"quality": 70, "encode_threads": 2, "threads": 1} and nodes["seg"]["encode_threads"] == 2
    assert stage == {}
    point = next(p for p in fused if p.params["encode_threads"] == 2)
    nodes, stage, registration = plan.settings_for(point, CATALOG.targets["seg_jpeg_fused"])
    assert stage == {"encode_threads": 2, "threads": 1}  # the fused worker's stages, not its nodes'
    assert nodes["jpeg"] == {"quality": 70} and "encode_threads" not in nodes["seg"]


def test_unknown_nodes_and_parameters_an_http_target_cannot_take_are_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("NO_SUCH_TOKEN", raising=False)
    path = write(
        tmp_path,
        f"""
        targets:
          - seg_jpeg
          - name: stock
            url: http://127.0.0.1:1/predictions/x
            headers: {{Authorization: "Bearer ${{NO_SUCH_TOKEN}}"}}
        inputs: [{{images: ["{SAMPLES}"]}}]
        grid:
          archive: {{batch_size: [1, 8], nodes: {{jpg: {{batch_size: [4]}}, seg: {{jpeg_quality: [70]}}}}}}
          runtime: {{sge_workers: [2]}}
        """,
    )
    with pytest.raises(UsageError) as error:
        load_suite(path, CATALOG)
    lines = str(error.value).splitlines()
    assert any("grid.archive.nodes.jpg: unknown DAG node 'jpg' — did you mean 'jpeg'?" in line for line in lines)
    assert any("grid.runtime.sge_workers: unknown node 'sge' — did you mean 'seg'?" in line for line in lines)
    assert any("targets.stock.headers.Authorization: environment variable 'NO_SUCH_TOKEN' is not set" in line for line in lines)
    assert any("grid.archive.nodes.seg.jpeg_quality: applies to no target here" in line for line in lines)
    assert any("swept here: batch_size, nodes.jpg, nodes.seg" in line for line in lines)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("https://127.0.0.1:8443/x", "speaks plain HTTP"),
        ("http://10.1.2.3:8080/x", "loopback only"),
        ("http://127.0.0.1:abc/x", "port is not a number"),
    ],
)
def test_an_http_target_url_must_be_plain_http_on_loopback(tmp_path, url, message):
    path = write(tmp_path, f"targets: [{{name: other, url: '{url}'}}]\ninputs: [{{images: ['{SAMPLES}']}}]\n")
    with pytest.raises(UsageError, match=message):
        load_suite(path, CATALOG)


def test_an_http_target_is_measured_at_each_load_point_with_its_headers_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("STOCK_TOKEN", "s3cret")
    path = write(
        tmp_path,
        f"""
        targets:
          - seg
          - name: stock
            url: http://127.0.0.1:1/predictions/x
            headers: {{Authorization: "Bearer ${{STOCK_TOKEN}}", X-Price: "$5 ${{STOCK_TOKEN}}$"}}
        inputs: [{{images: ["{SAMPLES}"]}}]
        grid: {{load: {{concurrency: [1, 4]}}}}
        """,
    )
    suite = load_suite(path, CATALOG)
    assert suite.http_targets["stock"].headers == {"Authorization": "Bearer s3cret", "X-Price": "$5 s3cret$"}
    points = plan.expand(suite, CATALOG)
    stock = [p for p in points if p.target == "stock"]
    assert [p.params for p in stock] == [{"concurrency": 1}, {"concurrency": 4}]
    assert plan.cost(suite, points).restarts == 1  # only for seg


def test_a_run_id_changes_with_the_load_settings_the_inputs_and_the_recipe(tmp_path):
    from segserve.bench.run.suite_inputs import SuiteInputs

    weights = tmp_path / "seg.pt"
    weights.write_bytes(b"weights")
    first = write(tmp_path, f"targets: [seg_jpeg]\ninputs: [{{images: ['{SAMPLES}']}}]\nload: {{window_s: 2}}\n")
    ids = lambda suite: [p.run_id for p in plan.expand(suite, CATALOG, SuiteInputs(suite, CATALOG, weights).digests())]  # noqa: E731
    keys = lambda suite: [p.key for p in plan.expand(suite, CATALOG)]  # noqa: E731
    base = load_suite(first, CATALOG)
    other_load = load_suite(write(tmp_path, first.read_text().replace("window_s: 2", "window_s: 3"), "b.yaml"), CATALOG)
    one_input = load_suite(write(tmp_path, first.read_text().replace("*.jpg", "shapes_0.jpg"), "c.yaml"), CATALOG)
    assert keys(base) == keys(other_load) == keys(one_input)  # the same place in the space …
    assert len({ids(base)[0], ids(other_load)[0], ids(one_input)[0]}) == 3  # … measured three ways
    before = ids(base)
    assert ids(base) == before  # stable
    inputs = {name: SuiteInputs(base, CATALOG, weights).parts(name)["inputs"] for name in ("seg", "jpeg")}
    weights.write_bytes(b"other weights")  # the archive recipe carries the weights
    assert ids(base) != before
    after = {name: SuiteInputs(base, CATALOG, weights).parts(name)["inputs"] for name in ("seg", "jpeg")}
    assert after["seg"] == inputs["seg"] and after["jpeg"] != inputs["jpeg"]  # jpeg's inputs are the model's class maps


def test_the_throughput_interval_comes_from_the_windows():
    from segserve.bench.results.stats import mean_interval

    low, high = mean_interval([100.0, 102.0, 98.0])
    assert low == pytest.approx(95.03, abs=0.01) and high == pytest.approx(104.97, abs=0.01)  # t(0.975, 2) = 4.303
    assert mean_interval([50.0, 50.0]) == (50.0, 50.0) and mean_interval([1.0]) is None


def test_dry_run_prints_the_search_space_and_its_budget(tmp_path, capsys):
    search_suite = f"""
        targets: [seg, jpeg, seg_jpeg]
        inputs: [{{images: ["{SAMPLES}"]}}]
        grid: {{archive: {{batch_size: [1, 4, 8, 16]}}, runtime: {{workers: [1, 2]}}, load: {{concurrency: [4, 16]}}}}
        search: {{strategy: optuna, budget: {{fraction: 0.25}}, seed: 3}}
        """
    assert main(["bench", str(write(tmp_path, search_suite)), "--dry-run"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    # seg_jpeg: 4 batch sizes × 2 workers (the same for both nodes) × 2 loads; seg and jpeg are auto's probes
    assert last.startswith("search: optuna (seed 3) over 16 candidate points (jpeg, seg alone: measured only by auto")
    assert last.endswith("budget 4 points (25%)")


@pytest.mark.parametrize(
    ("search", "message"),
    [
        ("{strategy: optuna, budget: {points: 17}}", "search.budget.points: 17 is more than the 16 points of the space"),
        ("{strategy: bayes}", "search.strategy: Input should be 'grid', 'random', 'optuna' or 'auto' (got 'bayes')"),
        ("{budget: {points: 3, minutes: 2}}", "search.budget: give exactly one of points, fraction or minutes (got points, minutes)"),
        ("{objectives: [throughput_rps, latency_p99]}", "unknown metric 'latency_p99' — did you mean 'latency_p99_ms'?"),
    ],
)
def test_bad_search_sections_are_refused_in_one_line(tmp_path, capsys, search, message):
    text = f"""
        targets: [seg, jpeg, seg_jpeg]
        inputs: [{{images: ["{SAMPLES}"]}}]
        grid: {{archive: {{batch_size: [1, 4, 8, 16]}}, runtime: {{workers: [1, 2]}}, load: {{concurrency: [4, 16]}}}}
        search: {search}
        """
    assert main(["bench", str(write(tmp_path, text)), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_the_bare_forwards_length_is_the_suites_and_leaves_run_ids_alone(tmp_path, monkeypatch):
    """load.bare_forward_s: the end-of-suite bare forward measures that long per shape; it changes no served
    measurement, so a suite that only shortens it keeps its run ids (resume and compare still match)."""
    from segserve.bench.run import baselines
    from segserve.bench.run.suite_run import plan_points
    from segserve.bench.suite.spec import LoadSettings

    asked = []
    monkeypatch.setattr(baselines, "run_bare", lambda weights, threads, shapes, **kw: asked.append(kw["seconds"]) or [])
    records = [{"target": "seg", "batch_size": 4, "omp_num_threads": 2}]
    baselines.bare_throughputs(records, ROOT / "weights" / "seg.pt", lambda target: "seg", lambda _: None, LoadSettings(bare_forward_s=0.6))
    baselines.bare_throughputs(records, ROOT / "weights" / "seg.pt", lambda target: "seg", lambda _: None, LoadSettings())
    assert asked == [0.6, 6.0]

    suite = f"targets: [seg]\ninputs: [{{images: ['{SAMPLES}']}}]\nload: {{warmup_s: 0.5EXTRA}}\n"
    ids = []
    for extra in ("", ", bare_forward_s: 0.6", ", window_s: 2.0"):
        spec = load_suite(write(tmp_path, suite.replace("EXTRA", extra)), CATALOG)
        ids.append([p.run_id for p in plan_points(spec, CATALOG, ROOT / "weights" / "seg.pt")])
    assert ids[0] == ids[1] != ids[2]  # a served load setting does change them


def test_points_whose_threads_times_workers_exceed_the_cores_are_named_before_measuring(tmp_path):
    from segserve.bench.run.suite_run import oversubscribed

    path = tmp_path / "suite.yaml"
    path.write_text(
        textwrap.dedent(f"""
        targets: [seg_jpeg_fused, seg_jpeg]
        inputs: [{{images: ["{SAMPLES}"]}}]
        grid:
          archive: {{batch_size: [4], threads: [0, 2]}}
          runtime: {{workers: [1, 2], seg_workers: [1, 2], jpeg_workers: [1]}}
        """)
    )
    suite = load_suite(path, CATALOG)
    points = plan.expand(suite, CATALOG)
    over = {(p.target, threads, workers) for _, threads, workers in oversubscribed(points, CATALOG, 2) for p in points if p.run_id == _}
    # threads 2 with 2 workers of the seg node (the fused model's, the workflow's seg node) on 2 cores; threads 0 never
    assert over == {("seg_jpeg_fused", 2, 2), ("seg_jpeg", 2, 2)}
    assert oversubscribed(points, CATALOG, 4) == []


def test_rounds_reverse_the_points_every_other_round_and_alternate_two_sides():
    from segserve.bench.run.rounds import round_schedule

    assert [(i, p) for i, p, _ in round_schedule(["x", "y", "z"], 3)] == [
        (0, "x"), (0, "y"), (0, "z"), (1, "z"), (1, "y"), (1, "x"), (2, "x"), (2, "y"), (2, "z"),
    ]  # fmt: skip
    ab = [f"{p}{s}" for _, p, s in round_schedule(["x", "y"], 2, ("a", "b"))]
    assert ab == ["xa", "xb", "yb", "ya", "ya", "yb", "xb", "xa"]  # each point's sides in turn, flipped next round
    one = [s for _, _, s in round_schedule(["x"], 4, ("a", "b"))]
    assert one == ["a", "b", "b", "a", "a", "b", "b", "a"]  # one point: bench ab's A B, B A, … as before


def test_the_record_type_declares_every_base_column_and_a_records_own_keys():
    from segserve.bench.run.point import record_for
    from segserve.bench.suite.columns import BASE_COLUMNS, Record

    declared = set(Record.__annotations__)
    assert set(BASE_COLUMNS) <= declared  # the type and the summary's first columns stay in step
    point = plan.Point("seg", (), (("batch_size", 4),), (("workers", 2),), (("concurrency", 8),))
    record = record_for(point, 1.23456, {"throughput_rps": 10.0}, None)
    assert {"run_id", "target", "point_key", "reconfigure_s", "error"} <= set(record) <= declared  # these params are base columns
    assert isinstance(record["run_id"], str) and record["reconfigure_s"] == 1.235 and record["batch_size"] == 4
