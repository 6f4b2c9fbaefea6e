"""One point, one place (segserve/bench/run/point.py): a resolved point is deployed, its hooks start in order before
the load and finish the other way round after it (also when the load raises), and their keys reach the record."""

from types import SimpleNamespace

import pytest

from segserve.bench.run import point as point_module
from segserve.bench.run.point import PointMeasurement, ResolvedPoint, resolve
from segserve.bench.suite.plan import Point
from segserve.bench.suite.spec import LoadSettings
from tests.conftest import ROOT

POINT = Point("seg", (), (("batch_size", 2),), (("seg_workers", 1),), (("concurrency", 2),))
METRICS = {"requests_ok": 10, "requests_failed": 0, "throughput_rps": 5.0, "measured_window_throughputs_rps": [5.0, 5.0]}


class Deployment:
    """What PointMeasurement asks of a deployment: deploy, stop, and which kind served the point."""

    def __init__(self):
        self.torchserve, self.active, self.load_s, self.fresh_workers, self.stopped = object(), None, 1.5, False, 0
        self.archive_overrides = {"models.timeout-ms": 5000}  # what its .war's copy changed (registration.spec_overrides)

    def deploy(self, point):
        return SimpleNamespace(url="http://127.0.0.1:1", path="/predictions/seg")

    def watched_processes(self, endpoint):
        return None

    def stop_servers(self):
        self.stopped += 1


class Hook:
    def __init__(self, name: str, said: list):
        self.name, self.said = name, said

    def start(self, point):
        self.said.append(f"start {self.name}")

    def finish(self, point, metrics):
        self.said.append(f"finish {self.name} {'metrics' if metrics else 'none'}")
        return {f"{self.name}_key": True}


def measured(monkeypatch, load):
    said: list[str] = []
    monkeypatch.setattr(point_module, "measure", lambda *args: load() if callable(load) else dict(load))
    deployment = Deployment()
    unit = PointMeasurement(deployment, LoadSettings(), lambda target, phase=None: [b"x"], (Hook("a", said), Hook("b", said)))
    return unit.measure(ResolvedPoint(POINT, "seg", {"device": "cpu"})), said, deployment


def test_hooks_start_in_order_and_finish_the_other_way_round_and_their_keys_reach_the_record(monkeypatch):
    record, said, deployment = measured(monkeypatch, METRICS)
    assert said == ["start a", "start b", "finish b metrics", "finish a metrics"]
    assert record["a_key"] is record["b_key"] is True and record["error"] is None and record["valid"] is True
    assert record["throughput_rps"] == 5.0 and record["weights_device"] == "cpu" and record["load_s"] == 1.5
    assert record["archive_overrides"] == {"models.timeout-ms": 5000}
    assert record["run_id"] == POINT.run_id and record["batch_size"] == 2 and deployment.stopped == 0


def test_a_load_that_raises_still_finishes_every_hook_and_fails_the_point_alone(monkeypatch):
    def broken():
        raise ConnectionError("the server went away")

    record, said, deployment = measured(monkeypatch, broken)
    assert said == ["start a", "start b", "finish b none", "finish a none"]
    assert record["error"] == "ConnectionError: the server went away" and record["valid"] is False
    assert deployment.stopped == 1  # the next point starts clean


def test_a_load_that_completed_nothing_has_no_throughput_and_says_why(monkeypatch):
    nothing = {**METRICS, "requests_ok": 0, "requests_failed": 3, "failures_by_status": {503: 3}, "duration_s": 2.0}
    record, _, deployment = measured(monkeypatch, nothing)
    assert record["throughput_rps"] is None and deployment.stopped == 1
    assert record["error"] == "RuntimeFailure: no request completed in 2.0 s of measured load: 3 failed (503: 3)"


@pytest.mark.parametrize(("target", "weights_node", "bare_node"), [("seg", "seg", "seg"), ("seg_jpeg", "seg", None), ("jpeg", None, None)])
def test_a_point_is_resolved_once_with_its_weights_node_and_network(target, weights_node, bare_node):
    from segserve.archives.catalog import Catalog

    resolved = resolve(Point(target, (), (("batch_size", 2),), (), ()), Catalog(ROOT))
    assert (resolved.weights_node, resolved.bare_node) == (weights_node, bare_node)
    # a model target's network is the bare forward's reference; a workflow's seg node is not measured beside it
    assert (resolved.variant is None) == (weights_node is None)
