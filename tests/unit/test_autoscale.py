"""The autoscaler's decisions on recorded metric sequences (#16): no server, no timing."""

import os
from dataclasses import replace

import pytest

from segserve.autoscale.loop import Autoscaler, core_budget, last_decisions, node_bounds, samples_between
from segserve.autoscale.rules import Bounds, NodeSample, Policy, Trial, decide, decide_workers, judge, mix_of, split
from segserve.errors import RuntimeFailure, UsageError

SEG, JPEG = "seg_jpeg__seg", "seg_jpeg__jpeg"
BOUNDS = {SEG: Bounds(1, 3), JPEG: Bounds(1, 3)}


def samples(seg_workers, jpeg_workers, seg_cpu, jpeg_cpu, seg_queue, jpeg_queue, handler_ms=50.0):
    return [
        NodeSample(SEG, seg_workers, seg_cpu, seg_queue, handler_ms),
        NodeSample(JPEG, jpeg_workers, jpeg_cpu, jpeg_queue, handler_ms),
    ]


def run(sequence, budget=4, start=(2, 2), interval_s=5.0, policy=None):
    """Feed samples made by `sequence(workers, t)` to decide() as the loop would; the moves and the workers."""
    policy = policy or Policy(budget_workers=budget, min_interval_s=15)
    workers, last, moves = dict(zip((SEG, JPEG), start, strict=True)), None, []
    for step in range(len(sequence)):
        now = step * interval_s
        decision = decide(sequence[step](workers[SEG], workers[JPEG]), BOUNDS, policy, now, last)
        for node, count in decision.steps:
            workers[node] = count
            moves.append((now, node, count))
        if decision.steps:
            last = now
        assert sum(workers.values()) <= budget, decision
        assert all(BOUNDS[n].min_workers <= c <= BOUNDS[n].max_workers for n, c in workers.items())
    return moves, workers


def jpeg_heavy(seg, jpeg):  # large photos: jpeg is behind, seg idles
    return samples(seg, jpeg, 0.4, jpeg * 0.95, 3.0, 180.0)


def seg_heavy(seg, jpeg):  # small images: seg is behind
    return samples(seg, jpeg, seg * 0.95, 0.3, 150.0, 2.0)


def test_it_moves_workers_toward_the_loaded_node_up_first_then_down():
    moves, workers = run([jpeg_heavy] * 10)
    assert workers == {SEG: 1, JPEG: 3}
    assert moves[0] == (0.0, JPEG, 3) and moves[1] == (0.0, SEG, 1)  # the new jpeg worker before the seg one goes


def test_it_follows_a_phase_change_and_waits_the_minimum_time_between_moves():
    moves, workers = run([jpeg_heavy] * 6 + [seg_heavy] * 10)
    assert workers == {SEG: 3, JPEG: 1}
    times = sorted({t for t, _, _ in moves})
    assert all(b - a >= 15 for a, b in zip(times, times[1:], strict=False))
    assert times[1] >= 30  # the phase changed at 30 s: the move toward seg came after it


def test_it_does_not_flap_on_noise():
    noisy = [
        lambda s, j, k=k: samples(s, j, 1.0 + 0.15 * (-1) ** k, 1.0 - 0.15 * (-1) ** k, 20 + 10 * (-1) ** k, 20 - 10 * (-1) ** k)
        for k in range(20)
    ]
    moves, workers = run(noisy)
    assert moves == [] and workers == {SEG: 2, JPEG: 2}


def test_a_node_that_keeps_up_is_not_given_more_workers():
    idle_queue = [lambda s, j: samples(s, j, 0.2, 1.8, 0.5, 1.0)] * 5
    moves, _ = run(idle_queue)
    assert moves == []


def test_the_split_respects_the_budget_and_each_nodes_bounds():
    assert split({SEG: 9.0, JPEG: 1.0}, BOUNDS, 4) == {SEG: 3, JPEG: 1}  # seg's maximum is 3
    assert split({SEG: 1.0, JPEG: 1.0}, BOUNDS, 2) == {SEG: 1, JPEG: 1}
    with pytest.raises(ValueError, match="exceed the budget"):
        split({SEG: 1.0, JPEG: 1.0}, {SEG: Bounds(2, 3), JPEG: Bounds(2, 3)}, 3)


def test_every_decision_says_why_and_serialises():
    decision = decide(jpeg_heavy(2, 2), BOUNDS, Policy(budget_workers=4), 0.0, None)
    record = decision.as_json()
    assert record["steps"] == [(JPEG, 3), (SEG, 1)] and "takes a worker, from" in record["reason"]
    assert set(record) == {"time_s", "loads", "current", "target", "steps", "reason"}
    too_soon = decide(seg_heavy(1, 3), BOUNDS, Policy(budget_workers=4, min_interval_s=15), 5.0, 0.0)
    assert too_soon.steps == [] and too_soon.reason == "waiting: 5s since the last move (minimum 15s)"
    balanced = decide(jpeg_heavy(1, 3), BOUNDS, Policy(budget_workers=4), 50.0, 0.0)
    assert balanced.steps == [] and balanced.reason.startswith("balanced")


# The control loop (segserve/autoscale/loop.py) against a stand-in for the server: its reads and its calls.
class FakeServer:
    def __init__(self, workers: dict[str, int], refuse: bool = False):
        self.workers, self.refuse, self.calls = dict(workers), refuse, []
        self.counters = {}

    def workflow_nodes(self):
        return sorted(m for m in self.workers if "__" in m)

    def models(self):
        return sorted(self.workers)

    def describe(self, model):
        return {"workers": [{"pid": os.getpid(), "status": "READY"} for _ in range(self.workers[model])]}

    def url(self, api):
        return "http://127.0.0.1:1"

    def scale(self, model, workers):
        self.calls.append((model, workers))
        if self.refuse:
            raise RuntimeFailure(f"scaling {model} to {workers} worker(s) failed: HTTP 500 ConcurrentModificationException")
        self.workers[model] = workers

    def wait_ready(self, model):
        self.calls.append(("ready", model))


@pytest.fixture
def no_metrics(monkeypatch):
    """The stand-in has no /metrics: each test gives the loop its samples."""
    monkeypatch.setattr("segserve.autoscale.loop.scrape", lambda url: {})


def counters(seg_requests, jpeg_requests, seg_queue_us, jpeg_queue_us, stage_ms):
    values = {}
    for model, served, queue_us in ((SEG, seg_requests, seg_queue_us), (JPEG, jpeg_requests, jpeg_queue_us)):
        values[("SegserveRequests", model)] = served
        values[("ts_queue_latency_microseconds", model)] = queue_us
        values[("SegservePredictMs", model)] = stage_ms * served
    return values


def test_samples_between_two_reads_are_per_request_means_and_cores(monkeypatch):
    before = {"time": 10.0, "counters": counters(100, 100, 0, 0, 0), "workers": {SEG: [1], JPEG: [2, 3]}, "cpu": {1: 5.0, 2: 1.0, 3: 1.0}}
    after = {
        "time": 15.0,
        "counters": counters(150, 150, 50 * 4000, 50 * 90_000, 0),
        "workers": {SEG: [1], JPEG: [2, 3]},
        "cpu": {1: 9.0, 2: 4.0, 3: 4.5},
    }
    after["counters"][("SegservePredictMs", SEG)] = 50 * 20.0
    seg, jpeg = samples_between(before, after, [SEG, JPEG])
    assert seg == NodeSample(SEG, 1, 0.8, 4.0, 20.0, served_rps=10.0, stages_ms={"decode": 0.0, "predict": 20.0, "encode": 0.0})
    assert jpeg.workers == 2 and jpeg.cpu_cores == 1.3 and jpeg.queue_ms == 90.0


def test_the_loop_scales_up_before_down_and_logs_every_decision(tmp_path, monkeypatch, no_metrics):
    server = FakeServer({SEG: 2, JPEG: 2})
    scaler = Autoscaler(server, BOUNDS, Policy(budget_workers=4, min_interval_s=0), tmp_path)
    monkeypatch.setattr(scaler.meter, "samples", lambda: jpeg_heavy(server.workers[SEG], server.workers[JPEG]))
    record = scaler.step()
    assert server.calls == [(JPEG, 3), ("ready", JPEG), (SEG, 1), ("ready", SEG)]
    assert record["applied"] is True and record["move"] == [(JPEG, 3), (SEG, 1)] and "takes a worker" in record["why"]
    logged = last_decisions(tmp_path)
    assert len(logged) == 1 and logged[0]["metrics"][1]["node"] == JPEG and logged[0]["move"] == [[JPEG, 3], [SEG, 1]]


def with_rate(found: list[NodeSample], served_rps: float, jpeg_share: float = 0.8) -> list[NodeSample]:
    """The samples with what the pipeline served, and a request mix (jpeg's share of the handler time)."""
    handler = {SEG: 100 * (1 - jpeg_share), JPEG: 100 * jpeg_share}
    return [replace(s, served_rps=served_rps, handler_ms=handler[s.node]) for s in found]


def test_a_move_that_serves_less_is_undone_and_not_tried_again_at_the_same_mix(tmp_path, monkeypatch, no_metrics):
    server = FakeServer({SEG: 2, JPEG: 2})
    scaler = Autoscaler(server, BOUNDS, Policy(budget_workers=4, min_interval_s=0), tmp_path)
    monkeypatch.setattr(scaler.meter, "read", lambda: scaler.meter.last)
    rates = iter([50.0, 40.0, 50.0])  # before the move, after it, after undoing it
    monkeypatch.setattr(scaler.meter, "samples", lambda: with_rate(jpeg_heavy(server.workers[SEG], server.workers[JPEG]), next(rates)))
    moved = scaler.step()
    assert moved["move"] == [(JPEG, 3), (SEG, 1)] and scaler.trial.rate_before_rps == 50.0
    undone = scaler.step()
    assert undone["move"] == [(SEG, 2), (JPEG, 2)] and "undoing the move: 40.0 req/s after it, 50.0 before" in undone["why"]
    assert server.workers == {SEG: 2, JPEG: 2} and server.calls[-4:] == [(SEG, 2), ("ready", SEG), (JPEG, 2), ("ready", JPEG)]
    held = scaler.step()  # same loads, same mix: the undone split is not tried again
    assert held["move"] == [] and "that split served 40.0 req/s at this mix (50.0 now)" in held["why"]
    scaler.meter.samples = lambda: with_rate(jpeg_heavy(2, 2), 50.0, jpeg_share=0.4)  # another mix: it may try,
    assert "the request mix is moving (0.20/0.80 → 0.60/0.40)" in scaler.step()["why"]  # once the mix holds
    assert scaler.step()["move"] == [(JPEG, 3), (SEG, 1)] and scaler.trial.rate_before_rps == 50.0


def test_a_kept_move_is_not_flapped_back_when_the_split_it_left_served_no_more(tmp_path, monkeypatch, no_metrics):
    server = FakeServer({SEG: 2, JPEG: 2})
    scaler = Autoscaler(server, BOUNDS, Policy(budget_workers=4, min_interval_s=0), tmp_path)
    monkeypatch.setattr(scaler.meter, "read", lambda: scaler.meter.last)
    # jpeg looks loaded at 2·2, and seg looks loaded at 1·3: the queue moves with the workers, the rate does not
    loads = {(2, 2): jpeg_heavy(2, 2), (1, 3): seg_heavy(1, 3)}
    monkeypatch.setattr(scaler.meter, "samples", lambda: with_rate(loads[server.workers[SEG], server.workers[JPEG]], 50.0))
    assert scaler.step()["move"] == [(JPEG, 3), (SEG, 1)]
    assert scaler.step()["why"].startswith("kept the move: 50.0 req/s after it")
    back = scaler.step()
    assert back["move"] == [] and "that split served 50.0 req/s at this mix (50.0 now)" in back["why"]
    assert server.workers == {SEG: 1, JPEG: 3}


def test_a_move_within_the_noise_is_kept():
    trial = Trial({SEG: 2, JPEG: 2}, {SEG: 1, JPEG: 3}, 50.0, {SEG: 0.2, JPEG: 0.8})
    kept = judge(trial, with_rate(jpeg_heavy(1, 3), 48.0), Policy(budget_workers=4, max_drop=0.05), 0.0)
    assert kept.steps == [] and kept.reason.startswith("kept the move")
    undone = judge(trial, with_rate(jpeg_heavy(1, 3), 47.0), Policy(budget_workers=4, max_drop=0.05), 0.0)
    assert undone.steps == [(SEG, 2), (JPEG, 2)]


def test_a_refusing_management_api_changes_nothing_more_and_is_logged(tmp_path, monkeypatch, no_metrics):
    server = FakeServer({SEG: 2, JPEG: 2}, refuse=True)
    scaler = Autoscaler(server, BOUNDS, Policy(budget_workers=4, min_interval_s=0), tmp_path)
    monkeypatch.setattr(scaler.meter, "samples", lambda: jpeg_heavy(2, 2))
    record = scaler.step()
    assert server.calls == [(JPEG, 3)]  # the scale-down never followed a refused scale-up
    assert record["applied"] is False and "ConcurrentModificationException" in record["error"]


def test_dry_run_decides_without_calls_and_a_missing_node_is_one_line(tmp_path, monkeypatch, no_metrics):
    server = FakeServer({SEG: 2, JPEG: 2})
    scaler = Autoscaler(server, BOUNDS, Policy(budget_workers=4, min_interval_s=0), tmp_path, dry_run=True)
    monkeypatch.setattr(scaler.meter, "samples", lambda: jpeg_heavy(2, 2))
    assert scaler.step()["move"] and server.calls == []
    with pytest.raises(RuntimeFailure, match="not registered on the server from .*: seg_jpeg__jpeg"):
        Autoscaler(FakeServer({SEG: 1}), BOUNDS, Policy(budget_workers=2), tmp_path)


def test_a_budget_larger_than_the_machine_is_refused():
    with pytest.raises(UsageError, match="this machine lets us use"):
        core_budget(str(len(os.sched_getaffinity(0)) + 1))
    assert core_budget(None) == len(os.sched_getaffinity(0))
    assert node_bounds({"seg": {"min-workers": 1, "max-workers": 3}}, {"seg": SEG, "jpeg": JPEG}) == {
        SEG: Bounds(1, 3),
        JPEG: Bounds(1, 64),
    }


def test_autoscale_without_a_running_server_says_how_to_start_one(tmp_path, capsys):
    from segserve.cli import main

    assert main(["autoscale", "--run-dir", str(tmp_path / "nothing"), "--intervals", "1"]) == 1
    assert "segserve serve --targets seg_jpeg" in capsys.readouterr().err
    assert main(["pin", "--show", "--run-dir", str(tmp_path / "nothing")]) == 1  # one line, not a traceback
    assert capsys.readouterr().err.startswith(f"error: no TorchServe runs from {tmp_path / 'nothing'}")


# The fused pipeline: one model whose workers share the budget's cores (threads = budget // workers).
FUSED = "seg_jpeg_fused"


def fused(workers, cpu, queue_ms, served_rps=40.0, stages=(5.0, 40.0, 5.0)):
    decode, predict, encode = stages
    return NodeSample(FUSED, workers, cpu, queue_ms, sum(stages), served_rps, {"decode": decode, "predict": predict, "encode": encode})


def test_a_fused_pipeline_takes_a_worker_while_requests_wait_and_gives_it_back_with_cores_to_spare():
    policy, bounds = Policy(budget_workers=2, min_interval_s=15), Bounds(1, 2)
    up = decide_workers(fused(1, 1.9, queue_ms=120), bounds, policy, 100.0, None)
    assert (
        up.steps == [(FUSED, 2)]
        and up.reason.startswith(f"{FUSED} takes a worker: requests wait 120 ms")
        and "1 thread(s) each" in up.reason
    )
    full = decide_workers(fused(2, 1.9, queue_ms=120), bounds, policy, 100.0, None)  # one thread each already
    assert full.steps == [] and full.reason == f"holding: {FUSED} requests wait 120 ms with 2 worker(s) (1–2)"
    down = decide_workers(fused(2, 0.4, queue_ms=0.5), bounds, policy, 100.0, None)
    assert down.steps == [(FUSED, 1)] and "keeps up on 0.40 of 2 cores; 2 thread(s) each" in down.reason
    busy = decide_workers(fused(2, 1.8, queue_ms=0.5), bounds, policy, 100.0, None)  # keeping up, no core to spare
    assert busy.steps == [] and busy.reason.startswith("holding")
    too_soon = decide_workers(fused(1, 1.9, queue_ms=120), bounds, policy, 100.0, 90.0)
    assert too_soon.steps == [] and too_soon.reason == "waiting: 10s since the last move (minimum 15s)"
    over = decide_workers(fused(3, 1.9, queue_ms=120), bounds, Policy(budget_workers=2), 100.0, None)
    assert over.steps == [(FUSED, 2)] and "gives a worker back (3 workers, budget 2 cores)" in over.reason
    short_queue = decide_workers(fused(1, 1.9, queue_ms=8), bounds, policy, 100.0, None)  # 8 ms wait on 50 ms served
    assert short_queue.steps == []


def test_a_fused_pipelines_mix_is_its_stages_and_its_trials_are_judged_like_any_move(tmp_path, monkeypatch, no_metrics):
    assert mix_of([fused(1, 1.0, 0.0, stages=(10.0, 30.0, 10.0))]) == {"decode": 0.2, "predict": 0.6, "encode": 0.2}
    server = FakeServer({FUSED: 1, SEG: 1, JPEG: 1})
    scaler = Autoscaler(server, {FUSED: Bounds(1, 2)}, Policy(budget_workers=2, min_interval_s=0), tmp_path, fused=True)
    monkeypatch.setattr(scaler.meter, "read", lambda: scaler.meter.last)
    rates = iter([40.0, 30.0, 40.0])  # before the move, after it, after undoing it
    monkeypatch.setattr(scaler.meter, "samples", lambda: [fused(server.workers[FUSED], 1.9, 120, next(rates))])
    assert scaler.step()["move"] == [(FUSED, 2)] and server.calls == [(FUSED, 2), ("ready", FUSED)]
    undone = scaler.step()
    assert undone["move"] == [(FUSED, 1)] and "undoing the move: 30.0 req/s after it, 40.0 before" in undone["why"]
    held = scaler.step()  # the same stages: two workers are known to serve less
    assert held["move"] == [] and "that split served 30.0 req/s at this mix (40.0 now)" in held["why"]
    # large photos: decode and encode take most of a request, another mix: it may try again once the mix holds
    scaler.meter.samples = lambda: [fused(server.workers[FUSED], 1.9, 120, 20.0, stages=(40.0, 40.0, 40.0))]
    assert "the request mix is moving" in scaler.step()["why"]
    assert scaler.step()["move"] == [(FUSED, 2)]


def test_a_fused_autoscaler_takes_one_registered_model(tmp_path):
    with pytest.raises(UsageError, match="a fused pipeline is one model"):
        Autoscaler(FakeServer({FUSED: 1}), BOUNDS, Policy(budget_workers=2), tmp_path, fused=True)
    with pytest.raises(RuntimeFailure, match="not registered on the server from .*: seg_jpeg_fused \\(serve the fused pipeline first\\)"):
        Autoscaler(FakeServer({SEG: 1}), {FUSED: Bounds(1, 2)}, Policy(budget_workers=2), tmp_path, fused=True)
