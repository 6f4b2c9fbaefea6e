"""`segserve bench replay`: strategies judged on a recorded grid, answered from its summary (no server)."""

import json
import textwrap

import pytest

from segserve.archives.catalog import Catalog
from segserve.bench.replay import replay
from segserve.bench.suite import plan as planning
from segserve.bench.suite.spec import load_suite
from segserve.cli import main
from segserve.errors import UsageError
from tests.conftest import ROOT

BATCHES = [1, 2, 4, 8, 16]
WORKERS = [1, 2, 3]


def write_suite(folder) -> None:
    (folder / "suite.yaml").write_text(
        textwrap.dedent(
            f"""
            targets: [seg, jpeg, seg_jpeg]
            inputs: [{{images: ["{ROOT / "samples" / "*.jpg"}"]}}]
            grid:
              archive: {{batch_size: {BATCHES}}}
              runtime: {{workers: {WORKERS}, seg_workers: {WORKERS}, jpeg_workers: {WORKERS}}}
              load: {{concurrency: [16]}}
            constraints: {{latency_p99_ms: {{max: 900}}}}
            """
        )
    )


def truth(point) -> tuple[float, float]:
    """(throughput, p99) of a point: seg best at batch 8 with 2 workers, jpeg flat; the pipeline 10% under the
    harmonic bound; three workers of seg break the latency constraint."""
    params = point.params
    seg = 60.0 - 6 * abs(BATCHES.index(params["batch_size"]) - 3) - 8 * abs(params.get("seg_workers", 1) - 2)
    jpeg = 400.0 - 20 * abs(params.get("jpeg_workers", 1) - 1)
    rps = {"seg": seg, "jpeg": jpeg}.get(point.target, 0.9 / (1 / seg + 1 / jpeg))
    p99 = 1000.0 if params.get("seg_workers") == 3 else 200.0
    return rps, p99


def write_recorded_grid(folder, drop: int = 0):
    """suite.yaml and summary.jsonl as a finished grid leaves them (drop: leave the last points out)."""
    folder.mkdir(parents=True, exist_ok=True)
    write_suite(folder)
    catalog = Catalog(ROOT)
    points = planning.expand(load_suite(folder / "suite.yaml", catalog), catalog)
    with open(folder / "summary.jsonl", "w") as f:
        for point in points[: len(points) - drop]:
            rps, p99 = truth(point)
            row = {"run_id": point.run_id, "point_key": point.key, "target": point.target, "throughput_rps": rps, "latency_p99_ms": p99}
            f.write(json.dumps({**row, **point.params}) + "\n")
    return points


def test_replay_scores_every_strategy_against_the_grids_best(tmp_path):
    points = write_recorded_grid(tmp_path / "rec")
    pipeline = [p for p in points if p.target == "seg_jpeg"]  # 45 candidates; seg and jpeg are auto's probes
    results = replay(tmp_path / "rec", Catalog(ROOT), ["grid", "random", "auto"], ["1.0", "0.2", "9"], seeds=3, log=lambda _: None)
    assert results["grid"]["1.0"] == {
        "median": 1.0, "worst": 1.0, "points": len(pipeline), "registrations": 5, "restarts": 1, "within_noise": 3, "seeds": 3
    }  # fmt: skip
    assert results["random"]["9"]["points"] == 9
    # the proposals' cost in the order proposed: random's sample is measured in the grid's order
    assert 1 <= results["random"]["9"]["registrations"] <= 5
    assert 0 < results["random"]["0.2"]["worst"] <= results["random"]["0.2"]["median"] <= 1.0
    # auto measures each member's base, the pipeline at its most workers, every value of one parameter at a time,
    # the rest of the members' design, then its best predictions
    assert {k: results["auto"]["1.0"][k] for k in ("median", "worst", "points")} == {"median": 1.0, "worst": 1.0, "points": len(pipeline)}
    assert results["auto"]["0.2"]["points"] == 9  # 4 of them members: their bases and, in half the budget, two more


def test_replay_prints_json_for_scripts(tmp_path, capsys):
    write_recorded_grid(tmp_path / "rec")
    code = main(["bench", "replay", str(tmp_path / "rec"), "--strategy", "random,optuna", "--budget", "0.2", "--seeds", "2", "--json"])
    printed = json.loads(capsys.readouterr().out)
    assert code == 0 and set(printed) == {"random", "optuna"}
    assert set(printed["optuna"]["0.2"]) >= {"median", "worst"} and 0 < printed["optuna"]["0.2"]["worst"] <= 1.0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--strategy", "bayes"], "--strategy 'bayes': one of grid, random, optuna, auto"),
        (["--budget", "400"], "more than the 45 points"),
        (["--budget", "a lot"], "give fractions of the grid"),
    ],
)
def test_replay_refuses_bad_input_in_one_line(tmp_path, capsys, args, message):
    write_recorded_grid(tmp_path / "rec")
    assert main(["bench", "replay", str(tmp_path / "rec"), "--seeds", "1", *args]) == 2
    assert message in capsys.readouterr().err


def test_replay_needs_a_complete_grid(tmp_path):
    write_recorded_grid(tmp_path / "rec", drop=3)
    with pytest.raises(UsageError, match="3 of the suite's 75 points are not in its summary"):
        replay(tmp_path / "rec", Catalog(ROOT), ["grid"], ["0.5"], seeds=1)


def test_a_found_point_inside_the_grid_bests_own_interval_counts_as_indistinguishable():
    from segserve.bench.replay import indistinguishable

    grid_best = {"run_id": "b", "throughput_rps": 40.0, "throughput_ci_low_rps": 37.0, "throughput_ci_high_rps": 43.0}
    assert indistinguishable({"run_id": "x", "throughput_rps": 37.5}, grid_best, "throughput_rps", True)
    assert not indistinguishable({"run_id": "y", "throughput_rps": 36.0}, grid_best, "throughput_rps", True)
    assert not indistinguishable({"run_id": "z", "latency_p99_ms": 9.0}, {"run_id": "b", "latency_p99_ms": 8.0}, "latency_p99_ms", False)
    assert indistinguishable(grid_best, grid_best, "throughput_rps", True)
