"""Time-varying load in a suite (#16): load.phases, autoscaled points beside the static splits, their tables;
and one short run on a real TorchServe."""

import textwrap

import pytest

from segserve.archives.catalog import Catalog
from segserve.autoscale.loop import reactions
from segserve.bench.results.analysis import autoscaler_vs_static, phase_table
from segserve.bench.run.inputs import request_bodies
from segserve.bench.suite import plan
from segserve.bench.suite.spec import load_suite
from segserve.errors import UsageError
from tests.conftest import ROOT

SAMPLES = str(ROOT / "samples" / "*.jpg")
CATALOG = Catalog(ROOT)


def suite_file(tmp_path, body: str, name: str = "phases.yaml"):
    path = tmp_path / name
    path.write_text(f'targets: [seg_jpeg]\ninputs:\n  - images: ["{SAMPLES}"]\n' + textwrap.dedent(body))
    return path


def test_phases_and_autoscaled_points_expand_and_cost_their_phases(tmp_path):
    path = suite_file(
        tmp_path,
        """
        grid:
          runtime: {seg_workers: [1, 2], jpeg_workers: [1, 2], autoscale: [false, true]}
        load:
          warmup_s: 1
          phases:
            - {name: small, duration_s: 30}
            - {name: large, duration_s: 20, concurrency: 4, inputs: [{synthetic: {height: 64, width: 96, count: 2}}]}
        """,
    )
    suite = load_suite(path, CATALOG)
    points = plan.expand(suite, CATALOG)
    splits = sorted((p.workers["seg"], p.workers["jpeg"], p.autoscaled) for p in points)
    # one worker per node leaves the autoscaler nothing to move: no autoscaled 1·1 point
    assert splits == [(1, 1, False), (1, 2, False), (1, 2, True), (2, 1, False), (2, 1, True), (2, 2, False), (2, 2, True)]
    cost = plan.cost(suite, points)
    assert cost.estimate_min_s == cost.estimate_max_s >= 7 * (30 + 20 + 1)
    large = request_bodies(suite.load.phases[1].inputs)
    assert len(large) == 2 and all(body[:2] == b"\xff\xd8" for body in large)  # JPEGs


@pytest.mark.parametrize(
    ("load", "message"),
    [
        ("phases: [{name: a, duration_s: 5}, {name: a, duration_s: 5}]", "a phase name is given twice"),
        ("phases: [{name: a, duration_s: 5, concurrency: 2, request_rate_rps: 3}]", "give at most one of 'concurrency'"),
        ("phases: [{name: a, duration_s: 0}]", "load.phases.0.duration_s: Input should be greater than 0"),
        ("phases: [{name: a b, duration_s: 5}]", "load.phases.0.name: String should match pattern"),
        ("phases: [{name: a, duration_s: 5, inputs: [{synthetic: {height: 4}}]}]", "synthetic.height: Input should be greater"),
        ("phases: [{name: a, duration_s: 5, input: []}]", "load.phases.0.input: unknown key — did you mean 'inputs'?"),
    ],
)
def test_a_bad_phase_is_one_clear_line(tmp_path, load, message):
    path = suite_file(tmp_path, f"load:\n  {load}\n")
    with pytest.raises(UsageError) as error:
        load_suite(path, CATALOG)
    assert message in str(error.value) and len(str(error.value).splitlines()) == 1, str(error.value)


def record(seg: int, jpeg: int, small: float, large: float, autoscale: bool = False) -> dict:
    phases = [
        {"phase": "small", "throughput_rps": small, "latency_p99_ms": 100.0, "started_epoch_s": 0.0, "moves": [], "reaction_s": None},
        {"phase": "large", "throughput_rps": large, "latency_p99_ms": 300.0, "started_epoch_s": 30.0, "moves": [], "reaction_s": None},
    ]
    return {
        "run_id": f"r{seg}{jpeg}{autoscale}",
        "target": "seg_jpeg",
        "seg_workers": seg,
        "jpeg_workers": jpeg,
        "autoscale": autoscale,
        "phases": phases,
        "throughput_rps": (small + large) / 2,
        "latency_p99_ms": 300.0,
        "requests_failed": 0,
        "error": None,
    }


def test_the_autoscaler_is_compared_with_the_best_static_split_of_its_budget_in_each_phase():
    records = [record(2, 1, 60, 20), record(1, 2, 40, 35), record(2, 2, 90, 90), record(2, 1, 58, 33, autoscale=True)]
    rows = {row["phase"]: row for row in autoscaler_vs_static(records)}
    assert rows["small"]["best_static"] == "jpeg 1 · seg 2" and rows["small"]["ratio"] == pytest.approx(58 / 60)
    assert rows["large"]["best_static"] == "jpeg 2 · seg 1" and rows["large"]["ratio"] == pytest.approx(33 / 35)
    # 2·2 has four workers: not the autoscaler's budget of three, so not beside it
    assert rows["overall"]["best_static_rps"] == 40 and rows["overall"]["ahead_of_every_static"] is True
    table = phase_table(records)
    assert [row["split"] for row in table][-1] == "jpeg 1 · seg 2 → autoscaled"
    assert table[0]["small_rps"] == 60 and table[0]["large_p99_ms"] == 300 and "moves" not in table[0]


def test_reaction_is_timed_from_the_phase_start_to_its_first_applied_move():
    phases = [{"started_epoch_s": 100.0}, {"started_epoch_s": 160.0}]
    decisions = [
        {"epoch_s": 105.0, "applied": False, "move": [["seg", 2]]},
        {"epoch_s": 120.0, "applied": True, "move": [["seg", 2]], "move_s": 3.0},
        {"epoch_s": 171.5, "applied": True, "move": [["jpeg", 2], ["seg", 1]], "move_s": 4.0},
        {"epoch_s": 190.0, "applied": True, "move": [["jpeg", 3]]},
    ]
    small, large = reactions(phases, decisions)
    assert small == {"moves": [["seg", 2]], "reaction_s": 20.0, "move_s": 3.0}
    assert large == {"moves": [["jpeg", 2], ["seg", 1], ["jpeg", 3]], "reaction_s": 11.5, "move_s": 4.0}
    assert reactions(phases, [])[1]["reaction_s"] is None
