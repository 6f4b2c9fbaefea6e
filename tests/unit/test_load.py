"""The load generator against a small real HTTP/1.1 server on loopback: what it sends, what it records."""

import socket
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from segserve.bench.run.load import LoadResult, LoadSpec, arrival_schedule, run_load
from tests.conftest import serving


class _Handler(BaseHTTPRequestHandler):
    """Body b"bad" → 400, b"sleep:S" → sleep S seconds, b"chunked" → a chunked reply (b"chunked400": a chunked 400),
    b"close" → Connection: close,
    b"drop" → a normal keep-alive reply, then the connection is closed without notice."""

    protocol_version = "HTTP/1.1"  # keep-alive
    disable_nagle_algorithm = True  # headers and body go out in two writes; Nagle would hold the body for the client's ACK

    def setup(self):
        super().setup()
        with self.server.lock:
            self.server.connections += 1

    def do_POST(self):
        server = self.server
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with server.lock:
            server.bodies.append(body)
            server.authorizations.append(self.headers.get("Authorization"))
            server.in_flight += 1
            server.max_in_flight = max(server.max_in_flight, server.in_flight)
        time.sleep(float(body[6:]) if body.startswith(b"sleep:") else server.delay_s)
        # Leave the in-flight count before replying: once the reply is out the client may already send its next request.
        with server.lock:
            server.in_flight -= 1
        self.send_response(400 if body in (b"bad", b"chunked400") else 200)
        if body.startswith(b"chunked"):
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.write(b"2\r\nok\r\n3;ext=1\r\nabc\r\n0\r\nX-Trailer: 1\r\n\r\n")
            return
        if body == b"close":
            self.send_header("Connection", "close")
        self.close_connection = body in (b"close", b"drop")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.bodies: list[bytes] = []
        self.authorizations: list[str | None] = []
        self.connections = self.in_flight = self.max_in_flight = 0
        self.delay_s = 0.0
        self.url = f"http://127.0.0.1:{self.server_address[1]}"

    def handle_error(self, request, client_address):
        pass  # a client that timed out closed its end; the late reply's broken pipe is expected


@pytest.fixture
def server():
    instance = _Server()
    with serving(instance):
        yield instance


def spec(url: str, bodies=(b"x",), **kwargs) -> LoadSpec:
    return LoadSpec(url=url, path="/predictions/seg", bodies=list(bodies), **kwargs)


def test_closed_loop_sends_bodies_round_robin_with_the_token(server):
    result = run_load(spec(server.url, [b"a", b"b", b"c"], token="tok"), duration_s=0.3)
    n = len(result.status)
    assert n > 0
    assert result.status == [200] * n
    assert server.bodies == [[b"a", b"b", b"c"][i % 3] for i in range(n)]
    assert set(server.authorizations) == {"Bearer tok"}
    assert result.latency_ms == pytest.approx([(end - sent) * 1000 for sent, end in zip(result.intended_s, result.end_s, strict=True)])


def test_closed_loop_keeps_at_most_concurrency_in_flight(server):
    server.delay_s = 0.01
    result = run_load(spec(server.url, [b"a", b"b", b"c", b"d"], concurrency=3), duration_s=0.5)
    assert 2 <= server.max_in_flight <= 3  # at least 2: the connections really did overlap
    assert len(server.bodies) == len(result.status)  # requests in flight at the stop were awaited and recorded
    counts = Counter(server.bodies)
    assert max(counts.values()) - min(counts.values()) <= 1  # one round-robin counter across connections
    assert server.connections == 3  # keep-alive: no reconnects


def test_chunked_replies_and_connection_close_are_followed(server):
    result = run_load(spec(server.url, [b"chunked", b"close", b"plain"]), duration_s=0.3)
    n = len(result.status)
    assert n >= 3
    assert result.status == [200] * n  # a misread chunked body would break the next reply on the connection
    assert len(server.bodies) == n
    assert server.connections == 1 + server.bodies.count(b"close") - (server.bodies[-1] == b"close")


def test_a_kept_alive_connection_closed_without_notice_is_reopened_and_the_request_resent(server):
    result = run_load(spec(server.url, [b"drop", b"plain"]), duration_s=0.3)
    n = len(result.status)
    assert n >= 2
    assert result.status == [200] * n
    # Each request after a drop was resent on a new connection, so the server saw every one answered exactly once.
    assert server.bodies == [[b"drop", b"plain"][i % 2] for i in range(n)]
    assert server.connections == 1 + server.bodies.count(b"drop") - (server.bodies[-1] == b"drop")


def test_open_loop_constant_rate_sends_rate_times_duration(server):
    result = run_load(spec(server.url, concurrency=4, request_rate_rps=100), duration_s=0.5)
    assert abs(len(result.status) - 100 * 0.5) <= 5
    assert sorted(result.intended_s) == arrival_schedule(100, 0.5)
    assert all(result.ok)


def test_open_loop_latency_counts_queueing_from_the_intended_time(server):
    # The server takes 40 ms a request but they are due every 20 ms on one connection: a queue builds up.
    server.delay_s = 0.04
    result = run_load(spec(server.url, concurrency=1, request_rate_rps=50), duration_s=0.6)
    assert result.intended_s == arrival_schedule(50, 0.6)  # all 30 due requests sent, in order, none dropped
    assert all(result.ok)
    third = len(result.latency_ms) // 3
    early, late = result.latency_ms[:third], result.latency_ms[-third:]
    # the queue grows 20 ms a request: about 400 ms between the thirds' means (a late start adds to both)
    assert sum(late) / third - sum(early) / third > 200
    assert result.latency_ms[-1] > result.latency_ms[0] + 200


def test_open_loop_drain_after_the_stop_is_bounded_by_timeout(server):
    # Every reply takes 1 s but times out at 0.25 s; requests due before the stop are still sent and recorded.
    result = run_load(spec(server.url, [b"sleep:1"], concurrency=1, request_rate_rps=50, timeout_s=0.25), duration_s=0.3)
    assert result.status_counts() == {"timeout": len(arrival_schedule(50, 0.3))}
    # timed from the intended time, plus slack for a busy machine: unbounded, they would take 1000 ms
    assert all(latency_ms <= 250 + 400 for latency_ms in result.latency_ms)
    assert result.wall_s < 0.3 + 0.25 + 0.5


def test_poisson_schedule_is_reproducible_by_seed():
    first = arrival_schedule(100, 2.0, "poisson", seed=1)
    assert first == arrival_schedule(100, 2.0, "poisson", seed=1)
    assert first != arrival_schedule(100, 2.0, "poisson", seed=2)
    assert 140 <= len(first) <= 260
    assert first == sorted(first) and 0 <= first[0] and first[-1] < 2.0
    gaps = {round(b - a, 9) for a, b in zip(first, first[1:], strict=False)}
    assert len(gaps) > len(first) // 2  # exponential gaps, not a constant step


def test_constant_schedule_is_evenly_spaced():
    assert arrival_schedule(4, 1.0) == [0.0, 0.25, 0.5, 0.75]
    with pytest.raises(ValueError, match="arrival must be one of"):
        arrival_schedule(4, 1.0, "bursty")


def test_error_statuses_are_counted(server):
    result = run_load(spec(server.url, [b"ok", b"bad"]), duration_s=0.3)
    counts = result.status_counts()
    assert set(counts) == {"200", "400"}
    assert counts["400"] >= 1 and abs(counts["200"] - counts["400"]) <= 1
    assert result.ok == [status == 200 for status in result.status]


def test_a_failed_request_keeps_its_input_and_the_first_answer_of_its_kind_a_success_nothing(server):
    result = run_load(spec(server.url, [b"plain", b"chunked400", b"bad"]), duration_s=0.3)
    failed = [(status, index) for _, status, index in result.failed]
    assert failed == [(400, [b"plain", b"chunked400", b"bad"].index(body)) for body in server.bodies if body != b"plain"]
    assert [end_s for end_s, _, _ in result.failed] == [end for end, s in zip(result.end_s, result.status, strict=True) if s != 200]
    # a chunked body's chunks joined, the connection still in step for the next request (all answered)
    assert result.samples == {(400, 1): b"okabc", (400, 2): b"ok"} and len(result.status) == len(server.bodies) >= 3


def test_a_slow_reply_is_recorded_as_a_timeout(server):
    result = run_load(spec(server.url, [b"sleep:0.8"], timeout_s=0.15), duration_s=0.2)
    assert result.status_counts() == {"timeout": len(result.status)}
    assert len(result.status) >= 1
    assert all(latency_ms < 800 for latency_ms in result.latency_ms)


def test_a_closed_port_is_recorded_as_connection_errors():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens once the probe closes
    result = run_load(spec(f"http://127.0.0.1:{port}"), duration_s=0.2)
    assert result.status_counts() == {"connection_error": len(result.status)}
    assert len(result.status) >= 1


def test_open_loop_to_a_closed_port_records_every_scheduled_request():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = run_load(spec(f"http://127.0.0.1:{port}", request_rate_rps=50), duration_s=0.2)
    assert result.status_counts() == {"connection_error": len(arrival_schedule(50, 0.2))}


def test_stop_early_ends_the_run_before_duration(server):
    seen: list[LoadResult] = []

    def enough(so_far: LoadResult) -> bool:
        seen.append(so_far)
        return len(so_far.status) >= 5

    result = run_load(spec(server.url), duration_s=20, stop_early=enough, check_every_s=0.05)
    assert result.wall_s < 10
    assert len(seen[-1].status) >= 5 and len(result.status) >= len(seen[-1].status)
    assert all(len(earlier.status) < 5 for earlier in seen[:-1])


def test_window_keeps_requests_that_ended_inside_it():
    result = LoadResult([0.0, 0.5, 1.0, 2.0], [0.5, 1.0, 2.5, 3.0], [500, 500, 1500, 1000], [200, 0, -1, 200], wall_s=4.0, client_cpu_s=2.0)
    window = result.window(1.0, 3.0)  # end_s 1.0 is in, 3.0 is out
    assert window.end_s == [1.0, 2.5]
    assert window.intended_s == [0.5, 1.0] and window.latency_ms == [500, 1500]
    assert window.status_counts() == {"connection_error": 1, "timeout": 1}
    assert window.wall_s == 2.0 and window.client_cpu_s == pytest.approx(1.0)
    assert result.ok == [True, False, False, True]


def batched(batch: int, every_s: float, until_s: float, phase_s: float = 0.0) -> LoadResult:
    """A server that answers `batch` requests at once every `every_s` seconds (a batch of 8 spans 1 ms)."""
    ends = [phase_s + k * every_s + i * 0.000125 for k in range(int(until_s / every_s)) for i in range(batch)]
    return LoadResult(ends, ends, [0.0] * len(ends), [200] * len(ends), wall_s=until_s)


@pytest.mark.parametrize("phase_s", [0.0, 0.03, 0.07, 0.1])
def test_a_window_rate_does_not_depend_on_where_its_edges_fall_between_batches(phase_s):
    result = batched(8, 0.125, 3.0, phase_s)  # 64 req/s, in lumps of 8
    rates = [result.rate_rps(0.3 + k * 0.6, 0.9 + k * 0.6) for k in range(3)]
    assert rates == pytest.approx([64.0] * 3, rel=0.01)
    # fixed edges count 32 or 40 of them: 53 or 67 req/s
    fixed = {sum(result.window(0.3 + k * 0.6, 0.9 + k * 0.6).ok) / 0.6 for k in range(3)}
    assert fixed & {40 / 0.6, 32 / 0.6} and not fixed & {64.0}


def test_a_window_rate_counts_successes_only_and_is_zero_without_any():
    ends = [0.1 * k for k in range(1, 30)]
    status = [200 if k % 2 else 500 for k in range(1, 30)]  # every other request fails: 5 successes a second
    result = LoadResult(ends, ends, [0.0] * len(ends), status, wall_s=3.0)
    assert result.rate_rps(0.5, 2.5) == pytest.approx(5.0)
    assert result.rate_rps(3.5, 4.0) == 0.0


@pytest.mark.parametrize("url", ["http://10.1.2.3:8080", "http://example.com", "https://127.0.0.1:8443"])
def test_non_loopback_or_non_http_urls_are_refused(url):
    with pytest.raises(ValueError, match="give a"):
        spec(url)


def test_loopback_names_are_accepted():
    for url in ["http://127.0.0.1:8080", "http://localhost:8080", "http://[::1]:8080"]:
        assert spec(url).url == url


@pytest.mark.parametrize("stop_early", [None, lambda result: False])
def test_waiting_for_a_slow_server_does_not_spin(server, stop_early):
    # A loop that polls instead of sleeping would burn a whole core here and make the client the bottleneck.
    server.delay_s = 0.3
    result = run_load(spec(server.url), duration_s=1.5, stop_early=stop_early, check_every_s=0.1)
    assert len(result.status) >= 2
    assert result.client_cpu_s < 0.3 * result.wall_s


def test_load_over_processes_merges_their_requests_on_one_clock_and_stops_them_together(server):
    """Several processes share a point's connections (#49: one process fills a core near 3,000 req/s of the seed's
    body): their requests come back as one result in completion order, and stop_early stops them all."""
    from segserve.bench.run.load_processes import live_pids, run_load_processes, split

    server.delay_s = 0.005
    result = run_load_processes(spec(server.url, [b"a", b"b"], concurrency=4), duration_s=1.5, processes=2)
    assert len(result.status) > 20 and all(result.ok) and result.end_s == sorted(result.end_s)
    assert server.connections >= 4 and server.max_in_flight <= 4  # two processes, two connections each
    assert 0 < result.end_s[0] and result.end_s[-1] <= result.wall_s and result.client_cpu_s > 0
    first_s = result.end_s[0]  # a process takes up to a second to start on a busy machine
    assert result.rate_rps(first_s, first_s + 0.2) > 0
    checks = []
    stopped = run_load_processes(
        spec(server.url, concurrency=2), duration_s=30, processes=2,
        stop_early=lambda r: checks.append(len(r.status)) or checks[-1] > 0, check_every_s=0.3,
    )  # fmt: skip
    assert stopped.wall_s < 10 and checks[-1] > 0 and checks[:-1] == [0] * (len(checks) - 1)  # stopped at the first True
    assert live_pids() == set()  # every load process joined
    open_loop = split(spec(server.url, concurrency=5, request_rate_rps=100.0), 2)
    assert [(s.concurrency, s.request_rate_rps, s.seed) for s in open_loop] == [(3, 50.0, 0), (2, 50.0, 1)]
    with pytest.raises(ValueError, match="at most one process a connection"):
        split(spec(server.url, concurrency=1), 2)
