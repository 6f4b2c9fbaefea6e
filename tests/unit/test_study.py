"""A study shared by several searches (as bench processes share one through --storage), the heartbeat hand-over,
the pruner, `bench collect`, and storage errors. Real Optuna storages (journal file, SQLite); no server."""

import json
import textwrap
import time

import pytest

from segserve.archives.catalog import Catalog
from segserve.bench.run.point import record_for
from segserve.bench.run.suite_run import CollectRun, collect
from segserve.bench.search import make_strategy, study
from segserve.bench.suite import plan as planning
from segserve.bench.suite.spec import Budget, SearchSettings, load_suite
from segserve.cli import main
from tests.conftest import ROOT
from tests.unit.test_search import record, space


def shared(storage, seed: int, points=None, limit: int = 24, name: str = "shared"):
    # TPE: the GP sampler refits for every suggestion, and a shared study answers many of them from records
    return make_strategy(
        SearchSettings(strategy="optuna", budget=Budget(points=limit), seed=seed, sampler="tpe"),
        points or space(),
        storage=storage,
        study_name=name,
    )


def test_two_searches_on_one_study_never_measure_a_point_twice(tmp_path):
    """Two searches (two processes' worth) ask in turn, each measuring what it proposes: no point is measured by
    both, a point one measured is answered to the other from its record, and together they keep to the budget."""
    storage = study.open_storage(str(tmp_path / "study.log"), None)
    a, b = shared(storage, 0), shared(storage, 0)  # the same seed: the second is offset by the trials it finds
    measured: dict[str, list[str]] = {"a": [], "b": []}
    searches = {"a": a, "b": b}
    active = dict(searches)
    while active:
        for who, search in list(active.items()):
            point = search.ask()
            if point is None:
                del active[who]
                continue
            measured[who].append(point.run_id)
            search.tell(point, record(point))
    both = measured["a"] + measured["b"]
    assert measured["a"] and measured["b"]
    assert len(both) == len(set(both)), "a point was measured twice"
    assert len(both) <= 24
    records = study.study_records(a.study)
    assert sorted(r["run_id"] for r in records) == sorted(both)  # every measured record is in the study, once


def test_a_point_claimed_by_another_search_is_left_to_it(tmp_path):
    storage = study.open_storage(str(tmp_path / "study.log"), None)
    points = space()[:3]
    a = shared(storage, 0, points, limit=3)
    first = a.ask()  # claimed, being measured
    b = shared(storage, 1, points, limit=3)
    proposed = []
    while (p := b.ask()) is not None:
        proposed.append(p.run_id)
        b.tell(p, record(p))
    assert first.run_id not in proposed
    a.tell(first, record(first))
    assert sorted(r["run_id"] for r in study.study_records(a.study)) == sorted([first.run_id, *proposed])


def test_two_searches_that_each_took_the_last_slot_keep_only_the_earlier_claim(tmp_path):
    """b looked at the study while the budget had room, then a asked and claimed the last slot before b claimed
    another point: b leaves its point (5 points of a budget of 4 were measured by two bench processes so)."""
    storage = study.open_storage(str(tmp_path / "study.log"), None)
    points = space()[:4]
    a, b = shared(storage, 0, points, limit=1), shared(storage, 1, points, limit=1)
    first = a.ask()
    other = next(p for p in points if p.run_id != first.run_id)
    b.study.enqueue_trial(b.space.trial_params(other))  # b's trial is asked after a's: later in the study's order
    trial = b.ask_trial()
    b.waiting[other.run_id] = [trial]
    assert b.claim({other.run_id: other}) == []
    assert b.ask() is None  # and the budget is spent for it
    a.tell(first, record(first))
    assert [r["run_id"] for r in study.study_records(a.study)] == [first.run_id]


def test_the_pruner_stops_a_point_below_the_median_of_the_finished_ones():
    search = make_strategy(SearchSettings(strategy="optuna", budget=Budget(points=30), seed=0, sampler="tpe"), space())
    for rate in (100.0, 90.0, 80.0, 70.0, 60.0):
        point = search.ask()
        check = search.pruner_for(point)
        assert check([rate]) is False and check([rate, rate]) is False  # fewer than 5 finished points: not judged
        search.tell(point, {**record(point), "throughput_rps": rate})
    point = search.ask()
    check = search.pruner_for(point)
    assert check([10.0]) is False  # the first window is a warm-up step: never judged
    assert check([10.0, 12.0]) is True
    search.tell(point, {**record(point), "throughput_rps": 11.0, "pruned": True})
    states = [t.state.name for t in search.study.get_trials(deepcopy=False)]
    assert states.count("PRUNED") == 1 and states.count("COMPLETE") == 5
    fine = search.ask()
    assert search.pruner_for(fine)([95.0, 96.0]) is False


def test_two_objectives_have_no_pruner():
    search = make_strategy(
        SearchSettings(strategy="optuna", budget=Budget(points=10)), space(), objectives=["throughput_rps", "latency_p99_ms"]
    )
    assert search.pruner_for(search.ask()) is None


def suite_file(tmp_path, strategy: str = "optuna"):
    path = tmp_path / "tiny.yaml"
    path.write_text(
        textwrap.dedent(
            f"""
            name: tiny
            targets: [seg_jpeg_fused]
            inputs: [{{images: ["{ROOT / "samples" / "shapes_0.jpg"}"]}}]
            grid:
              archive: {{batch_size: [1, 2, 4]}}
              runtime: {{workers: [1, 2]}}
            constraints: {{requests_failed: {{max: 0}}}}
            search: {{strategy: {strategy}, budget: {{points: 4}}, seed: 3}}
            """
        )
    )
    return path


def test_collect_writes_one_result_folder_from_the_study(tmp_path):
    """Two searches on a journal fill a study as two bench processes would; collect writes summary, report, runs."""
    catalog = Catalog(ROOT)
    path = suite_file(tmp_path)
    suite = load_suite(path, catalog)
    points = planning.expand(suite, catalog)
    storage = study.open_storage(str(tmp_path / "study.log"), None)
    searches = [
        make_strategy(SearchSettings(strategy="optuna", budget=suite.search.budget, seed=s), points, storage=storage, study_name="tiny")
        for s in (0, 1)
    ]
    study.save_suite(searches[0].study, path)
    for who, search in enumerate(searches):
        while (point := search.ask()) is not None:
            metrics = {"throughput_rps": 10.0 * point.params["batch_size"] + point.params["workers"], "requests_failed": 0}
            rec = {**record_for(point, 0.1, {**metrics, "latency_p99_ms": 50.0}, None), "measured_by": f"host:{who}"}
            search.tell(point, rec)
    out = collect(CollectRun("tiny", str(tmp_path / "study.log"), catalog, tmp_path / "results"), log=lambda _: None)
    rows = [json.loads(line) for line in (out / "summary.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and len({r["run_id"] for r in rows}) == 4
    assert len(list((out / "runs").glob("*.json"))) == 4
    report = (out / "report.md").read_text()
    assert "0 point(s) measured twice" in report and "`host:0`" in report
    assert (out / "suite.yaml").read_text() == path.read_text()


def test_collect_of_a_folder_without_a_study_is_refused(tmp_path, capsys):
    assert main(["bench", "collect", str(tmp_path)]) == 2
    assert "neither a result folder with a study.log" in capsys.readouterr().err


def test_an_unreachable_database_fails_before_any_server_and_hides_its_password(tmp_path, capsys):
    weights = tmp_path / "w.pt"
    weights.write_bytes(b"not used")
    url = "postgresql://bench:s3cret-pw@127.0.0.1:1/studies"
    started = time.monotonic()
    code = main(["bench", str(suite_file(tmp_path)), "--storage", url, "--weights", str(weights), "--results", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2
    assert "postgresql://bench:***@127.0.0.1:1/studies" in err and "s3cret-pw" not in err
    assert not (tmp_path / "r").exists()  # nothing measured, no result folder
    assert time.monotonic() - started < 30


def test_storage_is_only_for_an_optuna_search(tmp_path, capsys):
    weights = tmp_path / "w.pt"
    weights.write_bytes(b"not used")
    args = ["bench", str(suite_file(tmp_path, "random")), "--storage", str(tmp_path / "s.log"), "--weights", str(weights)]
    assert main([*args, "--dry-run"]) == 2
    assert "only an optuna search" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:pw@db.example:5432/x", "postgresql://u:***@db.example:5432/x"),
        ("sqlite:///tmp/a.db", "sqlite:///tmp/a.db"),
        ("results/study.log", "results/study.log"),
    ],
)
def test_urls_are_shown_without_their_password(url, shown):
    assert study.display_url(url) == shown
