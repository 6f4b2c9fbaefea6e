"""A fan-out DAG (seg → jpeg, areas) on a real TorchServe: the workflow and its fused twin answer alike."""

import base64
import json

import pytest
import torch
from torchvision.io import decode_jpeg, encode_png

from segserve.model.synthetic import make_sample
from segserve.model.train import normalise
from segserve.qa.chaos import replaced_workers, worker_pids
from segserve.qa.fuzz_inputs import header_text_errors
from segserve.serving.http import Connection
from tests.conftest import ROOT
from tests.integration.test_integration import foreground_of, iou, post


@pytest.fixture(scope="module")
def fanout(server):
    """seg_fanout.war and seg_fanout_fused.mar registered next to the default pipeline, removed after."""
    server.register_workflow("seg_fanout.war", "seg_fanout", log=lambda _: None)
    server.register_model("seg_fanout_fused.mar", "seg_fanout_fused", log=lambda _: None)
    try:
        yield server
    finally:
        server.unregister("workflows", "seg_fanout")
        server.unregister("models", "seg_fanout_fused")


def bodies() -> list[bytes]:
    image, _ = make_sample(5_000_700, 300, 520)
    raw = normalise(make_sample(5_000_701)[0][None])[0].half().numpy().tobytes()
    return [encode_png(image).numpy().tobytes(), raw, (ROOT / "samples" / "shapes_1.jpg").read_bytes()]


def test_workflow_and_fused_answer_one_json_object_keyed_by_leaf_with_the_same_bytes(fanout):
    for body in bodies():
        workflow = post(fanout, "/wfpredict/seg_fanout", body)
        fused = post(fanout, "/predictions/seg_fanout_fused", body)
        assert workflow.status == fused.status == 200
        assert fused.content_type == "application/json"
        expected, got = json.loads(workflow.body), json.loads(fused.body)
        assert list(got) == ["areas", "jpeg"]  # the spec's order
        assert got == expected
        assert got["jpeg"]["content_type"] == "image/jpeg"
        assert base64.b64decode(got["jpeg"]["jpeg_base64"])[:2] == b"\xff\xd8"
        # TorchServe lists the leaves in the order they finished (areas, counting, usually first): asked again
        # until that is the spec's order, the workflow's bytes are the fused pipeline's
        for _ in range(10):
            if list(expected) == list(got):
                break
            workflow = post(fanout, "/wfpredict/seg_fanout", body)
            expected = json.loads(workflow.body)
        assert fused.body == workflow.body


def test_the_leaves_describe_the_same_segmentation(fanout):
    image, truth = make_sample(5_000_702)
    answer = json.loads(post(fanout, "/predictions/seg_fanout_fused", encode_png(image).numpy().tobytes()).body)
    jpeg = base64.b64decode(answer["jpeg"]["jpeg_base64"])
    foreground = foreground_of(jpeg)
    assert iou(foreground, truth.bool()) >= 0.9
    areas = answer["areas"]
    assert areas["original_size"] == list(foreground.shape) == [256, 448]
    assert sum(areas["pixels"]) == 256 * 448
    # the JPEG's foreground and the reported pixel count agree up to JPEG's edge noise
    assert abs(areas["pixels"][1] - int(foreground.sum())) <= 0.02 * 256 * 448
    rows, cols = truth.bool().any(1).nonzero().flatten(), truth.bool().any(0).nonzero().flatten()
    x0, y0, x1, y1 = areas["boxes"]["1"]
    assert abs(x0 - int(cols[0])) <= 3 and abs(x1 - int(cols[-1]) - 1) <= 3
    assert abs(y0 - int(rows[0])) <= 3 and abs(y1 - int(rows[-1]) - 1) <= 3


def test_a_bad_image_gets_400_from_the_fused_pipeline(fanout):
    response = post(fanout, "/predictions/seg_fanout_fused", b"\x89PNG\r\n\x1a\nbroken")
    assert response.status == 400
    assert json.loads(response.body)["error"] == "PNG is truncated before its IHDR header"
    healthy = post(fanout, "/predictions/seg_fanout_fused", bodies()[0])
    assert healthy.status == 200 and set(json.loads(healthy.body)) == {"jpeg", "areas"}


def test_decoded_jpeg_leaf_is_the_image_the_chain_returns(fanout):
    """The fan-out's JPEG leaf (jpeg_json.mar) is the seg_jpeg chain's JPEG, only wrapped in JSON."""
    body = bodies()[0]
    chain = post(fanout, "/predictions/seg_jpeg_fused", body).body
    leaf = base64.b64decode(json.loads(post(fanout, "/predictions/seg_fanout_fused", body).body)["jpeg"]["jpeg_base64"])
    assert leaf == chain
    assert decode_jpeg(torch.frombuffer(bytearray(leaf), dtype=torch.uint8)).shape == (3, 300, 520)


def test_no_text_that_could_break_a_status_line_kills_a_worker_on_any_endpoint(fanout):
    """Issue 64: `{"error": "x\\r\\nX-Injected: 1"}` to /predictions/jpeg became the 400's reason phrase, netty refused
    it and answered 500 "Worker died.", every time. Every text of the corpus (CR/LF, NUL, U+0085/2028/2029, a lone
    surrogate, ANSI escapes, 100 KB, bytes that are not UTF-8, an error that is an object) as an upstream error body
    to every model served (members, workflow nodes, fused twins) and both workflows: no 5xx, no worker replaced."""
    endpoints = [f"/predictions/{model}" for model in fanout.models()] + ["/wfpredict/seg_jpeg", "/wfpredict/seg_fanout"]
    before = worker_pids(fanout)
    connection, failures = Connection(fanout.url("inference"), fanout.token("inference"), timeout_s=30), []
    try:
        for item, path in ((item, path) for item in header_text_errors() for path in endpoints):
            try:
                response = connection.request("POST", path, item.body)
                answer = f"{response.status} {response.text()[:100]!r}" if response.status >= 500 else None
            except OSError as error:  # a workflow whose node keeps dying answers nothing in time
                answer = f"no answer ({error})"
            if answer:
                failures.append(f"{item.description} → {path}: {answer}")
                connection.close()  # a fresh connection for the next request, whatever became of this one
            if len(failures) >= 5:  # proof enough: each death costs a worker's restart
                break
    finally:
        connection.close()
    failures += replaced_workers(before, worker_pids(fanout))
    assert not failures, "\n".join(failures)
