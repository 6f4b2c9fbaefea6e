"""A workflow of TorchServe's dog-breed shape through TorchServe's own vision handlers
(benchmarks/foreign/build_vision_join.py: ImageClassifier subclasses around MobileNetV3-Small, a function node
first, a join), built with the official archivers, fused by `segserve fuse`, its suite planned from its folder; and
(long) on one TorchServe, sent one request at a time, each photo (RGB and grayscale JPEGs, an RGBA PNG) and a body
that is no image is answered the same status, content type and bytes by /wfpredict and by the fused model
(docs/fuse.md, *Measured: TorchServe's own vision handlers*)."""

import io
import json
import re
import subprocess
import sys
import zipfile

import pytest
from PIL import Image

from segserve.cli import main
from segserve.serving.http import request
from segserve.serving.server import TorchServe
from tests.conftest import ROOT

SUITE = ROOT / "benchmarks/foreign/vision_join.yaml"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The builder's folder, with fused_vision_join.mar beside the .war (what the suite measures)."""
    folder = tmp_path_factory.mktemp("vision_join")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/foreign/build_vision_join.py"), str(folder)], capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert main(["fuse", str(folder / "vision_join.war"), "--model-store", str(folder)]) == 0
    return folder


def test_the_vision_join_builds_on_torchserves_image_classifier_fuses_and_its_suite_plans(store, monkeypatch, capsys):
    for node, handler in (("cat_dog", "vision_cat_dog_handler"), ("dog_breed", "vision_breed_handler")):
        with zipfile.ZipFile(store / f"{node}.mar") as zipped:
            assert json.loads(zipped.read("MAR-INF/MANIFEST.json"))["model"]["handler"] == f"{handler}.py"
            code = zipped.read(f"{handler}.py").decode()
        assert "from ts.torch_handler.image_classifier import ImageClassifier" in code
        assert not re.search(r"^\s*(import|from) segserve", code, re.MULTILINE)
    with zipfile.ZipFile(store / "vision_join.war") as zipped:
        spec = next(zipped.read(name).decode() for name in zipped.namelist() if name.endswith(".yaml"))
    assert "pre_processing: [cat_dog, dog_breed]" in spec and "timeout-ms: 300000" in spec
    monkeypatch.chdir(store)
    capsys.readouterr()
    assert main(["bench", str(SUITE), "--dry-run"]) == 0, capsys.readouterr().err
    # the workflow, its two members alone and the fused .mar; 1 and 2 workers; 16 and 128 connections
    assert len(re.findall(r"^ +\d+\. ", capsys.readouterr().out, re.MULTILINE)) == 16
    for other in sorted(SUITE.parent.glob("vision_join_*.yaml")):  # the other suites on these archives plan too
        assert main(["bench", str(other), "--dry-run"]) == 0, capsys.readouterr().err


@pytest.mark.long  # 4 workers that import torch, torchvision and captum, and 5 retries of the no-image row: ~1 min
def test_the_fused_vision_join_answers_each_photo_as_the_workflow_does_one_request_at_a_time(store, tmp_path):
    rgba = io.BytesIO()
    Image.open(store / "photo_0.jpg").convert("RGBA").resize((300, 200)).save(rgba, format="PNG")
    bodies = [path.read_bytes() for path in sorted(store.glob("photo_*.jpg"))] + [rgba.getvalue(), b"not an image"]
    server = TorchServe(tmp_path / "ts", store, ROOT / "config.properties", free_ports=True)
    with server:
        server.register_workflow("vision_join.war", "vision_join")
        server.register_model("fused_vision_join.mar", "fused_vision_join", workers=1, batch_size=4, max_batch_delay_ms=100)
        token, url = server.token("inference"), server.url("inference")
        answers = {}
        for path in ("/wfpredict/vision_join", "/predictions/fused_vision_join"):
            replies = [request(url, "POST", path, token, body, timeout_s=120) for body in bodies]
            answers[path] = [(reply.status, reply.content_type, reply.body) for reply in replies]
    workflow, fused = answers.values()
    assert fused == workflow
    # both answers of the join occur (cats in cat_dog's words, dogs as dog_breed's top 5), and the no-image row fails
    # at cat_dog after its retries, answered as stock answers it
    assert {body for status, _, body in workflow[:-1] if not body.startswith(b"{")} == {b"It's a cat!"}
    assert sum(body.startswith(b'{\n  "breed_') for _, _, body in workflow) >= 2
    assert workflow[-1][:2] == (500, "application/json") and b"Error executing cat_dog" in workflow[-1][2]
