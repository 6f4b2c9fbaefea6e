"""The autoscaler on a user's own workflow (#28): samples from TorchServe's counters alone (no handler counters, no
request count for a workflow node) and the rules on them. No server, no timing."""

import json
import zipfile

import pytest

from segserve.archives.foreign import read_archive
from segserve.autoscale.loop import Autoscaler, samples_between, war_bounds
from segserve.autoscale.rules import TORCHSERVE, Bounds, NodeSample, Policy, decide, load_cores, mix_of, pipeline_rps
from segserve.errors import UsageError
from tests.unit.test_autoscale import FakeServer

FAST, SLOW = "flow__fast", "flow__slow"


def read(time_s, queue_us, inference_us, cpu, batch=None):
    """One Meter read: TorchServe's cumulative µs per node (no Segserve* counters), one worker each."""
    counters = {}
    for model, queue, inference in zip((FAST, SLOW), queue_us, inference_us, strict=True):
        counters[("ts_queue_latency_microseconds", model)] = queue
        counters[("ts_inference_latency_microseconds", model)] = inference
    return {"time": time_s, "counters": counters, "workers": {FAST: [1], SLOW: [2]}, "cpu": cpu, "batch": batch or {}}


def test_without_handler_counters_a_sample_says_what_torchserve_saw_and_nothing_it_did_not():
    before = read(0.0, (0, 0), (0, 0), {1: 0.0, 2: 0.0})
    # 4 s: fast served its requests at once (0.2 s in all), slow kept its one worker busy and 12 s of requests waited
    after = read(4.0, (40_000, 12_000_000), (240_000, 15_960_000), {1: 0.1, 2: 0.04}, batch={SLOW: 1})
    fast, slow = samples_between(before, after, [FAST, SLOW])
    assert slow == NodeSample(
        SLOW, 1, 0.01, None, None, None, {}, source=TORCHSERVE, busy_workers=0.99, waiting_batches=3.0
    )  # per-request times, req/s and stages are unknown, not zero
    assert fast.source == TORCHSERVE and fast.busy_workers == 0.05 and fast.waiting_batches == 0.01
    # a node that sleeps uses no CPU: its load is its busy worker, four times over for what waits
    assert load_cores(slow) == pytest.approx(0.99 * (1 + 3.0 / 0.99))
    assert pipeline_rps([fast, slow]) is None  # TorchServe counts no workflow node's requests
    assert mix_of([fast, slow])[SLOW] == pytest.approx(0.99 / 1.04)


def test_a_batched_node_counts_its_busy_workers_not_its_requests_in_service():
    before = read(0.0, (0, 0), (0, 0), {1: 0.0, 2: 0.0})
    after = read(2.0, (0, 0), (0, 16_000_000), {1: 0.0, 2: 1.0}, batch={SLOW: 8})  # 8 requests at a time for 2 s
    _, slow = samples_between(before, after, [FAST, SLOW])
    assert slow.busy_workers == 1.0


def sleeping(fast, slow, waiting=3.0):
    """The slow node holds its workers with little CPU, and requests wait for it."""
    return [
        NodeSample(FAST, fast, 0.05, None, None, None, source=TORCHSERVE, busy_workers=0.05, waiting_batches=0.0),
        NodeSample(SLOW, slow, 0.02, None, None, None, source=TORCHSERVE, busy_workers=0.99 * slow, waiting_batches=waiting),
    ]


BOUNDS = {FAST: Bounds(1, 2), SLOW: Bounds(1, 2)}


def test_the_slow_node_takes_a_worker_from_torchserves_numbers_and_a_node_that_keeps_up_does_not():
    decision = decide(sleeping(1, 1), BOUNDS, Policy(budget_workers=3), 0.0, None)
    assert decision.steps == [(SLOW, 2)] and decision.reason.startswith(f"{SLOW} takes a worker: ")
    assert "its requests wait 303% of their busy time" in decision.reason
    calm = decide(sleeping(1, 1, waiting=0.1), BOUNDS, Policy(budget_workers=3, hysteresis=0.2), 0.0, None)
    assert calm.steps == [] and calm.reason == f"holding: {SLOW} is keeping up (its requests wait 10% of their busy time < 20%)"


def test_a_move_without_a_request_count_is_kept_not_judged(tmp_path, monkeypatch):
    monkeypatch.setattr("segserve.autoscale.loop.scrape", lambda url: {})
    server = FakeServer({FAST: 1, SLOW: 1})
    scaler = Autoscaler(server, BOUNDS, Policy(budget_workers=3, min_interval_s=0), tmp_path)
    monkeypatch.setattr(scaler.meter, "samples", lambda: sleeping(server.workers[FAST], server.workers[SLOW]))
    moved = scaler.step()
    assert moved["applied"] and moved["move"] == [(SLOW, 2)] and scaler.trial is None  # nothing to judge it on
    after = scaler.step()
    assert after["move"] == [] and not after["why"].startswith("undoing") and server.workers == {FAST: 1, SLOW: 2}
    logged = [json.loads(line) for line in (tmp_path / "autoscale.jsonl").read_text().splitlines()]
    assert logged[0]["metrics"][1]["source"] == "torchserve" and logged[0]["metrics"][1]["served_rps"] is None


def war(folder, spec: str):
    path = folder / "flow.war"
    with zipfile.ZipFile(path, "w") as archive:
        manifest = {"workflowName": "flow", "specFile": "flow.yaml", "handler": "functions.py"}
        archive.writestr("WAR-INF/MANIFEST.json", json.dumps({"workflow": manifest}))
        archive.writestr("flow.yaml", spec)
        archive.writestr("functions.py", "def log(data, context):\n    return data\n")
    return path


def test_a_wars_spec_gives_each_model_nodes_bounds_by_its_registered_name(tmp_path):
    spec = """
models:
  min-workers: 1
  max-workers: 1
  fast: {url: fast.mar}
  slow: {url: slow.mar, min-workers: 1, max-workers: 3}
dag:
  fast: [slow, log]
"""
    archive = read_archive("flow", str(war(tmp_path, spec)), None)
    # the top-level min/max are TorchServe's start-up values; a node's own entry bounds it; `log` is a function node
    assert war_bounds(archive) == {FAST: Bounds(1, 64), SLOW: Bounds(1, 3)}
    assert war_bounds(archive, "other") == {"other__fast": Bounds(1, 64), "other__slow": Bounds(1, 3)}
    (tmp_path / "bad.war").write_bytes(b"not a zip")
    with pytest.raises(UsageError, match="not a workflow archive"):
        war_bounds(read_archive("bad", str(tmp_path / "bad.war"), None))


def test_autoscale_on_a_war_is_refused_in_one_line_before_it_looks_for_a_server(tmp_path, capsys):
    from segserve.cli import main

    assert main(["autoscale", "--run-dir", str(tmp_path / "nothing"), "--war", str(tmp_path / "missing.war")]) == 2
    assert capsys.readouterr().err.strip() == f"error: --war {tmp_path / 'missing.war'}: no such file"
    spec = war(tmp_path, "models:\n  fast: {url: fast.mar}\n  slow: {url: slow.mar}\ndag:\n  fast: [slow]\n")
    assert main(["autoscale", "--run-dir", str(tmp_path / "nothing"), "--war", str(spec), "--dag", "seg_jpeg"]) == 2
    assert "give one or the other" in capsys.readouterr().err
    assert main(["autoscale", "--run-dir", str(tmp_path / "nothing"), "--war", str(spec)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: no TorchServe runs from {tmp_path / 'nothing'}") and "POST /workflows?url=flow.war" in err


def test_a_suites_autoscaled_point_on_an_archive_target_takes_its_wars_bounds(tmp_path):
    from segserve.archives.catalog import Catalog
    from segserve.autoscale.loop import target_bounds
    from tests.conftest import ROOT

    spec = "models:\n  fast: {url: fast.mar, max-workers: 2}\n  slow: {url: slow.mar}\ndag:\n  fast: [slow]\n"
    catalog = Catalog(ROOT)
    catalog.add_foreign([read_archive("flow", str(war(tmp_path, spec)), None)])
    assert target_bounds(catalog, "flow") == {FAST: Bounds(1, 2), SLOW: Bounds(1, 64)}
    assert set(target_bounds(catalog, "seg_jpeg")) == {"seg_jpeg__seg", "seg_jpeg__jpeg"}  # a catalog DAG: its YAML, as before
