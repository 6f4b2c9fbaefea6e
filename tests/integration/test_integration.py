"""Against a real TorchServe: the workflow end to end, per-request status, tokens, allowed URLs."""

import json
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest
import torch
from torchvision.io import decode_jpeg, encode_png

from handlers.base import BATCH_SIZE_HEADER
from segserve.model.synthetic import make_sample
from segserve.model.train import normalise
from segserve.serving.http import Connection
from tests.conftest import ROOT

HELD_OUT_SEEDS = range(5_000_000, 5_000_006)  # never used in training


def post(server, path: str, body: bytes, token: str | None = "inference"):
    connection = Connection(server.url("inference"), server.token(token) if token else None)
    try:
        return connection.request("POST", path, body)
    finally:
        connection.close()


def foreground_of(jpeg: bytes) -> torch.Tensor:
    """Pixels closer to the white foreground colour than to the black background."""
    image = decode_jpeg(torch.frombuffer(bytearray(jpeg), dtype=torch.uint8))
    return image.float().mean(0) > 127


def iou(predicted: torch.Tensor, truth: torch.Tensor) -> float:
    return float((predicted & truth).sum() / (predicted | truth).sum())


def test_workflow_segments_held_out_images_with_iou_at_least_0_9(server):
    intersection = union = 0
    for seed in HELD_OUT_SEEDS:
        image, mask = make_sample(seed)
        response = post(server, "/wfpredict/seg_jpeg", encode_png(image).numpy().tobytes())
        assert response.status == 200, response.text()
        predicted, truth = foreground_of(response.body), mask.bool()
        assert predicted.shape == truth.shape == (256, 448)
        intersection += int((predicted & truth).sum())
        union += int((predicted | truth).sum())
    assert intersection / union >= 0.9


def test_workflow_answers_at_the_original_image_size(server):
    image, mask = make_sample(5_000_100, 360, 640)
    response = post(server, "/wfpredict/seg_jpeg", encode_png(image).numpy().tobytes())
    assert response.body[:2] == b"\xff\xd8", response.text()
    predicted = foreground_of(response.body)
    assert predicted.shape == (360, 640)
    assert iou(predicted, mask.bool()) >= 0.8


def test_seed_raw_fp16_body_through_the_workflow_returns_a_448x256_jpeg(server):
    image, mask = make_sample(5_000_200)
    raw = normalise(image[None])[0].half().numpy().tobytes()
    assert len(raw) == 688_128
    response = post(server, "/wfpredict/seg_jpeg", raw)
    assert response.status == 200 and response.body[:2] == b"\xff\xd8", response.text()
    predicted = foreground_of(response.body)
    assert predicted.shape == (256, 448)  # height 256, width 448
    assert iou(predicted, mask.bool()) >= 0.9


@contextmanager
def registered_with_batch(server, archive: str, name: str, batch_size: int):
    """An archive registered again with a 3 s batch delay, so `batch_size` concurrent requests share one batch."""
    server.register_model(archive, name, batch_size=batch_size, max_batch_delay_ms=3000, log=lambda _: None)
    try:
        yield f"/predictions/{name}"
    finally:
        server.call("management", "DELETE", f"/models/{name}")


@pytest.fixture
def slow_batching_seg(server):
    with registered_with_batch(server, "seg.mar", "seg_batch4", 4) as path:
        yield path


def test_one_corrupt_image_in_a_batch_gets_400_and_the_others_200(server, slow_batching_seg):
    good = encode_png(make_sample(5_000_300)[0]).numpy().tobytes()
    bodies = [good, good[: len(good) // 2], good, b"definitely not an image"]
    with ThreadPoolExecutor(len(bodies)) as pool:
        responses = list(pool.map(lambda body: post(server, slow_batching_seg, body), bodies))
    assert [r.status for r in responses] == [200, 400, 200, 400]
    assert [r.headers[BATCH_SIZE_HEADER] for r in responses] == ["4"] * 4  # all rode in one batch
    assert "could not decode the png image" in json.loads(responses[1].body)["error"]
    assert "got 23 bytes that are neither" in json.loads(responses[3].body)["error"]
    assert responses[0].body[:4] == b"SGCM" and responses[2].body[:4] == b"SGCM"


def test_bad_input_on_the_workflow_carries_the_seg_message_and_the_server_stays_up(server):
    # TorchServe 0.12 answers /wfpredict with 200 whatever a node's status was; the jpeg node
    # passes the seg node's error message on, so the client at least learns what was wrong.
    response = post(server, "/wfpredict/seg_jpeg", b"garbage")
    assert json.loads(response.body)["error"].startswith("expected a JPEG or PNG image")
    healthy = post(server, "/wfpredict/seg_jpeg", encode_png(make_sample(5_000_400)[0]).numpy().tobytes())
    assert healthy.status == 200 and healthy.body[:2] == b"\xff\xd8"


def test_requests_without_the_token_are_refused(server):
    response = post(server, "/wfpredict/seg_jpeg", b"x", token=None)
    assert response.status in (400, 401)
    assert "Token Authorization failed" in response.text()


def test_registration_from_a_url_is_refused(server):
    response = server.call("management", "POST", "/models?url=http://127.0.0.1:9/evil.mar")
    assert response.status == 404
    assert "does not match any allowed URL(s)" in response.text()


def test_workflow_nodes_are_registered_as_models(server):
    names = {m["modelName"] for m in server.call("management", "GET", "/models").json()["models"]}
    assert {"seg", "jpeg", "seg_jpeg__seg", "seg_jpeg__jpeg", "seg_jpeg_fused"} <= names


def test_fused_pipeline_returns_the_same_bytes_as_the_workflow(server):
    image, _ = make_sample(5_000_500, 300, 520)
    raw = normalise(make_sample(5_000_501)[0][None])[0].half().numpy().tobytes()
    for body in (encode_png(image).numpy().tobytes(), raw, (ROOT / "samples" / "shapes_3.jpg").read_bytes()):
        workflow = post(server, "/wfpredict/seg_jpeg", body)
        fused = post(server, "/predictions/seg_jpeg_fused", body)
        assert fused.status == 200 and fused.content_type == "image/jpeg"
        assert fused.body[:2] == b"\xff\xd8" and fused.body == workflow.body


def test_fused_pipeline_answers_a_bad_image_with_its_own_400(server, slow_batching_fused):
    good = encode_png(make_sample(5_000_600)[0]).numpy().tobytes()
    bodies = [good, b"\x89PNG\r\n\x1a\nbroken", good]
    with ThreadPoolExecutor(len(bodies)) as pool:
        responses = list(pool.map(lambda body: post(server, slow_batching_fused, body), bodies))
    assert [r.status for r in responses] == [200, 400, 200]
    assert [r.headers[BATCH_SIZE_HEADER] for r in responses] == ["3"] * 3
    assert json.loads(responses[1].body)["error"] == "PNG is truncated before its IHDR header"
    assert responses[0].body == responses[2].body and responses[0].body[:2] == b"\xff\xd8"


@pytest.fixture
def slow_batching_fused(server):
    with registered_with_batch(server, "seg_jpeg_fused.mar", "fused_batch3", 3) as path:
        yield path


def test_rescaling_a_workflow_node_under_load_loses_no_request(server):
    import threading
    import time

    from segserve.bench.run.load import LoadSpec, run_load

    bodies = [p.read_bytes() for p in sorted((ROOT / "samples").glob("*.jpg"))]
    spec = LoadSpec(server.url("inference"), "/wfpredict/seg_jpeg", bodies, server.token("inference"), concurrency=4)
    results = {}
    load = threading.Thread(target=lambda: results.setdefault("load", run_load(spec, duration_s=12)))
    load.start()
    try:
        time.sleep(2)
        for workers in (2, 1):
            server.scale("seg_jpeg__seg", workers)
            assert len(server.describe("seg_jpeg__seg")["workers"]) == workers
            time.sleep(2)
    finally:
        load.join()
    result = results["load"]
    assert len(result.status) > 20
    assert result.status_counts() == {"200": len(result.status)}


def test_a_model_registered_with_two_workers_has_two(server):
    """TorchServe 0.12 starts the archive's minWorkers (1 in our model-config) whatever initial_workers says;
    register_model scales to the count asked (a bench point registered with 2 workers was measured with 1)."""
    server.register_model("jpeg.mar", "jpeg_two", 2, log=lambda _: None)
    try:
        described = server.describe("jpeg_two")
        assert len(described["workers"]) == 2
        assert described["minWorkers"] == described["maxWorkers"] == 2
    finally:
        server.call("management", "DELETE", "/models/jpeg_two")


def test_the_load_generator_over_grpc_counts_the_same_answers_as_over_http(server):
    """load.protocol grpc: TorchServe's gRPC API answers a refused row with OK and the handler's error body; the load
    generator counts it as the 400 it is over HTTP, a good row as 200, and a wrong token as refused."""
    from segserve.bench.run.load import LoadSpec, run_load

    good = encode_png(make_sample(5_000_401)[0]).numpy().tobytes()
    token = server.token("inference")
    counts = {}
    for protocol, url, path in (("http", server.url("inference"), "/predictions/seg"), ("grpc", server.grpc_inference_url(), "seg")):
        result = run_load(LoadSpec(url=url, path=path, bodies=[good, b"garbage"], token=token, concurrency=1), 1.5)
        counts[protocol] = result.status_counts()
        assert set(counts[protocol]) == {"200", "400"}, counts  # one connection: good and garbage in turn
        assert abs(counts[protocol]["200"] - counts[protocol]["400"]) <= 1
        assert list(result.samples) == [(400, 1)] and result.samples[400, 1].startswith(b'{"error"'), result.samples  # the garbage's answer
    refused = run_load(LoadSpec(url=server.grpc_inference_url(), path="seg", bodies=[good], token="wrong", concurrency=1), 0.3)
    assert set(refused.status_counts()) == {"403"}
    assert refused.samples[403, 0].startswith(b"PERMISSION_DENIED: "), refused.samples  # the call's code and details


def test_every_worker_runs_with_the_servers_environment_defaults(server):
    """SERVER_ENV (OMP_WAIT_POLICY, glibc's malloc thresholds) reaches each worker, unless the caller's sets them."""
    import os

    from segserve.serving.server import SERVER_ENV

    expected = {name: os.environ.get(name, value) for name, value in SERVER_ENV.items()}
    workers = [int(w["pid"]) for w in server.describe("seg")["workers"]]
    assert workers
    for pid in workers:
        pairs = (item.partition(b"=") for item in open(f"/proc/{pid}/environ", "rb").read().split(b"\0") if item)
        environ = {name.decode(): value.decode() for name, _, value in pairs}
        assert {name: environ.get(name) for name in SERVER_ENV} == expected
