"""The Ray engine (segserve/engines/ray/) against a real TorchServe 0.12: two .mar files built with the real
torch-model-archiver (an echo handler of the test's own, and TorchServe's built-in image_classifier around a tiny
TorchScript model), each request sent to both, the same status, content type and bytes asked of Ray's answer; the
key, the 404s, batching, and nothing left running after stop, in Serve's default proxy mode and in HAProxy mode.

Marked long: each Ray starts in 12-15 s and the TorchServe in about 10 on 2 cores (docs/ray.md); the pure parts
are tests/unit/test_ray_engine.py."""

import io
import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
import torch
from PIL import Image

from segserve.archives.build import tool
from segserve.engines.ray.engine import RayServe
from segserve.engines.ray.exposure import exposure
from segserve.engines.ray.replica import ModelSpec
from segserve.serving.http import request
from segserve.serving.server import TorchServe

ROOT = Path(__file__).resolve().parents[2]
ECHO = Path(__file__).parent / "data" / "ray_echo" / "echo_handler.py"
BATCH = {"batch_size": 4, "max_batch_delay_ms": 50}

pytestmark = pytest.mark.long


class Tiny(torch.nn.Module):
    """Five classes from the centre pixel's three channels: exact on any thread count, so both engines give the
    same bytes."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.arange(15, dtype=torch.float32).reshape(3, 5) / 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :, 112, 112] @ self.weight


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("ray_store")
    archiver = tool("torch-model-archiver")
    build = [archiver, "--model-name", "echo", "--version", "1.0", "--handler", str(ECHO), "--export-path", str(folder)]
    subprocess.run(build, check=True, capture_output=True)
    torch.jit.script(Tiny()).save(folder / "tiny.pt")
    classifier = [archiver, "--model-name", "classifier", "--version", "2.0", "--handler", "image_classifier"]
    subprocess.run(
        [*classifier, "--serialized-file", str(folder / "tiny.pt"), "--export-path", str(folder)], check=True, capture_output=True
    )
    return folder


def specs(store: Path) -> list[ModelSpec]:
    return [ModelSpec("echo", str(store / "echo.mar"), **BATCH), ModelSpec("classifier", str(store / "classifier.mar"))]


@pytest.fixture(scope="module")
def torchserve(store, tmp_path_factory):
    server = TorchServe(tmp_path_factory.mktemp("ts"), store, ROOT / "config.properties", free_ports=True)
    with server:
        server.register_model("echo.mar", "echo", workers=1, **BATCH, log=lambda *_: None)
        server.register_model("classifier.mar", "classifier", workers=1, batch_size=1, max_batch_delay_ms=100, log=lambda *_: None)
        yield server


@pytest.fixture(scope="module", params=["proxy", "haproxy"])
def ray(store, tmp_path_factory, request):
    engine = RayServe(tmp_path_factory.mktemp(f"ray_{request.param}"), specs(store), haproxy=request.param == "haproxy")
    startup_s = engine.start()
    print(f"Ray engine ({request.param}) up in {startup_s:.1f} s")
    yield engine
    engine.stop()


def png() -> bytes:
    out = io.BytesIO()
    Image.frombytes("RGB", (40, 30), bytes((i * 7) % 256 for i in range(40 * 30 * 3))).save(out, "PNG")
    return out.getvalue()


def form(fields: dict[str, tuple[str | None, str, bytes]]) -> tuple[bytes, str]:
    """multipart/form-data: name → (file name or None, content type, bytes)."""
    boundary, parts = "segserveboundary", []
    for name, (filename, kind, value) in fields.items():
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        parts.append(f"--{boundary}\r\nContent-Disposition: {disposition}\r\nContent-Type: {kind}\r\n\r\n".encode() + value + b"\r\n")
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


# (path, body, content type, extra headers): what both engines are sent, one at a time
CASES = [
    ("/predictions/echo", b"hello", "application/octet-stream", {}),
    ("/predictions/echo", b'{"k": [1, 2]}', "application/json", {"X-Show": "explain, url_path"}),
    ("/predictions/echo", "héllo".encode(), "text/plain; charset=utf-8", {}),
    ("/predictions/echo", b"a=1&b=&c=x%20y", "application/x-www-form-urlencoded", {}),
    ("/predictions/echo", *form({"image": ("a.json", "application/json", b'{"x": 1}'), "note": (None, "text/plain", b"hi")}), {}),
    ("/predictions/echo/1.0/extra/path", b"v", "application/octet-stream", {"X-Show": "url_path, x-custom", "X-Custom": "c1"}),
    ("/predictions/echo", b"teapot", "application/octet-stream", {}),
    ("/predictions/echo", b"bytes", "application/octet-stream", {}),
    ("/predictions/echo", b"fail", "application/octet-stream", {}),
    ("/predictions/classifier", png(), "image/png", {}),
    ("/predictions/classifier/2.0", png(), "application/octet-stream", {}),
    ("/predictions/nope", b"x", "application/octet-stream", {}),
    ("/predictions/echo/9.9", b"x", "application/octet-stream", {}),
    ("/ping", None, "", {}),
    ("/no/such/path", b"x", "application/octet-stream", {}),
]


def send(url: str, token: str | None, path: str, body: bytes | None, content_type: str, headers: dict[str, str]):
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    sent = {**headers, **({"Content-Type": content_type} if body is not None else {})}
    if token:
        sent["Authorization"] = f"Bearer {token}"
    try:
        connection.request("POST" if body is not None else "GET", path, body=body, headers=sent)
        reply = connection.getresponse()
        return reply.status, reply.getheader("content-type"), reply.read(), {k.lower(): v for k, v in reply.getheaders()}
    finally:
        connection.close()


def test_every_request_gets_torchserves_status_content_type_and_bytes(torchserve, ray):
    for case in CASES:
        expected = send(torchserve.url("inference"), torchserve.token("inference"), *case)
        got = send(ray.url("inference"), ray.token("inference"), *case)
        assert got[:3] == expected[:3], (case[0], case[1][:40] if case[1] else None)
    teapot = send(ray.url("inference"), ray.token("inference"), *CASES[6])
    assert teapot[0] == 418 and teapot[3]["x-marker"] == "teapot"  # the handler's own header, as on TorchServe
    assert {"x-request-id", "cache-control", "pragma", "expires"} <= set(teapot[3])


def test_without_the_key_or_with_another_both_engines_refuse_alike(torchserve, ray):
    for token in (None, "wrong"):
        for path, body in (("/predictions/echo", b"x"), ("/ping", None), ("/no/such/path", b"x")):
            expected = send(torchserve.url("inference"), token, path, body, "application/octet-stream", {})
            got = send(ray.url("inference"), token, path, body, "application/octet-stream", {})
            assert got[:3] == expected[:3] and got[0] == 400, (token, path)


def test_concurrent_requests_are_batched_up_to_batch_size(ray):
    def biggest_batch(i: int) -> int:
        """Six requests with the header that asks the echo handler for its batch's size: the biggest seen."""
        sizes = []
        for _ in range(6):
            sent = ("/predictions/echo", f"row {i}".encode(), "application/octet-stream", {"X-Show-Batch": "1"})
            status, _, body, _ = send(ray.url("inference"), ray.token("inference"), *sent)
            assert status == 200, body
            sizes.append(json.loads(body)["batch"])
        return max(sizes)

    with ThreadPoolExecutor(8) as pool:
        biggest = list(pool.map(biggest_batch, range(8)))
    assert 1 < max(biggest) <= BATCH["batch_size"], biggest


def test_stop_leaves_no_process_and_no_folder(store, tmp_path):
    engine = RayServe(tmp_path / "run", [ModelSpec("echo", str(store / "echo.mar"))], haproxy=True)
    engine.start()
    temp_dir = (engine.run_dir / "ray_temp_dir").read_text()
    started = engine.engine_processes()
    names = {p.name() for p in started}
    assert "haproxy" in names and "raylet" in names and "gcs_server" in names, names
    assert request(engine.url("inference"), "GET", "/ping", token=engine.token("inference")).status == 200
    engine.stop()
    assert engine.engine_processes() == []
    assert [p.pid for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []
    left = [p for p in psutil.process_iter(["cmdline"]) if any(temp_dir in part for part in p.info["cmdline"] or [])]
    assert left == [] and not Path(temp_dir).exists()


def test_every_listener_is_on_loopback_or_refuses_a_request_without_a_key(ray):
    """docs/security.md's table: a local engine listens on loopback alone, Ray's own servers and Prometheus exporters
    included (engine.LOOPBACK_ONLY), HAProxy's stats and metrics too (Ray's template binds them everywhere), but for
    Serve's replicas' inter-deployment gRPC servers, which Serve binds to [::] in code: Ray's token guards them."""
    found = exposure(ray.process_ids())
    assert set(found) <= {"loopback", "keyed"}, {verdict: found[verdict] for verdict in found if verdict != "loopback"}
    assert {listener.process.startswith("ray::ServeReplica:") for listener in found.get("keyed", [])} == {True}, found
    processes = {listener.process for listener in found["loopback"]}
    assert {"gcs_server", "raylet", "ray::DashboardAgent"} <= processes, processes  # Ray's servers were looked at
    if ray.haproxy:
        assert sum(listener.process == "haproxy" for listener in found["loopback"]) == 3  # frontend, stats, metrics
