"""#66's first goal: the Ray engine answers what TorchServe 0.12 answers, status, content type and bytes, for
- the test corpus (chaos's hostile inputs: the fuzz corpus and the crafted ones; test_fanout's PNG and seed raw FP16
  body, the sample JPEGs, a good class map) through the catalog's members (seg, jpeg), its workflow
  (/wfpredict/seg_jpeg) and its fused .mar (seg_jpeg_fused), one request at a time, as `segserve serve` registers them;
- the workflow shapes of tests/system/test_fuse.py (chain, fan-out, the dog-breed join, the aggregate with a node that
  fails a row), built by its own builders with the official archivers, each .war and its fused .mar, their inputs sent
  all at once so that rows batch;
- TorchServe's built-in image_segmenter, object_detector and image_classifier handlers, each in a .mar of ours
  (benchmarks/foreign/build_image_segmenter.py: LR-ASPP; build_builtin_vision.py: Faster R-CNN as an eager model file
  and state dict, MobileNetV3-Small as TorchScript; random weights), sent the same five bodies.

One TorchServe and one Ray engine (HAProxy mode, `segserve serve --engine ray`'s default) serve everything, one after
the other (a third of the memory and none of the CPU of the other while each answers). Where TorchServe differs by
design (docs/ray.md, docs/fuse.md) the difference is asserted, not skipped: a leaf list of several leaves in DAG order
(TorchServe's: the order they finished), and header names in lower case (the dog-breed join's Content-Length).

Marked long: about a minute and a half for each engine to register its twenty-odd workers on 2 cores (docs/testing.md)."""

import json
import shutil
import subprocess
import sys
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from segserve.archives.catalog import Catalog
from segserve.cli import main
from segserve.engines.ray.engine import RayServe
from segserve.qa.chaos import hostile_inputs
from segserve.qa.fuzz_inputs import good_input
from segserve.serving.http import request
from segserve.serving.served_pipeline import register
from segserve.serving.server import TorchServe
from segserve.serving.ts_config import free_port
from tests.conftest import ROOT
from tests.integration.test_fanout import bodies as fanout_bodies
from tests.integration.test_ray_workflow import header_names_lowered
from tests.system.test_fuse import WORKFLOWS, in_leaf_order, post, tensors, user_store

pytestmark = pytest.mark.long

ENDPOINTS = {  # chaos's kinds of input, and the endpoints of the catalog's seg_jpeg family that take each
    "image": ("/predictions/seg", "/wfpredict/seg_jpeg", "/predictions/seg_jpeg_fused"),
    "classmap": ("/predictions/jpeg",),
}
# test_fuse.py's inputs of each shape (its tests' own), sent all at once to the .war and then to its fused .mar
SHAPE_INPUTS = {
    "chain": [tensors(6), [b"not a tensor", *tensors(3)]],
    "fanout": [tensors(4)],
    "dogbreed": [[b" dog-rex ", b"cat-tom", b"dog-mutt", b"refuse", b"dog-fido", b"cat-felix", b"dog-mutt-2", b"dog-ace"]],
    "aggregate": [[b"abc", b"Hello", b"x y", b"q"], [b"abc", b"many", b"xyz"]],
}
LEAVES = {"fanout": ["histogram", "checksum"]}  # a shape of several leaves: TorchServe lists them as they finished
FUSED = {"workers": 1, "batch_size": 4, "max_batch_delay_ms": 200}  # test_fuse.py's registration of a fused .mar
BUILT_INS = {  # each of TorchServe's built-in vision handlers, in an archive of its name
    "segmenter": "/predictions/image_segmenter",
    "detector": "/predictions/object_detector",
    "classifier": "/predictions/image_classifier",
}


def quiet(*_) -> None:
    pass


def corpus() -> list[tuple[str, str, bytes]]:
    """(kind, name, body), each body once per kind: good inputs first, then hostile_inputs()."""
    samples = [(p.name, p.read_bytes()) for p in sorted((ROOT / "samples").glob("*.jpg"))]
    good = [("image", name, body) for name, body in [*zip(("png", "raw fp16"), fanout_bodies()[:2], strict=True), *samples]]
    good.append(("classmap", "class map 256x448 of a 48x80 image", good_input("jpeg")))
    seen, items = set(), []
    for kind, name, body in [*good, *((kind, name, body) for name, kind, body, _ in hostile_inputs())]:
        if (kind, body) not in seen:
            seen.add((kind, body))
            items.append((kind, name, body))
    return items


def image_inputs() -> list[tuple[str, bytes]]:
    """What the built-in handlers are sent: two images (a 300×520 PNG, samples/shapes_1.jpg), a raw FP16 tensor, a
    truncated JPEG and text."""
    png, raw, jpeg = fanout_bodies()
    return [("png", png), ("raw fp16", raw), ("jpeg", jpeg), ("truncated jpeg", jpeg[:2000]), ("text", b"not an image")]


@pytest.fixture(scope="module")
def store(tmp_path_factory, model_store) -> Path:
    """The catalog's seg_jpeg family (session model_store), test_fuse.py's shapes and their fused .mar files, and
    the .mar files of TorchServe's built-in vision handlers, in one model store."""
    folder = tmp_path_factory.mktemp("same_bytes_store")
    for name in ("seg.mar", "jpeg.mar", "seg_jpeg.war", "seg_jpeg_fused.mar"):
        shutil.copy(model_store / name, folder / name)
    user_store(folder)
    for name in WORKFLOWS:
        assert main(["fuse", str(folder / f"{name}.war"), "--model-store", str(folder)]) == 0
    for builder in ("build_image_segmenter.py", "build_builtin_vision.py"):
        done = subprocess.run([sys.executable, str(ROOT / "benchmarks/foreign" / builder), str(folder)], capture_output=True, timeout=300)
        assert done.returncode == 0, done.stderr.decode()[-2000:]
    return folder


def register_everything(engine, at_once: int) -> None:
    """What each engine serves, through TorchServe's management API: the catalog's family as `segserve serve`
    registers it, test_fuse.py's .war files and fused .mar files as it registers them, the built-in handlers' .mar files."""
    catalog = Catalog(ROOT)
    targets = [catalog.target(name) for name in catalog.family("seg_jpeg")]
    with ThreadPoolExecutor(at_once) as pool:
        jobs = [pool.submit(register, engine, targets, quiet)]
        jobs += [pool.submit(engine.register_workflow, f"{name}.war", name, quiet) for name in WORKFLOWS]
        jobs += [pool.submit(engine.register_model, f"fused_{name}.mar", f"fused_{name}", **FUSED, log=quiet) for name in WORKFLOWS]
        for path in BUILT_INS.values():
            name = path.rsplit("/", 1)[1]
            jobs.append(pool.submit(engine.register_model, f"{name}.mar", name, workers=1, log=quiet))
        for job in jobs:
            job.result()


def answers_of(engine) -> dict[str, dict]:
    """Every answer of the engine, (status, content type, bytes), by group and by (path, input)."""
    token, url = engine.token("inference"), engine.url("inference")

    def one(path: str, body: bytes) -> tuple[int, str, bytes]:
        reply = request(url, "POST", path, token, body, timeout_s=120)
        return reply.status, reply.content_type, reply.body

    catalog = {(path, name): one(path, body) for kind, name, body in corpus() for path in ENDPOINTS[kind]}
    shapes = {}
    for shape, rounds in SHAPE_INPUTS.items():
        for round_, bodies in enumerate(rounds):
            for path in (f"/wfpredict/{shape}", f"/predictions/fused_{shape}"):
                replies = post(engine, [(path, body) for body in bodies])
                shapes |= {(path, round_, i): (r.status, r.content_type, r.body) for i, r in enumerate(replies)}
    built_ins = {group: {(path, name): one(path, body) for name, body in image_inputs()} for group, path in BUILT_INS.items()}
    return {"catalog": catalog, "shapes": shapes, **built_ins}


@pytest.fixture(scope="module")
def torchserve_answers(store, tmp_path_factory) -> dict[str, dict]:
    began = time.monotonic()
    with TorchServe(tmp_path_factory.mktemp("ts"), store, ROOT / "config.properties", free_ports=True) as server:
        register_everything(server, at_once=4)
        registered_s = time.monotonic() - began
        answers = answers_of(server)
    print(f"TorchServe: registered in {registered_s:.0f} s, answered in {time.monotonic() - began - registered_s:.0f} s")
    return answers


@pytest.fixture(scope="module")
def ray_answers(store, tmp_path_factory) -> dict[str, dict]:
    """The Ray engine as `segserve serve --engine ray` starts it (HAProxy, config.properties), on free ports; nothing
    of it left after stop."""
    engine = RayServe(
        tmp_path_factory.mktemp("ray"), model_store=store, config_template=ROOT / "config.properties", haproxy=True,
        port=free_port(), management_port=free_port(),
    )  # fmt: skip
    began = time.monotonic()
    engine.start(log=quiet)
    try:
        register_everything(engine, at_once=1)  # the engine registers one model at a time anyway
        registered_s = time.monotonic() - began
        answers = answers_of(engine)
        running = engine.process_ids()
    finally:
        engine.stop()
    print(f"Ray (HAProxy): started and registered in {registered_s:.0f} s, answered in {time.monotonic() - began - registered_s:.0f} s")
    assert engine.process_ids() == [] and alive(running) == []
    return answers


def alive(pids: list[int]) -> list[tuple[int, str, str]]:
    """(pid, name, status) of each process still running: a zombie has ended (its parent, maybe init, reaps it)."""
    found = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            if process.status() != psutil.STATUS_ZOMBIE:
                found.append((pid, process.name(), process.status()))
        except psutil.Error:  # gone
            continue
    return found


def differences(expected: dict, got: dict) -> list[str]:
    """Each (path, input) whose answers differ: both answers, shortened."""

    def shown(answer) -> str:
        return f"{answer[0]} {answer[1]!r} {len(answer[2])} bytes {answer[2][:120]!r}" if answer else "none"

    differ = [key for key in expected | got if expected.get(key) != got.get(key)]
    return [f"{key}: TorchServe {shown(expected.get(key))}, Ray {shown(got.get(key))}" for key in differ]


def test_the_corpus_through_the_catalogs_members_workflow_and_fused_gets_torchserves_answers(torchserve_answers, ray_answers):
    expected, got = torchserve_answers["catalog"], ray_answers["catalog"]
    assert not differences(expected, got), "\n".join(differences(expected, got)[:10])
    # the corpus reaches every kind of answer: a JPEG, a refusal, and /wfpredict's 200 that carries a node's refusal
    # (TorchServe answers a workflow 200 whatever its nodes' statuses were: docs/fuse.md)
    assert expected["/predictions/seg_jpeg_fused", "shapes_0.jpg"][:2] == (200, "image/jpeg")
    assert expected["/wfpredict/seg_jpeg", "shapes_0.jpg"][:2] == (200, "application/json")
    assert expected["/predictions/seg", "truncated jpeg"][0] == 400
    status, _, body = expected["/wfpredict/seg_jpeg", "truncated jpeg"]
    assert status == 200 and "error" in json.loads(body), body[:200]
    assert {status for status, _, _ in expected.values()} >= {200, 400}


def test_the_workflow_shapes_of_test_fuse_and_their_fused_mars_get_torchserves_answers_but_for_the_documented_two(
    torchserve_answers, ray_answers
):
    """docs/ray.md: several leaves are listed in DAG order (TorchServe: as they finished; test_fuse's in_leaf_order
    moves them, cutting TorchServe's own text); header names reach a handler in lower case (the dog-breed join's
    `Content-Length` is null on Ray)."""
    expected, got = torchserve_answers["shapes"], ray_answers["shapes"]
    documented = {}
    for (path, round_, i), (status, kind, body) in expected.items():
        shape = path.rsplit("/", 1)[1].removeprefix("fused_")  # a fused .mar runs the same handlers
        if shape in LEAVES and status == 200:
            body = in_leaf_order(body, LEAVES[shape])
        if shape == "dogbreed":
            body = header_names_lowered(body)
        documented[path, round_, i] = (status, kind, body)
    assert not differences(documented, got), "\n".join(differences(documented, got)[:10])
    # the differences are real where asserted: TorchServe's join saw the Content-Length, Ray's none
    dog = "/wfpredict/dogbreed", 0, 0  # " dog-rex ": 9 bytes
    assert b'"request_length": "9"' in expected[dog][2] and b'"request_length": null' in got[dog][2]
    assert [got["/wfpredict/aggregate", 1, i][0] for i in range(3)] == [200, 500, 200]  # a node failing a row, on both


def test_torchserves_built_in_image_segmenter_gets_torchserves_answers(torchserve_answers, ray_answers):
    expected, got = torchserve_answers["segmenter"], ray_answers["segmenter"]
    assert not differences(expected, got), "\n".join(differences(expected, got))
    # TorchServe answers the handler's JSON list with no content type, and a body that is no image: the batch failed
    segmenter = BUILT_INS["segmenter"]
    assert expected[segmenter, "jpeg"][:2] == (200, "") and expected[segmenter, "text"][0] == 503


def class_names(archive: Path) -> set[str]:
    """The names of the archive's index_to_name.json, which the handler answers with."""
    with zipfile.ZipFile(archive) as zipped:
        return set(json.loads(zipped.read("index_to_name.json")).values())


def test_torchserves_built_in_object_detector_gets_torchserves_answers(store, torchserve_answers, ray_answers):
    """An eager model (the archive's model file and state dict) and the handler's own 0.5 threshold: boxes of the
    archive's classes in both images."""
    expected, got = torchserve_answers["detector"], ray_answers["detector"]
    assert not differences(expected, got), "\n".join(differences(expected, got))
    detector = BUILT_INS["detector"]
    for image in ("jpeg", "png"):
        status, kind, body = expected[detector, image]
        assert (status, kind) == (200, ""), (image, status, body[:200])
        detections = json.loads(body)  # [{class name: [x1, y1, x2, y2], "score": s}, ...]
        scores = [found.pop("score") for found in detections]
        assert len(detections) >= 5 and min(scores) >= 0.5 and {len(found) for found in detections} == {1}, body[:300]
        assert {name for found in detections for name in found} <= class_names(store / "object_detector.mar") - {"background"}
    # what PIL cannot read fails the batch: TorchServe's 503, the same envelope on Ray
    assert [expected[detector, name][0] for name in ("raw fp16", "truncated jpeg", "text")] == [503, 503, 503]


def test_torchserves_built_in_image_classifier_gets_torchserves_answers(store, torchserve_answers, ray_answers):
    """TorchScript and the handler's top five, named by the archive's index_to_name.json."""
    expected, got = torchserve_answers["classifier"], ray_answers["classifier"]
    assert not differences(expected, got), "\n".join(differences(expected, got))
    classifier = BUILT_INS["classifier"]
    tops = {}
    for image in ("jpeg", "png"):
        status, kind, body = expected[classifier, image]
        assert (status, kind) == (200, ""), (image, status, body[:200])
        tops[image] = json.loads(body)
        assert len(tops[image]) == 5 and set(tops[image]) <= class_names(store / "image_classifier.mar"), body
        assert list(tops[image].values()) == sorted(tops[image].values(), reverse=True), body
    assert tops["jpeg"] != tops["png"]  # calibrated random weights: the answer depends on the image
    assert [expected[classifier, name][0] for name in ("raw fp16", "truncated jpeg", "text")] == [503, 503, 503]
