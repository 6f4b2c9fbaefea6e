"""TorchServe.scale against a loopback management endpoint that fails the way TorchServe 0.12 does under load."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from segserve.errors import RuntimeFailure
from segserve.serving.server import TorchServe

CME = b'{"code": 500, "type": "ConcurrentModificationException", "message": null}'


@pytest.fixture
def management(tmp_path):
    """A management endpoint that answers the first `failures[0]` PUTs with `failures[1]`, then 200."""
    state = {"puts": [], "failures": (0, b"")}

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self):  # noqa: N802 (http.server's naming)
            state["puts"].append(self.path)
            count, body = state["failures"]
            status, body = (500, body) if len(state["puts"]) <= count else (200, b'{"status": "ok"}')
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.properties").write_text(f"management_address=http://127.0.0.1:{httpd.server_address[1]}\n")
    (run_dir / "key_file.json").write_text(json.dumps({"management": {"key": "k"}, "inference": {"key": "i"}}))
    server = TorchServe(run_dir=run_dir, model_store=tmp_path, config_template=run_dir / "config.properties")
    # no workers here, so no log: a failure's cause is not waited for (a real server's log can lag its answer by
    # seconds: management.worker_exception waits 5 s for it)
    server.worker_exception = lambda since, wait_s=5.0: None
    try:
        yield server, state
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_scale_retries_a_concurrent_modification_500(management):
    server, state = management
    state["failures"] = (2, CME)
    assert server.scale("seg_jpeg__seg", 2).status == 200
    assert state["puts"] == ["/models/seg_jpeg__seg?min_worker=2&max_worker=2&synchronous=true"] * 3


def test_scale_retries_the_null_pointer_500_of_a_worker_shut_down_between_batches(management):
    server, state = management
    message = 'Cannot invoke \\"org.pytorch.serve.job.Job.isControlCmd()\\" because \\"job\\" is null'
    state["failures"] = (1, f'{{"code": 500, "type": "NullPointerException", "message": "{message}"}}'.encode())
    assert server.scale("seg_jpeg__seg", 1).status == 200
    assert len(state["puts"]) == 2


def test_scale_does_not_retry_other_errors(management):
    server, state = management
    state["failures"] = (5, b'{"code": 500, "message": "Worker failed to start"}')
    with pytest.raises(RuntimeFailure, match="scaling seg to 2 worker"):
        server.scale("seg", 2)
    assert len(state["puts"]) == 1


def test_scale_gives_up_after_its_attempts(management):
    server, state = management
    state["failures"] = (100, CME)
    with pytest.raises(RuntimeFailure, match="ConcurrentModificationException"):
        server.scale("seg", 1, attempts=3)
    assert len(state["puts"]) == 3
