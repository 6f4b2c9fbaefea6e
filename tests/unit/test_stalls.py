"""Stalls (segserve/bench/run/stalls.py): found in a load's completions, attributed to the node whose timeout-ms
TorchServe's workflow executor waited (a real excerpt of a lost answer), never feasible, not called disturbance,
and said on the terminal, in a failed point's error and in report.md."""

import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from segserve.bench.results.render import status
from segserve.bench.results.report import _failures_section, _flags_section
from segserve.bench.run import stalls as stalls_module
from segserve.bench.run.failures import LOG_TIME, failure_line, node_failures
from segserve.bench.run.load import LoadResult
from segserve.bench.run.measure import _ChosenWindows
from segserve.bench.run.point import no_request_completed
from segserve.bench.run.progress import Progress
from segserve.bench.run.stalls import explained, find_stalls, stall_cause, stall_columns
from segserve.bench.suite.columns import best, satisfies
from segserve.bench.suite.plan import Point
from tests.conftest import serving

# from a real run (TorchServe 0.12.0, the dog-breed example's workflow, timeout-ms 300000, 8 connections): one
# request's lost answer, excerpted from its ts_log.log (every line twice, as TorchServe's log4j2.xml writes them):
# pre_processing answered in 1.2 ms, the executor waited 300 s, retried, and only then invoked cat_dog_classification
RACE_LOG = (Path(__file__).parent / "data" / "workflow_race.ts_log.log").read_text()
RACE_INVOKED_EPOCH_S = datetime.strptime("2026-12-05T06:18:12,251", LOG_TIME).timestamp()


def _closed_loop(connections: int, gap: tuple[float, float] | None = None, until_s: float = 12.0, latency_s: float = 0.05) -> LoadResult:
    """What a closed loop records: each connection sends its next request when the last is answered; in `gap` the
    server answers nothing, then every waiting request at its end."""
    result = LoadResult()
    for connection in range(connections):
        sent = connection * latency_s / connections
        while sent < until_s:
            end = sent + latency_s
            if gap and gap[0] <= end < gap[1]:
                end = gap[1]
            result.record(sent, end, 200)
            sent = end
    order = sorted(range(len(result.end_s)), key=result.end_s.__getitem__)
    ordered = LoadResult()
    for i in order:
        ordered.record(result.intended_s[i], result.end_s[i], result.status[i])
    ordered.wall_s = max(ordered.end_s)
    return ordered


def test_a_gap_with_every_connection_waiting_is_a_stall_and_a_steady_or_slow_load_is_not():
    stalled = find_stalls(_closed_loop(4, gap=(3.0, 30.0), until_s=33.0), window_s=1.0, concurrency=4)
    assert len(stalled) == 1 and stalled[0]["in_flight"] == 4
    assert 2.9 <= stalled[0]["from_s"] <= 3.0 and stalled[0]["to_s"] == 30.0
    assert find_stalls(_closed_loop(4), window_s=1.0, concurrency=4) == []
    # a slow model's gaps are its latency: 6 s a request at one connection is slow, not stalled
    assert find_stalls(_closed_loop(1, until_s=60.0, latency_s=6.0), window_s=1.0, concurrency=1) == []
    # shorter than 5 s, or than two windows: a slow spell
    assert find_stalls(_closed_loop(4, gap=(3.0, 7.0)), window_s=1.0, concurrency=4) == []
    assert find_stalls(_closed_loop(4, gap=(3.0, 9.0)), window_s=4.0, concurrency=4) == []
    assert stall_columns(stalled) == {"stalled": True, "stalled_s": round(30.0 - stalled[0]["from_s"], 1), "stalls": stalled}
    assert stall_columns([]) == {"stalled": False, "stalled_s": 0, "stalls": []}


def test_an_open_loop_that_sends_nothing_for_a_while_has_not_stalled():
    result = LoadResult()
    for sent in (0.0, 0.5, 1.0, 20.0, 20.5):  # nothing sent between 1 s and 20 s: nothing waited
        result.record(sent, sent + 0.05, 200)
    assert find_stalls(result, window_s=1.0, concurrency=4, rate_rps=0.1) == []
    result.record(1.5, 20.0, 200)  # one request waited through it
    assert find_stalls(result, window_s=1.0, concurrency=4, rate_rps=0.1) == [{"from_s": 1.5, "to_s": 20.0, "in_flight": 1}]


def test_the_frontend_log_of_a_lost_answer_counts_a_timeout_at_the_time_the_wait_ended():
    nodes = node_failures(RACE_LOG, epoch_s=RACE_INVOKED_EPOCH_S)
    lost = nodes["pre_processing"]
    # two log lines for one retry (log4j2 writes each twice); 300 s: the spec's timeout-ms
    assert (lost["invoked"], lost["retried"], lost["timed_out"], lost["failed"]) == (4, 2, 2, 0)
    assert lost["timed_out_at_s"] == [300.002, 300.002]
    assert nodes["cat_dog_classification"]["timed_out"] == 0


def test_a_retry_after_an_exception_is_not_a_timeout():
    at = "2026-12-05T06:37:24,149 [{}] wf-execute-thread-0 org.pytorch.serve.ensemble.DagExecutor - {}\n"
    exception = (  # from a real run: a function node that raised (shapes.war, a byte it cannot decode)
        at.format("INFO ", "Invoking -  start for attempt 0")
        + at.format("ERROR", "org.pytorch.serve.http.InternalServerException: Prediction failed")
        + at.format("ERROR", "Timed out while executing start for attempt 0")
    )
    start = node_failures(exception)["start"]
    assert (start["retried"], start["timed_out"]) == (1, 0) and "timed_out_at_s" not in start


def test_a_stall_is_attributed_to_the_node_whose_timeout_ms_passed_as_it_ended():
    stall = [{"from_s": 6.0, "to_s": 300.0, "in_flight": 8}]
    failures = {"by_node": node_failures(RACE_LOG, epoch_s=RACE_INVOKED_EPOCH_S)}
    cause = stall_cause(stall, failures, 30.0)
    assert cause.startswith("stalled 294 s: requests in flight and none completed at 6.0–300.0 s (8 waiting) of the load")
    assert "timeout-ms of node pre_processing (2×)" in cause and "DagExecutor race, docs/torchserve_workflows.md" in cause
    assert "below the client's timeout (30 s)" in cause and "segserve fuse" in cause
    # a stall whose end no node's timeout explains says so
    elsewhere = stall_cause([{"from_s": 6.0, "to_s": 100.0, "in_flight": 8}], failures, 30.0)
    assert "pre_processing" not in elsewhere and "names no node" in elsewhere
    # rounds merged (no times): every node whose timeout-ms passed
    merged = {"by_node": {"mid": {"retried": 1, "timed_out": 1}, "start": {"retried": 450, "timed_out": 0}}}
    assert "node mid (1×)" in stall_cause(stall, merged, 30.0) and stall_cause([], merged, 30.0) is None


def _chosen(disturbed: bool, clean: list, all_spans: list) -> _ChosenWindows:
    return _ChosenWindows(all_spans, clean, False, disturbed, all_spans if disturbed else clean)


def test_windows_a_stall_emptied_do_not_make_the_point_disturbed_but_others_elsewhere_still_do():
    spans = [(float(k), float(k + 1)) for k in range(10)]
    stall = [{"from_s": 3.5, "to_s": 10.0, "in_flight": 4}]
    # others filled the idle CPU from the stall on: every window after 3 s dirty
    assert explained(_chosen(True, spans[:3], spans), stall).disturbed is False
    # others also took the machine before the stall: both
    assert explained(_chosen(True, spans[:1], spans), stall).disturbed is True
    assert explained(_chosen(True, spans[:1], spans), []).disturbed is True


def test_a_stalled_point_is_never_feasible_and_its_status_says_so():
    stalled = {"run_id": "wf-1", "error": None, "throughput_rps": 47.0, "requests_failed": 0, "stalled": True, "stalled_s": 27.0}
    steady = {"run_id": "wf-2", "error": None, "throughput_rps": 10.0, "requests_failed": 0, "stalled": False}
    constraints = {"requests_failed": {"max": 0}}
    assert not satisfies(stalled, constraints) and satisfies(steady, constraints)
    assert best([stalled, steady], constraints, "throughput_rps") is steady
    assert status(stalled, steady, constraints) == "✗ stalled 27 s"


CAUSE = "stalled 27 s: … node mid (1×) …"


def test_the_terminal_and_a_failed_points_error_say_the_stall_not_disturbance_alone():
    lines = []
    point = Point("wf", (), (), (), (("concurrency", 4),))
    record = {"error": None, "throughput_rps": 10.2, "latency_p99_ms": 84.0, "stall_cause": CAUSE, "disturbed": False}
    Progress(1, lines.append).step(point, record, 1.0)
    assert f"10.2 req/s, p99 84 ms, STALLED ({CAUSE})" in lines[0] and "DISTURBED" not in lines[0]
    metrics = {"requests_failed": 0, "failures_by_status": {}, "duration_s": 5.0, "stall_cause": CAUSE}
    assert no_request_completed(metrics) == f"RuntimeFailure: {CAUSE}; no request completed in 5.0 s of measured load: none answered"
    failures = {"by_status": {"timeout": 2}, "by_input": {"a.txt": 2}, "by_node": {"mid": {"timed_out": 1, "failed": 0}}}
    waited = ", node mid (its timeout-ms passed 1× in the frontend's log: a lost answer or a slow node)"
    assert failure_line("wf-1", failures).endswith(waited)
    slow = {"by_status": {}, "by_node": failures["by_node"]}  # every request answered, one of them after the wait
    assert failure_line("wf-1", slow) == f"  wf-1: none failed, but{waited[1:]}"


def test_report_shows_the_stall_its_node_and_time_lost():
    by_node = {"mid": {"invoked": 335, "retried": 1, "timed_out": 1, "failed": 0, "causes": {}}}
    records = [
        {"run_id": "wf-1", "stall_cause": CAUSE, "stalled": True, "stalled_s": 27.0, "failures": {"by_node": by_node}},
        {"run_id": "wf-2", "stall_cause": None, "stalled": False, "failures": None},
    ]
    text = "\n".join(_failures_section(records))
    assert f"- `wf-1`: {CAUSE}" in text and "| wf-1 | mid | 335 | 1 | 1 | 0 |" in text and "wf-2" not in text
    assert "- Stalled (" in "\n".join(_flags_section(records)) and "`wf-1` (27.0 s)" in "\n".join(_flags_section(records))
    assert _failures_section(records[1:]) == []


class _Stalling(BaseHTTPRequestHandler):
    """Answers at once, except that every request that arrives in [stall_from, stall_to) (server clock) waits
    until stall_to: a server that stalls, as a workflow that lost a node's answer does."""

    protocol_version = "HTTP/1.1"

    def do_POST(self):  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        now = time.monotonic()
        if self.server.stall_from <= now < self.server.stall_to:
            time.sleep(self.server.stall_to - now)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


@pytest.fixture
def stalling_server():
    instance = ThreadingHTTPServer(("127.0.0.1", 0), _Stalling)
    instance.daemon_threads = True
    instance.stall_from = instance.stall_to = float("inf")
    with serving(instance):
        yield instance


def test_measure_records_a_stall_and_counts_no_window_after_the_load_stopped(stalling_server, monkeypatch):
    from segserve.bench.run.measure import Endpoint, measure
    from segserve.bench.suite.spec import LoadSettings

    monkeypatch.setattr(stalls_module, "STALL_MIN_S", 0.8)  # a short stall: the test stays cheap
    stalling_server.stall_from = time.monotonic() + 0.6
    stalling_server.stall_to = stalling_server.stall_from + 2.5
    endpoint = Endpoint(f"http://127.0.0.1:{stalling_server.server_address[1]}", "/wfpredict/flow", None, {}, None, ())
    # never stable: the load stops after 0.2 + 4 × 0.3 s, in the stall; its requests are awaited until it ends
    load = LoadSettings(warmup_s=0.2, window_s=0.3, stable_windows=2, max_windows=4, stability_tolerance=1e-9)
    record = measure(endpoint, load, {"concurrency": 3}, [b"x"], None)
    assert record["stalled"] is True, record["window_throughputs_rps"]
    (stall,) = record["stalls"]
    assert stall["in_flight"] == 3 and 2.0 <= stall["to_s"] - stall["from_s"] <= 2.7 and record["stalled_s"] >= 2.0
    # the 2 s awaited after the stop are no windows of 0 req/s
    assert record["windows"] == 4 and record["duration_s"] == pytest.approx(1.2)
