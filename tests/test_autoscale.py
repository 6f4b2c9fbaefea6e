"""The autoscaler's decisions on recorded metric sequences (#16): no server, no timing."""

import pytest

from segserve.autoscale import Bounds, NodeSample, Policy, decide, split

SEG, JPEG = "seg_jpeg__seg", "seg_jpeg__jpeg"
BOUNDS = {SEG: Bounds(1, 3), JPEG: Bounds(1, 3)}


def samples(seg_workers, jpeg_workers, seg_cpu, jpeg_cpu, seg_queue, jpeg_queue, handler_ms=50.0):
    return [
        NodeSample(SEG, seg_workers, seg_cpu, seg_queue, handler_ms),
        NodeSample(JPEG, jpeg_workers, jpeg_cpu, jpeg_queue, handler_ms),
    ]


def run(sequence, budget=4, start=(2, 2), interval_s=5.0, policy=None):
    """Feed samples made by `sequence(workers, t)` to decide() as the loop would; the moves and the workers."""
    policy = policy or Policy(budget_cores=budget, min_interval_s=15)
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
    decision = decide(jpeg_heavy(2, 2), BOUNDS, Policy(budget_cores=4), 0.0, None)
    record = decision.as_json()
    assert record["steps"] == [(JPEG, 3), (SEG, 1)] and "takes a worker, from" in record["reason"]
    assert set(record) == {"time_s", "loads", "current", "target", "steps", "reason"}
    too_soon = decide(seg_heavy(1, 3), BOUNDS, Policy(budget_cores=4, min_interval_s=15), 5.0, 0.0)
    assert too_soon.steps == [] and too_soon.reason == "waiting: 5s since the last move (minimum 15s)"
    balanced = decide(jpeg_heavy(1, 3), BOUNDS, Policy(budget_cores=4), 50.0, 0.0)
    assert balanced.steps == [] and balanced.reason.startswith("balanced")
