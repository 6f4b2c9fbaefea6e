"""Failed requests attributed (segserve/bench/run/failures.py): by input and status against a small loopback server
that answers 200, 400, 503 or nothing by input; by node from TorchServe's own log lines (a real excerpt)."""

import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from segserve.bench.results.report import _failures_section
from segserve.bench.run.failures import LOG_TIME, TIMED_OUT, LogMark, attributed, failure_line, input_names, merged, node_failures
from segserve.bench.run.inputs import Body, request_bodies
from segserve.bench.run.load import SAMPLE_BYTES, LoadResult, LoadSpec, run_load
from segserve.bench.run.progress import Progress
from segserve.bench.suite.input_spec import InputSpec
from segserve.bench.suite.plan import Point
from tests.conftest import serving

DATA = Path(__file__).parent / "data"
# from a real run (TorchServe 0.12.0): workflow `flow`, first → flaky (timeout-ms 1500, retry-attempts 1), five requests
# one after the other: fine, bad (a 400 row: /wfpredict answers 200), boom (flaky raises), hang (flaky sleeps 4 s), fine
TS_LOG = (DATA / "workflow_failures.ts_log.log").read_text()
MODEL_LOG = (DATA / "workflow_failures.model_log.log").read_text()
BUSY = b'{"code": 503, "message": "' + b"x" * 400 + b'"}'  # longer than a sample keeps
# what TorchServe logs for one request failed at node flaky: the cause, then the failure
ONE_FAILURE = [next(line for line in TS_LOG.splitlines() if mark in line) for mark in ("flaky : ", "Error executing flaky")]
WORKFLOW_500 = b'{\n  "code": 500,\n  "type": "InternalServerException",\n  "message": "Error executing flaky"\n}\n'


class _Handler(BaseHTTPRequestHandler):
    """By body: ok → 200, bad → 400 with a JSON error, busy → 503, boom → TorchServe's 500 of a workflow node (and
    the log lines TorchServe writes for it, when the server has a logs folder), hang → no answer for 2 s."""

    protocol_version = "HTTP/1.1"

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if body == b"hang":
            time.sleep(2)
        status, answer = {b"bad": (400, b'{"error": "bad input"}'), b"busy": (503, BUSY), b"boom": (500, WORKFLOW_500)}.get(
            body, (200, b"ok")
        )
        if body == b"boom" and self.server.logs:
            with open(self.server.logs / "ts_log.log", "a") as log:
                log.write("\n".join(ONE_FAILURE) + "\n")
        self.send_response(status)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    instance = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    instance.daemon_threads, instance.logs = True, None
    instance.handle_error = lambda *args: None  # a timed-out client closed its end: the late reply's broken pipe
    with serving(instance):
        yield instance


def url(server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def files(tmp_path) -> list[bytes]:
    """Inputs as a suite's files: each body carries its file's name."""
    for name in ("a_ok", "b_bad", "c_busy", "d_hang"):
        (tmp_path / f"{name}.bin").write_bytes(name.split("_")[1].encode())
    return request_bodies([InputSpec(files=[str(tmp_path / "*.bin")])])


def test_every_failed_request_is_counted_by_its_file_and_status_with_one_sample_of_each_kind(server, files):
    result = run_load(LoadSpec(url=url(server), path="/p", bodies=files, concurrency=4, timeout_s=0.3), duration_s=0.8)
    failures = attributed(result, input_names(files), timeout_s=0.3)
    failed = [s for s in result.status if not 200 <= s < 300]
    assert sum(failures["by_status"].values()) == len(failed) == len(result.failed) > 0
    statuses = {"b_bad.bin": "400", "c_busy.bin": "503", "d_hang.bin": "timeout"}
    counted = {
        name: sum(1 for s in result.status if s == code) for name, code in (("b_bad.bin", 400), ("c_busy.bin", 503), ("d_hang.bin", -1))
    }
    assert failures["by_input"] == counted and "a_ok.bin" not in failures["by_input"]
    assert failures["by_status"] == {statuses[name]: count for name, count in counted.items()}
    samples = {row["input"]: row for row in failures["samples"]}
    assert {name: row["status"] for name, row in samples.items()} == statuses
    assert samples["b_bad.bin"]["body"] == '{"error": "bad input"}'
    assert samples["c_busy.bin"]["body"] == BUSY[:SAMPLE_BYTES].decode() and len(BUSY) > SAMPLE_BYTES
    assert samples["d_hang.bin"]["body"] == "(no answer within 0.3 s)"
    assert all(samples[name]["count"] == count for name, count in counted.items())
    assert len(result.samples) == 3  # the first answer of each kind only


def test_a_closed_port_gives_connection_errors_with_the_reason_and_plain_bodies_are_named_by_index():
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    bodies = [b"x", b"y"]
    result = run_load(LoadSpec(url=f"http://127.0.0.1:{port}", path="/p", bodies=bodies), duration_s=0.2)
    failures = attributed(result, input_names(bodies))
    assert failures["by_status"] == {"connection_error": len(result.status)}
    assert set(failures["by_input"]) <= {"#0", "#1"} and sum(failures["by_input"].values()) == len(result.status)
    assert failures["samples"][0]["body"].startswith("ConnectionRefusedError")


def test_names_two_files_share_get_their_index():
    bodies = [Body(b"1", "application/octet-stream", "x.jpg"), Body(b"2", "application/octet-stream", "x.jpg"), b"3"]
    assert input_names(bodies) == ["x.jpg#0", "x.jpg#1", "#2"]


def test_load_processes_merge_the_failures_and_a_named_body_survives_the_trip(server, files):
    from segserve.bench.run.load_processes import run_load_processes

    spec = LoadSpec(url=url(server), path="/p", bodies=files[:3], concurrency=2, timeout_s=1.0)
    # until both processes' failures are in (a process's start takes seconds on a busy machine)
    result = run_load_processes(spec, 60, 2, lambda so_far: len(so_far.samples) == 2 and len(so_far.failed) >= 6, 0.2)
    failures = attributed(result, input_names(files[:3]))
    assert failures["by_input"] == {"b_bad.bin": result.status.count(400), "c_busy.bin": result.status.count(503)}
    assert result.status.count(400) > 0 and result.status.count(503) > 0
    assert sorted(failures["by_status"]) == ["400", "503"] and len(result.samples) == 2
    assert [end_s for end_s, _, _ in result.failed] == sorted(result.end_s[i] for i, s in enumerate(result.status) if s != 200)


def test_a_window_keeps_its_own_failures_and_their_samples():
    result = LoadResult()
    result.record(0.0, 0.5, 200, 0)
    result.record(0.0, 0.6, 503, 1, b"busy")
    result.record(0.0, 1.5, 400, 2, b"bad")
    window = result.window(1.0, 2.0)
    assert window.failed == [(1.5, 400, 2)] and window.samples == {(400, 2): b"bad"}
    failures = attributed(window, ["a", "b", "c"], whole=result)
    assert failures["by_status"] == {"400": 1} and failures["outside_windows"] == {"503": 1}


def test_the_frontend_log_names_the_node_that_failed_how_often_and_why():
    nodes = node_failures(TS_LOG, MODEL_LOG)
    assert nodes["first"] == {"invoked": 5, "first_attempts": 5, "retried": 0, "timed_out": 0, "failed": 0, "causes": {}}
    flaky = nodes["flaky"]
    # 5 requests reached flaky, three failed after one retry each: boom (raised) and two that waited past timeout-ms
    assert (flaky["invoked"], flaky["first_attempts"], flaky["retried"], flaky["timed_out"], flaky["failed"]) == (8, 5, 3, 2, 3)
    # the two timeouts' retries, in seconds after the first line's time (06:18:59,617): the hang and the last request
    first = datetime.strptime(TS_LOG.split(" ", 1)[0], LOG_TIME).timestamp()
    assert node_failures(TS_LOG, epoch_s=first)["flaky"]["timed_out_at_s"] == [1.544, 4.564]
    assert flaky["causes"] == {"org.pytorch.serve.http.InternalServerException: Prediction failed": 1, TIMED_OUT: 2}
    assert flaky["worker_errors"] == 2 and flaky["worker_error"] == "ValueError: flaky cannot take boom"


def test_a_log_mark_reads_what_was_written_after_it_and_a_rotated_file_whole(tmp_path):
    (tmp_path / "ts_log.log").write_text("before\n")
    mark = LogMark(tmp_path)
    with open(tmp_path / "ts_log.log", "a") as log:
        log.write("after\n")
    assert mark.added("ts_log.log") == "after\n" and mark.added("model_log.log") == ""
    (tmp_path / "ts_log.log").write_text("new\n")  # rotated: shorter than the mark
    assert mark.added("ts_log.log") == "new\n"


def test_measure_puts_the_failures_beside_requests_failed_and_reads_the_nodes_from_the_servers_logs(server, tmp_path):
    from segserve.bench.run.measure import Endpoint, measure
    from segserve.bench.suite.spec import LoadSettings

    server.logs = tmp_path
    bodies = [Body(b"ok", "application/octet-stream", "ok.jpg"), Body(b"boom", "application/octet-stream", "boom.jpg")]
    endpoint = Endpoint(url(server), "/wfpredict/flow", None, {}, None, (), logs=tmp_path)
    load = LoadSettings(warmup_s=0.2, window_s=0.3, stable_windows=2, max_windows=2, stability_tolerance=1.0)
    record = measure(endpoint, load, {"concurrency": 2}, bodies, None)
    failures = record["failures"]
    assert record["requests_failed"] > 0 and failures["by_input"] == {"boom.jpg": record["requests_failed"]}
    assert failures["by_status"] == {"500": record["requests_failed"]} == record["failures_by_status"]
    assert failures["samples"][0]["node"] == "flaky"
    assert failures["by_node"]["flaky"]["failed"] == record["requests_failed"] + sum(failures["outside_windows"].values())


def test_rounds_and_phases_merge_into_one_and_the_terminal_names_the_top_input_status_and_node():
    one = attributed(_result([(500, 0, WORKFLOW_500)] * 2 + [(503, 1, b"busy")]), ["a.jpg", "b.jpg"])
    one["by_node"] = node_failures(TS_LOG)
    two = attributed(_result([(500, 0, b"other")]), ["a.jpg", "b.jpg"])
    both = merged([one, None, two])
    assert both["by_status"] == {"500": 3, "503": 1} and both["by_input"] == {"a.jpg": 3, "b.jpg": 1}
    assert [(row["input"], row["status"], row["count"], row["node"]) for row in both["samples"]] == [
        ("a.jpg", "500", 3, "flaky"),
        ("b.jpg", "503", 1, None),
    ]
    assert both["by_node"]["flaky"]["failed"] == 3 and merged([None]) is None
    line = failure_line("wf-1", both)
    assert line == (
        f"  wf-1: 4 request(s) failed; most by status 500 (3), input a.jpg (3), node flaky (3 failed in the frontend's log: {TIMED_OUT})"
    )
    assert failure_line("wf-2", None) is None


def test_the_report_has_one_row_per_kind_with_its_sample_and_one_per_failing_node():
    failures = attributed(_result([(500, 0, WORKFLOW_500), (-1, 1, b"")]), ["a.jpg", "b.jpg"], timeout_s=30)
    failures["by_node"] = node_failures(TS_LOG, MODEL_LOG)
    text = "\n".join(_failures_section([{"run_id": "wf-1", "failures": failures}, {"run_id": "ok-1", "failures": None}]))
    assert "## Failed requests" in text
    assert (
        '| wf-1 | a.jpg | 500 | flaky | 1 | { "code": 500, "type": "InternalServerException", "message": "Error executing flaky" } |'
        in text
    )
    assert "| wf-1 | b.jpg | timeout | – | 1 | (no answer within 30 s) |" in text
    assert "| wf-1 | flaky | 8 | 3 | 2 | 3 |" in text and "ValueError: flaky cannot take boom" in text
    assert "| wf-1 | first |" not in text  # invoked, never failed
    assert _failures_section([{"run_id": "ok-1", "failures": None}]) == []


# what a handler may answer or raise: Markdown, HTML, ANSI escapes, a CR LF and a line separator (issue 64)
HOSTILE = "a|b <script>alert(1)</script> \x1b[31mred\x1b[0m\r\nnext ![i](http://evil.example/i.png)\u2028`x` *y*"
HOSTILE_SHOWN = r"a\|b &lt;script&gt;alert(1)&lt;/script&gt; \\x1b\[31mred\\x1b\[0m next !\[i\](http://evil.example/i.png) \`x\` \*y\*"


def test_answers_worker_errors_and_file_names_are_shown_literally_in_the_report_and_on_the_terminal():
    failures = attributed(_result([(500, 0, HOSTILE.encode())]), ["x\x1b[2J.jpg"], timeout_s=30)
    failures["by_node"] = node_failures(TS_LOG, MODEL_LOG.replace("flaky cannot take boom", HOSTILE.replace("\r\n", " ")))
    lines = _failures_section([{"run_id": "wf-1", "failures": failures}])
    text = "\n".join(lines)
    assert not any(raw in text for raw in ("\x1b", "\r", "\u2028", "<script>", "![i]")), text
    assert f"| wf-1 | x\\\\x1b\\[2J.jpg | 500 | – | 1 | {HOSTILE_SHOWN} |" in text.splitlines(), text  # one row, cells whole
    worker_error = HOSTILE_SHOWN.split(" \\`")[0]  # the log's line ends at the U+2028 (str.splitlines)
    assert (
        f"| 3 | org.pytorch.serve.http.InternalServerException: Prediction failed (1); {TIMED_OUT} (2) | ValueError: {worker_error} |"
        in text
    )
    shown = []
    record = {
        "error": None,
        "throughput_rps": 1.0,
        "latency_p99_ms": 2.0,
        "requests_failed": 1,
        "error_cause": HOSTILE,
        "failures": failures,
    }
    Progress(1, shown.append).step(Point("flow", (), (), (), ()), record, 1.0)
    assert len(shown) == 2 and not any(c in "".join(shown) for c in "\x1b\r\n\u2028"), shown
    assert "1 failed: a|b <script>alert(1)</script> \\x1b[31mred\\x1b[0m next ![i]" in shown[0]  # readable, inert
    assert "input x\\x1b[2J.jpg (1)" in shown[1], shown


def _result(failures: list[tuple[int, int, bytes]]) -> LoadResult:
    result = LoadResult()
    for k, (status, index, body) in enumerate(failures):
        result.record(0.0, 0.1 * k, status, index, body)
    return result
