"""An http target: an endpoint segserve did not deploy, measured with the same load, windows and report."""

import http.server
import json
import textwrap
import threading

import pytest

from segserve.cli import main


class Endpoint(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the load generator expects
    seen_headers: list[str] = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        Endpoint.seen_headers.append(self.headers.get("Authorization", ""))
        refusing = self.path.endswith("/refusing")  # answers, but never with a result
        body = b'{"code": 503}' if refusing else b'{"ok": true}'
        self.send_response(503 if refusing else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def endpoint():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Endpoint)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/predictions/other"  # /predictions/refusing: 503 only
    finally:
        server.shutdown()
        server.server_close()


def test_an_http_target_is_measured_with_its_headers_and_a_dead_or_refusing_one_fails_without_stopping_the_suite(
    endpoint, tmp_path, monkeypatch, trained_weights, capsys
):
    monkeypatch.setenv("OTHER_TOKEN", "t0ken")
    suite = tmp_path / "other.yaml"
    suite.write_text(
        textwrap.dedent(
            f"""
            targets:
              - name: dead
                url: http://127.0.0.1:1/predictions/nothing
              - name: refusing
                url: {endpoint.replace("/other", "/refusing")}
              - name: other
                url: {endpoint}
                headers: {{Authorization: "Bearer ${{OTHER_TOKEN}}"}}
            inputs: [{{images: ["samples/shapes_0.jpg"]}}]
            grid: {{load: {{concurrency: [2]}}}}
            load: {{warmup_s: 0.3, window_s: 0.5, stable_windows: 2, max_windows: 3, stability_tolerance: 0.5}}
            """
        )
    )
    assert main(["bench", str(suite), "--results", str(tmp_path / "results"), "--weights", str(trained_weights)]) == 0
    (folder,) = (tmp_path / "results" / "other").iterdir()
    rows = {r["target"]: r for r in map(json.loads, (folder / "summary.jsonl").read_text().splitlines())}
    assert rows["dead"]["error"].startswith("RuntimeFailure: http://127.0.0.1:1/predictions/nothing does not answer")
    # answered, but never with a result: a failed point with the statuses, not a valid 0 req/s
    refusing = rows["refusing"]
    assert refusing["error"].startswith("RuntimeFailure: no request completed in "), refusing
    assert refusing["error"].endswith(f"{refusing['requests_failed']} failed (503: {refusing['requests_failed']})")
    assert refusing["valid"] is False and refusing["requests_ok"] == 0 and refusing["throughput_rps"] is None
    # every failed request attributed: its input (the file), its status, the answer it got; in the report and the terminal
    failures = json.loads((folder / "runs" / f"{refusing['run_id']}.json").read_text())["failures"]  # the run JSON's
    assert failures["by_input"] == {"shapes_0.jpg": refusing["requests_failed"]} and failures["by_status"] == {
        "503": refusing["requests_failed"]
    }
    assert failures["samples"] == [
        {"input": "shapes_0.jpg", "status": "503", "count": refusing["requests_failed"], "node": None, "body": '{"code": 503}'}
    ]
    out = capsys.readouterr().out
    assert f"  {refusing['run_id']}: {refusing['requests_failed']} request(s) failed; most by status 503" in out, out
    other = rows["other"]
    assert other["error"] is None and other["requests_ok"] > 0 and other["requests_failed"] == 0
    assert other["server_queue_ms"] is None  # not ours: no TorchServe counters
    assert set(Endpoint.seen_headers) == {"Bearer t0ken", ""}  # the refusing target sends none
    report = (folder / "report.md").read_text()
    assert "## other" in report and f"- `{rows['dead']['run_id']}`: RuntimeFailure" in report
    assert f'| {refusing["run_id"]} | shapes_0.jpg | 503 | – | {refusing["requests_failed"]} | {{"code": 503}} |' in report


def test_a_pruned_point_stops_after_the_window_the_pruner_judged_hopeless(endpoint):
    """measure() asks the pruner after each window; True stops the load there and marks the point `pruned`."""
    from segserve.bench.run.measure import Endpoint as Measured
    from segserve.bench.run.measure import measure
    from segserve.bench.suite.spec import LoadSettings

    url, path = endpoint.rsplit("/predictions", 1)
    target = Measured(url, "/predictions" + path, None, {}, None, ())
    load = LoadSettings(warmup_s=0.2, window_s=0.3, stable_windows=6, max_windows=6, stability_tolerance=0.0001)
    seen: list[list[float]] = []

    def hopeless_after_two(rates: list[float]) -> bool:
        seen.append(list(rates))
        return len(rates) >= 2

    pruned = measure(target, load, {"concurrency": 2}, [b"x"], None, prune=hopeless_after_two)
    assert pruned["pruned"] is True
    assert 2 <= pruned["windows"] < 6  # stopped at the judged window (a check may land just after the next one)
    assert all(r > 0 for r in seen[-1])
    whole = measure(target, load, {"concurrency": 2}, [b"x"], None)
    assert whole["pruned"] is False and whole["windows"] >= 5  # to max_windows (the last may end just short)


def test_a_run_whose_every_point_failed_exits_1_with_the_first_error_and_keeps_its_folder(tmp_path, trained_weights, capsys):
    suite = tmp_path / "dead.yaml"
    suite.write_text(
        textwrap.dedent(
            """
            targets: [{name: dead, url: "http://127.0.0.1:1/predictions/nothing"}]
            inputs: [{images: ["samples/shapes_0.jpg"]}]
            load: {warmup_s: 0.3, window_s: 0.5, stable_windows: 2, max_windows: 3}
            """
        )
    )
    assert main(["bench", str(suite), "--results", str(tmp_path / "results"), "--weights", str(trained_weights)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: every point of this run failed (the first: RuntimeFailure: http://127.0.0.1:1/predictions/nothing"), err
    (folder,) = (tmp_path / "results" / "dead").iterdir()
    assert f"results: {folder}" in err and (folder / "summary.jsonl").is_file()
