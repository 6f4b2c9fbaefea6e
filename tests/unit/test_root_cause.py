"""A point's root cause on its way out: the progress line, report.md's section and a point whose every request failed
(the record's error_cause itself: tests/system/test_foreign_archives.py, on a real TorchServe)."""

from segserve.bench.results.report import _causes_section
from segserve.bench.run.point import no_request_completed
from segserve.bench.run.progress import Progress
from segserve.bench.suite.plan import Point

CAUSE = "ValueError: bad ← handler.py:3 ← RuntimeError: gave up ← handler.py:9 ← ts/service.py:135"


def test_a_measured_points_failed_requests_show_their_cause_on_the_progress_line():
    lines = []
    point = Point("tiny", (), (), (), (("concurrency", 2),))
    record = {"error": None, "throughput_rps": 10.0, "latency_p99_ms": 20.0, "requests_failed": 3, "error_cause": CAUSE}
    Progress(1, lines.append).step(point, record, 1.0)
    assert f"10.0 req/s, p99 20 ms, 3 failed: {CAUSE}" in lines[0], lines


def test_a_point_whose_requests_all_failed_has_the_cause_first_in_its_error():
    metrics = {"requests_failed": 4, "failures_by_status": {"503": 4}, "duration_s": 1.5}
    counts = "no request completed in 1.5 s of measured load: 4 failed (503: 4)"
    assert no_request_completed(metrics, CAUSE) == f"RuntimeFailure: {CAUSE}; {counts}"
    assert no_request_completed(metrics) == f"RuntimeFailure: {counts}"


def test_report_lists_the_cause_of_each_measured_points_failed_requests():
    records = [
        {"run_id": "tiny-1", "error": None, "requests_failed": 3, "error_cause": CAUSE},
        {"run_id": "tiny-2", "error": f"RuntimeFailure: {CAUSE}; …", "error_cause": CAUSE},  # listed with its target's failed points
        {"run_id": "tiny-3", "error": None, "requests_failed": 0, "error_cause": None},
    ]
    lines = _causes_section(records)
    assert lines[1] == "## Root causes of failed requests" and lines[-1] == f"- `tiny-1` (3 failed): {CAUSE}", lines
    assert not any("tiny-2" in line or "tiny-3" in line for line in lines)
    assert _causes_section(records[1:]) == []
