"""Lost answers (segserve/bench/run/lost_answers.py): a workflow node first attempted more often than its children
were, less what it (or a branch beside it) failed and what was still in flight when the load ended, named with the
timeout-ms its request waits; from synthetic by-node counts, TorchServe's own log excerpts, a .war's spec read as
TorchServe reads it, and a loopback server that writes the frontend's log lines and drops one answer."""

import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from segserve.archives.war import war_of
from segserve.bench.run.failures import node_failures
from segserve.bench.run.load import CONNECTION_ERROR, TIMEOUT, LoadResult
from segserve.bench.run.lost_answers import lost_answers, lost_cause, point_lost
from segserve.bench.run.measure import Endpoint, measure
from segserve.bench.run.stalls import stall_cause
from segserve.bench.suite.spec import LoadSettings
from tests.conftest import serving

DATA = Path(__file__).parent / "data"
CHAIN = {"pre_processing": ["cat_dog_classification"], "cat_dog_classification": []}
# TorchServe's dog-breed example: a function node first, two model nodes, a join
DOG_BREED = {"pre_processing": ["cat", "breed"], "cat": ["post"], "breed": ["post"], "post": []}
RACE = "TorchServe's DagExecutor race, docs/torchserve_workflows.md"
STAMP = "2026-12-05T06:18:12,251 [INFO ] wf-execute-thread-0"  # a ts_log.log line's time, level and thread


def counts(invoked: int, retried: int = 0, failed: int = 0, **more) -> dict:
    return {"invoked": invoked, "retried": retried, "timed_out": 0, "failed": failed, "causes": {}, **more}


def test_a_node_invoked_more_often_than_its_child_was_first_attempted_lost_that_many_answers():
    # the run: pre_processing invoked 190 times, cat_dog_classification attempted 189
    by_node = {"pre_processing": counts(190), "cat_dog_classification": counts(189)}
    assert lost_answers(by_node, CHAIN) == {"pre_processing": 1}
    # the requests still in flight when the load ended may still be at the node: not counted lost
    assert lost_answers(by_node, CHAIN, in_flight=1) == {}
    # the rows the node failed went no further: 3 failed of 190, 186 reached the child, 1 lost
    assert lost_answers({**by_node, "pre_processing": counts(190, failed=3), "cat_dog_classification": counts(186)}, CHAIN) == {
        "pre_processing": 1
    }
    # retries are not requests: first attempts count (192 invocations, 2 of them retries that then answered)
    retried = {"pre_processing": counts(192, retried=2, first_attempts=190), "cat_dog_classification": counts(190)}
    assert lost_answers(retried, CHAIN) == {}
    # a record from before first attempts were counted: invocations less retries
    assert lost_answers({"pre_processing": counts(192, retried=2), "cat_dog_classification": counts(189)}, CHAIN) == {"pre_processing": 1}


def test_a_join_that_the_counts_cannot_tell_apart_is_named_with_both_parents_and_a_branchs_failure_is_no_loss():
    by_node = {"pre_processing": counts(100), "cat": counts(99), "breed": counts(99), "post": counts(97)}
    # pre_processing → cat: exact; cat and breed feed only the join: its shortfall is one of theirs
    assert lost_answers(by_node, DOG_BREED) == {"pre_processing": 1, "cat or breed": 2}
    # breed failed 2 rows: the executor stops those requests, so the join never saw them, and cat lost nothing
    failed = {**by_node, "breed": counts(99, failed=2)}
    assert lost_answers(failed, DOG_BREED) == {"pre_processing": 1}


def test_real_logs_a_recovered_answer_and_failed_rows_are_not_lost_answers():
    # workflow_failures: first → flaky, 3 of 5 requests failed at flaky (the leaf): nothing lost
    assert lost_answers(node_failures((DATA / "workflow_failures.ts_log.log").read_text()), {"first": ["flaky"], "flaky": []}) == {}
    # workflow_race: pre_processing's answer lost and recovered by the retry after timeout-ms: cat_dog then attempted
    race = node_failures((DATA / "workflow_race.ts_log.log").read_text())
    assert race["pre_processing"]["first_attempts"] == race["cat_dog_classification"]["first_attempts"] == 2  # each line twice
    assert lost_answers(race, CHAIN) == {}
    # the same log cut before the wait ended: the answer is lost
    cut = (DATA / "workflow_race.ts_log.log").read_text().split("06:23:12")[0]
    assert lost_answers(node_failures(cut), CHAIN) == {"pre_processing": 2}


def test_the_cause_names_the_node_and_the_timeout_ms_its_request_waits_against_the_client_and_the_load():
    timeouts_ms = {"pre_processing": 300000, "cat_dog_classification": 300000}
    said = lost_cause({"pre_processing": 1}, timeouts_ms, 30.0, 95.0, 1)
    assert said.startswith(f"1 answer of pre_processing lost ({RACE}); its request waits timeout-ms 300000")
    assert "longer than the client's timeout (30 s) and than the load (95 s, so no retry came within it)" in said
    assert "segserve fuse" in said
    # a node timeout below the client's and the load's: only the wait
    assert "longer than" not in lost_cause({"pre_processing": 2}, {"pre_processing": 10000}, 30.0, 95.0, 0)
    # none counted lost (a leaf's, say), but requests waited past the client's timeout and no timeout-ms had passed
    waited = lost_cause({}, {"pre_processing": 300000, "cat_dog_classification": 10000}, 30.0, 600.0, 2)
    assert waited.startswith("2 request(s) waited past the client's timeout (30 s) while no node's timeout-ms had passed")
    assert "timeout-ms of pre_processing 300000;" in waited and "cat_dog_classification" not in waited
    assert lost_cause({}, {"pre_processing": 10000}, 30.0, 600.0, 2) is None and lost_cause({}, timeouts_ms, 30.0, 600.0, 0) is None


def test_a_stall_with_timeout_ms_longer_than_the_client_is_connected_to_the_by_node_counts():
    stall = [{"from_s": 6.0, "to_s": 36.0, "in_flight": 8}]
    failures = {"by_node": {"pre_processing": counts(190), "cat_dog_classification": counts(189)}}  # no timeout-ms passed
    lost = lost_cause(lost_answers(failures["by_node"], CHAIN), {"pre_processing": 300000}, 30.0, 95.0, 1)
    cause = stall_cause(stall, failures, 30.0, lost)
    stalled = "stalled 30 s: requests in flight and none completed at 6.0–36.0 s (8 waiting) of the load"
    assert cause.startswith(f"{stalled}: 1 answer of pre_processing lost ({RACE}); its request waits timeout-ms 300000")
    assert "names no node" not in cause


def _war(spec: dict, functions_file: str | None = None):
    return war_of(Path("dog_breed_wf.war"), "dog_breed_wf", "spec.yaml", spec, functions_file)


def test_a_point_counts_in_flight_at_the_end_and_reads_each_nodes_timeout_ms_as_torchserve_does():
    # the function node takes the workflow's last timeout-ms; the model node the top-level value read so far (none yet)
    war = _war({"models": {"cat_dog_classification": {"url": "cat.mar"}, "timeout-ms": 300000}, "dag": CHAIN}, "handler.py")
    timeouts_ms = {name: node.settings["timeout-ms"] for name, node in war.nodes.items()}
    assert timeouts_ms == {"pre_processing": 300000, "cat_dog_classification": 10000}
    failures = {"by_node": {"pre_processing": counts(190), "cat_dog_classification": counts(187)}}
    result = LoadResult()
    # the load stopped at 60 s: two requests waited the client's whole timeout (their answers lost), one was cut
    records = ((1.0, 1.1, 200), (5.0, 35.0, TIMEOUT), (58.0, 88.0, TIMEOUT), (59.5, 60.2, CONNECTION_ERROR))
    for sent_s, end_s, status in records:
        result.record(sent_s, end_s, status)
    result.wall_s = 88.0
    lost = point_lost(war, failures, result, stopped_s=60.0, timeout_s=30.0)
    assert lost["lost_answers"] == {"pre_processing": 2}  # 3 short, 1 of them cut in flight when the load ended
    assert lost["lost_cause"].startswith(f"2 answers of pre_processing lost ({RACE}); its request waits timeout-ms 300000, longer than")
    assert point_lost(None, failures, result, 60.0, 30.0) == {"lost_answers": None, "lost_cause": None}  # not a workflow


class _Losing(BaseHTTPRequestHandler):
    """A workflow as TorchServe's frontend logs it: each request invokes pre, then cat; the second request's answer
    of pre is lost (cat never invoked, the client gets nothing)."""

    protocol_version = "HTTP/1.1"

    def do_POST(self):  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        server = self.server
        with server.lock:
            server.requests += 1
            lost = server.requests == 2
            at = f"{STAMP} org.pytorch.serve.ensemble.DagExecutor - Invoking -  {{}} for attempt 0\n"
            with open(server.logs / "ts_log.log", "a") as log:
                log.write(at.format("pre") + ("" if lost else at.format("cat")))
        if lost:
            time.sleep(3)  # past the client's timeout; TorchServe would wait its timeout-ms
            return
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


@pytest.fixture
def losing_server(tmp_path):
    import threading

    instance = ThreadingHTTPServer(("127.0.0.1", 0), _Losing)
    instance.daemon_threads, instance.logs, instance.requests, instance.lock = True, tmp_path, 0, threading.Lock()
    instance.handle_error = lambda *args: None  # the timed-out client closed its end
    (tmp_path / "ts_log.log").write_text("")
    with serving(instance):
        yield instance


def test_measure_records_the_lost_answer_of_a_workflow_point(losing_server, tmp_path):
    war = _war({"models": {"timeout-ms": 300000, "pre": {"url": "pre.mar"}, "cat": {"url": "cat.mar"}}, "dag": {"pre": ["cat"]}})
    url = f"http://127.0.0.1:{losing_server.server_address[1]}"
    endpoint = Endpoint(url, "/wfpredict/wf", None, {}, None, (), logs=tmp_path, workflow=war)
    load = LoadSettings(warmup_s=0.2, window_s=0.3, stable_windows=2, max_windows=4, stability_tolerance=1e-9, timeout_s=0.5)
    record = measure(endpoint, load, {"concurrency": 2}, [b"x"], None)
    assert record["failures_by_status"] == {"timeout": 1} or record["failures"]["outside_windows"] == {"timeout": 1}
    assert record["lost_answers"] == {"pre": 1}
    waits = "its request waits timeout-ms 300000, longer than the client's timeout (0.5 s)"
    assert record["lost_cause"].startswith(f"1 answer of pre lost ({RACE}); {waits}")


def test_the_progress_line_says_the_lost_answers_and_rounds_add_them_up():
    from segserve.bench.run.progress import Progress
    from segserve.bench.run.rounds import combine_rounds
    from segserve.bench.suite.plan import Point

    cause = f"1 answer of pre lost ({RACE})"
    lines = []
    record = {"error": None, "throughput_rps": 10.2, "latency_p99_ms": 84.0, "lost_cause": cause, "lost_answers": {"pre": 1}}
    Progress(1, lines.append).step(Point("wf", (), (), (), ()), record, 1.0)
    assert f"ANSWERS LOST ({cause})" in lines[0]
    rounds = [record | {"measured_window_throughputs_rps": [10.0]}, record | {"lost_answers": {"pre": 2, "cat": 1}}]
    combined = combine_rounds(rounds)
    assert combined["lost_answers"] == {"pre": 3, "cat": 1} and combined["lost_cause"] == cause
