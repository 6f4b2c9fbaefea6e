"""Core plans from a rule: cores in proportion to measured cost (`segserve pin --plan-from`)."""

import json
import os

import pytest

from segserve.cli import main
from segserve.errors import UsageError
from segserve.serving.cores import largest_remainder, load_plan, parse_cores, split_cores

AVAILABLE = sorted(os.sched_getaffinity(0))
needs_two_cores = pytest.mark.skipif(len(AVAILABLE) < 2, reason="needs 2 cores")


def test_cores_after_the_frontend_follow_cost_by_largest_remainder():
    # 7 cores at 3:1 → quotas 5.25 / 1.75 → 5 + 1, the one left goes to the larger remainder (jpeg)
    frontend, given = split_cores({"seg": 3.0, "jpeg": 1.0}, list(range(8)), frontend_cores=1)
    assert frontend == [0]
    assert given == {"jpeg": [1, 2], "seg": [3, 4, 5, 6, 7]}  # cheapest next to the frontend, disjoint, all used
    frontend, given = split_cores({"seg": 3.0, "jpeg": 1.0}, list(range(8)), frontend_cores=2)
    assert frontend == [0, 1] and {m: len(c) for m, c in given.items()} == {"jpeg": 1, "seg": 5}  # 4.5 / 1.5: tie → costlier


def test_every_model_gets_a_core_even_when_its_share_rounds_to_zero():
    assert largest_remainder([100.0, 1.0, 1.0], 4) == [2, 1, 1]
    assert largest_remainder([1.0, 1.0, 1.0], 3) == [1, 1, 1]
    _, given = split_cores({"seg": 50.0, "jpeg": 1.0}, list(range(4)), frontend_cores=1)
    assert given == {"jpeg": [1], "seg": [2, 3]}


def test_on_two_cores_the_frontend_shares_the_cheapest_models_core():
    assert split_cores({"seg_jpeg__seg": 11.3, "seg_jpeg__jpeg": 1.7}, [0, 1]) == (
        [0],
        {"seg_jpeg__jpeg": [0], "seg_jpeg__seg": [1]},
    )


def test_more_models_than_cores_is_refused():
    with pytest.raises(UsageError, match=r"1 core\(s\) \(3\) cannot give each of 2 models its own core"):
        split_cores({"seg": 2.0, "jpeg": 1.0}, [3])
    with pytest.raises(UsageError, match="--frontend-cores 3: only 2 core"):
        split_cores({"seg": 2.0, "jpeg": 1.0}, [0, 1], frontend_cores=3)
    with pytest.raises(UsageError, match="costs must be > 0"):
        split_cores({"seg": 0.0, "jpeg": 1.0}, [0, 1])


def test_cores_option_takes_a_count_or_a_list_of_available_cores():
    assert parse_cores(None) == AVAILABLE
    assert parse_cores("1") == AVAILABLE[:1]
    assert parse_cores(",".join(map(str, AVAILABLE))) == AVAILABLE
    with pytest.raises(UsageError, match="--cores 4096-4097: cores \\[4096, 4097\\] are not available here"):
        parse_cores("4096-4097")
    with pytest.raises(UsageError, match="not a count or a core list"):
        parse_cores("two")


def rows(seg_rps: float, jpeg_rps: float) -> list[dict]:
    return [
        {"run_id": "seg-a", "target": "seg", "throughput_rps": seg_rps, "requests_failed": 0, "error": None},
        {"run_id": "seg-b", "target": "seg", "throughput_rps": 999.0, "requests_failed": 3, "error": None},  # fails its constraint
        {"run_id": "seg-c", "target": "seg", "throughput_rps": 998.0, "requests_failed": 0, "error": "boom"},  # a failed run
        {"run_id": "jpeg-a", "target": "jpeg", "throughput_rps": jpeg_rps, "requests_failed": 0, "error": None},
        {"run_id": "wf-a", "target": "seg_jpeg", "throughput_rps": 40.0, "requests_failed": 0, "error": None},
    ]


@needs_two_cores
def test_pin_plan_from_writes_a_plan_the_loader_accepts(tmp_path, capsys):
    results = tmp_path / "results"
    results.mkdir()
    (results / "summary.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(seg_rps=60.0, jpeg_rps=300.0)))
    (results / "suite.yaml").write_text("targets: [seg, jpeg]\nconstraints:\n  requests_failed: {max: 0}\nobjective: throughput_rps\n")
    out = tmp_path / "plan.yaml"
    cores = f"{AVAILABLE[0]},{AVAILABLE[1]}"
    assert main(["pin", "--plan-from", str(results), "--cores", cores, "--out", str(out)]) == 0
    plan = load_plan(out)
    assert plan.frontend == [AVAILABLE[0]]
    assert {m: c.cores for m, c in plan.models.items()} == {"seg_jpeg__jpeg": [AVAILABLE[0]], "seg_jpeg__seg": [AVAILABLE[1]]}
    text = out.read_text()
    # the header says where the costs came from: the valid rows only, not the failing faster ones
    assert "seg run seg-a, 60.0 req/s → 16.67 ms" in text and "jpeg run jpeg-a, 300.0 req/s → 3.33 ms" in text
    assert "requests_failed ≤ 0 (from suite.yaml)" in text
    # a summary file works as well, printed when there is no --out
    capsys.readouterr()
    assert main(["pin", "--plan-from", str(results / "summary.jsonl"), "--cores", cores]) == 0
    assert capsys.readouterr().out == text.replace(str(results), str(results / "summary.jsonl"), 1)


def test_pin_plan_from_without_a_jpeg_row_or_summary_is_a_usage_error(tmp_path, capsys):
    summary = tmp_path / "summary.jsonl"
    summary.write_text(json.dumps(rows(60.0, 300.0)[0]) + "\n")
    assert main(["pin", "--plan-from", str(summary)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "no valid 'jpeg' row" in err and len(err.splitlines()) == 1
    assert main(["pin", "--plan-from", str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'nothing'}: no such file\n"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["pin", "--plan-from", str(empty)]) == 2  # a folder without summary.jsonl
    assert "no summary.jsonl here" in capsys.readouterr().err
