"""The peer apps of benchmarks/peers/ (LitServe, Ray Serve, PyTriton) answer segserve's own JPEG bytes.

Each app is started as the benchmark starts it (its venv's Python, --port, in a session of its own), waited for
on its health path, sent the samples, a non-image body and a good one after it, then stopped with SIGTERM to its
process group: every process it started must be gone. segserve's answers come from the fused archive TorchServe
serves (model_store/seg_jpeg_fused.mar), run in process through its handler. `make test-peers` runs these.
"""

import http.client
import os
import signal
import subprocess
import time
import zipfile
from pathlib import Path

import psutil
import pytest
import yaml

from benchmarks.peers.triton_protocol import INFER_PATH, READY_PATH, triton_answer, triton_request
from handlers.pipeline import PipelineHandler
from segserve.model.worker_context import worker_context
from segserve.serving.ts_config import free_port, release_ports

pytestmark = [pytest.mark.long, pytest.mark.peers]

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = sorted((ROOT / "samples").glob("*.jpg"))
FUSED_ARCHIVE = ROOT / "model_store" / "seg_jpeg_fused.mar"
HEALTH = {"litserve": "/health", "ray": "/health", "triton": READY_PATH}
# small batches and a short wait: the test checks answers, not throughput
KNOBS = {
    "litserve": ["--max-batch-size", "4", "--batch-timeout-s", "0.01", "--workers", "1"],
    "ray": ["--max-batch-size", "4", "--batch-timeout-s", "0.01", "--workers", "1"],
    "triton": ["--max-batch-size", "4", "--batch-timeout-s", "0.001", "--workers", "1"],
}
STARTUP_TIMEOUT_S = 300  # int8: its program built, then each batch size compiled (~2 min on 2 cores)
STOP_TIMEOUT_S = 30
NOT_AN_IMAGE = b"this is not an image"


@pytest.fixture(scope="module")
def segserve_answers(tmp_path_factory) -> dict[str, bytes]:
    """Sample name → the JPEG segserve's fused archive answers for it (its own handler and settings)."""
    if not FUSED_ARCHIVE.exists():
        pytest.skip(f"{FUSED_ARCHIVE} is missing: run make build")
    model_dir = tmp_path_factory.mktemp("seg_jpeg_fused")
    zipfile.ZipFile(FUSED_ARCHIVE).extractall(model_dir)
    settings = yaml.safe_load((model_dir / "seg_jpeg_fused.yaml").read_text())["handler"]
    context = worker_context(model_dir, settings, "seg.pt", rows=len(SAMPLES))
    handler = PipelineHandler()
    handler.initialize(context)
    answers = handler.handle([{"body": path.read_bytes()} for path in SAMPLES], context)
    assert all(context.get_response_status(i)[0] == 200 for i in range(len(SAMPLES)))
    return {path.name: bytes(answer) for path, answer in zip(SAMPLES, answers, strict=True)}


def request(port: int, method: str, path: str, body: bytes = b"", headers: dict | None = None) -> tuple[int, dict, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request(method, path, body=body or None, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def predict(peer: str, port: int, body: bytes) -> tuple[int, dict, bytes]:
    """(status, headers, answer) of one image: the JPEG itself on a 200, else the error body."""
    if peer != "triton":
        return request(port, "POST", "/predict", body, {"Content-Type": "application/octet-stream"})
    headers, payload = triton_request(body)
    status, answer_headers, answer = request(port, "POST", INFER_PATH, payload, headers)
    return status, answer_headers, triton_answer(answer, answer_headers) if status == 200 else answer


class PeerServer:
    """One app in a session of its own; start() waits for health (failing fast if it dies), stop() sends SIGTERM to
    its process group and waits, kill() removes whatever is left by pid."""

    def __init__(self, peer: str, log_dir: Path):
        self.peer, self.log_path = peer, log_dir / f"{peer}.log"
        self.python = ROOT / ".peers" / peer / "bin" / "python"
        self.process: subprocess.Popen | None = None
        self.seen: dict[int, psutil.Process] = {}  # every process of the app seen while it ran (Ray's driver has its own session)
        self.temp_dirs: set[str] = set()

    def start(self, *flags: str) -> float:
        self.port = free_port()
        command = [str(self.python), f"benchmarks/peers/{self.peer}_app.py", "--port", str(self.port), *KNOBS[self.peer], *flags]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        started, deadline = time.monotonic(), time.monotonic() + STARTUP_TIMEOUT_S
        try:
            while time.monotonic() < deadline:
                assert self.process.poll() is None, f"{self.peer} exited with {self.process.returncode}:\n{self.log_tail()}"
                self.remember_processes()
                try:
                    if request(self.port, "GET", HEALTH[self.peer])[0] == 200:
                        return time.monotonic() - started
                except OSError:
                    pass
                time.sleep(0.25)
            raise AssertionError(f"{self.peer} not healthy after {STARTUP_TIMEOUT_S} s:\n{self.log_tail()}")
        finally:
            release_ports([self.port])

    def remember_processes(self) -> None:
        for process in [psutil.Process(self.process.pid), *psutil.Process(self.process.pid).children(recursive=True)]:
            self.seen.setdefault(process.pid, process)
            try:
                found = process.environ().get("SEGSERVE_RAY_PEER_DIR")
            except psutil.Error:
                continue
            if found:
                self.temp_dirs.add(found)

    def sessions(self) -> set[int]:
        return {self.process.pid} | {s for s in (_sid(p.pid) for p in self.seen.values()) if s}

    def stop(self) -> tuple[int | None, float]:
        """(exit status or None after STOP_TIMEOUT_S, seconds) of a SIGTERM to the app's process group."""
        self.remember_processes()
        started = time.monotonic()
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            return self.process.wait(timeout=STOP_TIMEOUT_S), time.monotonic() - started
        except subprocess.TimeoutExpired:
            return None, time.monotonic() - started

    def left_running(self) -> list[str]:
        """Processes of the app still alive (zombies, already dead and waiting for a parent to reap them, are not)."""
        left, sessions = [], self.sessions()
        for process in psutil.process_iter(["pid", "status", "cmdline"]):
            if process.pid == os.getpid() or process.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmdline = " ".join(process.info["cmdline"] or [])
            known = process.pid in self.seen and self.seen[process.pid].is_running()  # the same process, not a reused pid
            if known or _sid(process.pid) in sessions or any(d in cmdline for d in self.temp_dirs):
                left.append(f"{process.pid} {cmdline[:120]}")
        return left

    def kill(self) -> None:
        for pid_text in self.left_running():
            try:
                os.kill(int(pid_text.split()[0]), signal.SIGKILL)
            except ProcessLookupError:
                pass

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def _sid(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


@pytest.mark.parametrize("peer", ["litserve", "ray", "triton"])
def test_peer_answers_segserve_bytes_and_stops_clean(peer, segserve_answers, tmp_path):
    if not (ROOT / ".peers" / peer / ".installed").exists():
        pytest.skip(f".peers/{peer} is missing: make setup-peers (make test-peers runs it)")
    server = PeerServer(peer, tmp_path)
    try:
        startup_s = server.start()
        print(f"{peer}: healthy after {startup_s:.1f} s on port {server.port}")
        first_line = server.log_path.read_text().splitlines()[0]
        assert f'"peer": "{peer}"' in first_line and '"torch"' in first_line, first_line

        for path in SAMPLES:
            status, headers, answer = predict(peer, server.port, path.read_bytes())
            assert status == 200, (path.name, answer[:300])
            if peer != "triton":
                assert headers.get("content-type", headers.get("Content-Type", "")).startswith("image/jpeg")
            assert answer == segserve_answers[path.name], f"{peer} answered other bytes than segserve for {path.name}"

        status, _, answer = predict(peer, server.port, NOT_AN_IMAGE)
        assert b"expected a JPEG or PNG image" in answer, answer[:300]
        if peer == "triton":
            # PyTriton 0.7 answers an execute() with one error for every request in it (a TritonModelException),
            # which Triton's HTTP front end sends as 500: no per-request 4xx (benchmarks/peers/README.md)
            assert status == 500
        else:
            assert status == 400
        status, _, answer = predict(peer, server.port, SAMPLES[0].read_bytes())
        assert status == 200 and answer == segserve_answers[SAMPLES[0].name], "the server did not stay up after a bad body"
    finally:
        if server.process is not None:
            code, stop_s = server.stop()
            left = server.left_running()
            print(f"{peer}: exit {code} after {stop_s:.1f} s; left running: {left}")
            server.kill()
    assert code == 0, f"{peer} exited with {code} on SIGTERM:\n{server.log_tail()}"
    assert left == [], f"{peer} left processes running after SIGTERM: {left}"
    assert all(not Path(d).exists() for d in server.temp_dirs), f"Ray's temporary folder was not removed: {server.temp_dirs}"


def test_triton_with_segserves_int8_program_answers_the_bytes_of_segserves_int8_archive(tmp_path, trained_weights):
    """`--optimize int8` (benchmarks/peers_int8.yaml): the peer builds the program as `segserve build` does for an
    int8 fused archive, so Triton answers what that archive's handler answers, byte for byte."""
    if not (ROOT / ".peers" / "triton" / ".installed").exists():
        pytest.skip(".peers/triton is missing: make setup-peers (make test-peers runs it)")
    from segserve.archives.build import Recipe
    from segserve.archives.catalog import Catalog

    catalog = Catalog(ROOT)
    (tmp_path / "store").mkdir()
    recipe = Recipe(catalog, trained_weights, tmp_path / "store", tmp_path / "staging", log=lambda _: None)
    archive = recipe.fused_archive(catalog.dags["seg_jpeg"], "fused-int8", {"seg": {"optimize": "int8"}}, {})
    model_dir = tmp_path / "fused-int8"
    zipfile.ZipFile(archive).extractall(model_dir)
    manifest = yaml.safe_load((model_dir / "MAR-INF" / "MANIFEST.json").read_text())
    settings = yaml.safe_load((model_dir / manifest["model"]["configFile"]).read_text())["handler"]
    # the peer's one instance runs torch on every core: so does this handler (int8 kernels are compiled per thread count)
    context = worker_context(model_dir, {**settings, "threads": 0}, manifest["model"]["serializedFile"], rows=len(SAMPLES))
    handler = PipelineHandler()
    handler.initialize(context)
    expected = [bytes(a) for a in handler.handle([{"body": path.read_bytes()} for path in SAMPLES], context)]

    server = PeerServer("triton", tmp_path)
    try:
        server.start("--optimize", "int8")
        assert '"optimize": "int8"' in server.log_path.read_text().splitlines()[0]
        answers = [predict("triton", server.port, path.read_bytes()) for path in SAMPLES]
    finally:
        if server.process is not None:
            code, _ = server.stop()
            server.kill()
    assert [status for status, _, _ in answers] == [200] * len(SAMPLES)
    assert [answer for _, _, answer in answers] == expected, "Triton (int8) answered other bytes than segserve's int8 archive"
    assert code == 0


def test_triton_request_is_the_documented_format():
    """The suite sends this: a 256-byte JSON header (spaces after it), then the 4-byte length-prefixed JPEG."""
    headers, body = triton_request(b"\xff\xd8jpeg\xff\xd9")
    assert headers["Inference-Header-Content-Length"] == "256"
    header = yaml.safe_load(body[:256].decode())  # JSON is YAML
    assert header["inputs"][0] == {"name": "image", "shape": [1, 1], "datatype": "BYTES", "parameters": {"binary_data_size": 12}}
    assert body[256:] == b"\x08\x00\x00\x00\xff\xd8jpeg\xff\xd9"
    answer_header = b'{"outputs":[{"name":"jpeg","datatype":"BYTES","shape":[1,1],"parameters":{"binary_data_size":7}}]}'
    assert triton_answer(answer_header + b"\x03\x00\x00\x00abc", {"Inference-Header-Content-Length": str(len(answer_header))}) == b"abc"
