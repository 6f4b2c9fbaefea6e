"""Sizing a Ray point for a target rate (segserve/bench/results/sizing.py): each figure from the record's own keys,
and each refusal (a TorchServe point, no bound, a p99 over it, no rate, nothing measured) with what to give."""

import pytest

from segserve.bench.results import sizing
from segserve.bench.results.sizing import NotSized, size
from tests.unit.test_manifests import record


def ray_point(**values) -> dict:
    """A Ray point: 2 replicas answering 120.5 req/s at 64 connections on 8 cores (Little: 120.5 × 0.531 s ≈ 64)."""
    measured = {"engine": "ray", "latency_p99_ms": 180.0, "latency_mean_ms": 531.0, "server_cpu_ms_per_request": 30.0}
    return record(**{**measured, **values})


def test_replicas_nodes_and_autoscaling_come_from_the_measured_rate_latency_and_cpu():
    sized = size(ray_point(), {"tiny": 2}, 200.0, 1000.0)
    assert sized.rate_per_replica_rps("tiny") == pytest.approx(60.25)
    assert sized.needed == {"tiny": 17}  # ⌈2 × 1000 ÷ 120.5⌉ = ⌈16.6⌉
    assert sized.cores_per_replica == 1.9  # 30 ms × 120.5 req/s ÷ 1000 ÷ 2 = 1.81 cores, up to a tenth
    assert (sized.node_cores, sized.replicas_per_node, sized.nodes) == (8, 4, 5)  # ⌊8 ÷ 1.9⌋ = 4; ⌈17 ÷ 4⌉ = 5
    autoscaling = sized.autoscaling("tiny")
    # Little's law: 60.25 req/s × 0.531 s; at the point, the 64 connections ÷ 2 replicas are 32 in each
    assert autoscaling == {"min_replicas": 2, "max_replicas": 17, "target_ongoing_requests": 31.99}
    assert autoscaling["target_ongoing_requests"] == pytest.approx(record()["concurrency"] / 2, rel=0.01)
    said = " ".join(sized.lines())
    for figure in ("throughput_rps", "latency_mean_ms", "server_cpu_ms_per_request", "SEGSERVE_TARGET_RPS", "⌈replicas × 1000 ÷ 120.5⌉"):
        assert figure in said


def test_a_target_below_the_measured_rate_needs_fewer_replicas_and_min_replicas_stays_within_max():
    sized = size(ray_point(), {"tiny": 2}, 200.0, 50.0)
    assert sized.needed == {"tiny": 1} and sized.autoscaling("tiny")["min_replicas"] == 1 and sized.nodes == 1


def test_a_wars_nodes_each_scale_with_the_rate_and_get_fixed_replicas():
    sized = size(ray_point(), {"flow__seg": 2, "flow__jpeg": 1}, 200.0, 241.0)
    assert sized.needed == {"flow__seg": 4, "flow__jpeg": 2}
    assert sized.autoscaling("flow__seg") is None and sized.target_ongoing_requests is None
    assert sized.cores_per_replica == 1.3  # 30 × 120.5 ÷ 1000 ÷ 3 replicas = 1.205
    assert "no autoscaling" in " ".join(sized.lines())


@pytest.mark.parametrize(
    ("point", "bound", "rate", "said"),
    [
        (record(), 200.0, 1000.0, "tiny-1a2b3c4d ran on torchserve: sizing reads a Ray point's replicas"),  # no engine key
        (ray_point(engine="torchserve"), 200.0, 1000.0, "ran on torchserve"),
        (ray_point(), None, 1000.0, "no p99 bound: give the suite a constraint latency_p99_ms: {max: N}"),
        (ray_point(latency_p99_ms=250.0), 200.0, 1000.0, "tiny-1a2b3c4d's p99 250.0 ms is over the bound 200 ms"),
        (ray_point(), 200.0, None, "no target rate: set SEGSERVE_TARGET_RPS"),
        (ray_point(server_cpu_ms_per_request=None), 200.0, 1000.0, "no server_cpu_ms_per_request"),
        (ray_point(throughput_rps=None), 200.0, 1000.0, "nothing measured to size from"),
    ],
)
def test_a_point_that_cannot_be_sized_is_refused_with_what_to_give(point, bound, rate, said):
    with pytest.raises(NotSized, match="^.+$") as refused:
        size(point, {"tiny": 2}, bound, rate)
    assert said in str(refused.value) and "\n" not in str(refused.value)


def test_the_bound_is_the_suites_p99_constraint_and_the_rate_its_variable():
    assert sizing.p99_bound_ms({"latency_p99_ms": {"max": 250}}) == 250
    assert sizing.p99_bound_ms({"latency_p99_ms": {"min": 1}, "throughput_rps": {"max": 9}}) is None
    assert sizing.target_rps({}) is None and sizing.target_rps({"SEGSERVE_TARGET_RPS": "1500"}) == 1500.0
    for wrong in ("fast", "-3", "0", "nan"):
        with pytest.raises(NotSized, match="SEGSERVE_TARGET_RPS="):
            sizing.target_rps({"SEGSERVE_TARGET_RPS": wrong})
