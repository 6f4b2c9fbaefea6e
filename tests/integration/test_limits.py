"""Every node refuses what its codecs cannot handle with a 400 naming the limit, and no row takes its batch-mates down.

The boundary inputs run in a child process: before these limits, a side over 65,500 px crashed the
worker (torchvision's encode_jpeg, SIGSEGV), which a test in this process could not survive.
"""

import json
import multiprocessing
import queue
import struct
import time
import zipfile

import pytest
import torch
from torchvision.io import decode_jpeg, encode_png

from handlers import classmap
from handlers.jpeg import JpegHandler
from handlers.pipeline import PipelineHandler
from handlers.segmentation import SegmentationHandler
from segserve.model.synthetic import make_sample
from tests.conftest import make_context
from tests.unit.test_limits import RAW_SHAPE, run  # noqa: F401 (fixtures among them)


def png_of(height: int, width: int) -> bytes:
    return encode_png(torch.full((3, height, width), 200, dtype=torch.uint8)).numpy().tobytes()


def small_png(seed=3) -> bytes:
    return encode_png(make_sample(seed, 100, 150)[0]).numpy().tobytes()


def in_child(function, *args, timeout_s: float = 180):
    """function(*args) in a fresh process: (its result, None), or (None, why) when the child died or hung."""
    context = multiprocessing.get_context("spawn")
    answers = context.Queue()
    child = context.Process(target=_answer, args=(answers, function, args))
    child.start()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            try:
                return answers.get(timeout=0.5), None
            except queue.Empty:
                if not child.is_alive():
                    try:  # it may have answered and exited between the get's timeout and this check
                        return answers.get(timeout=1), None
                    except queue.Empty:
                        return None, f"the child process died (exit code {child.exitcode})"
        return None, f"no answer in {timeout_s:.0f} s"
    finally:
        child.kill()
        child.join()


def _answer(answers, function, args):
    answers.put(function(*args))


@pytest.fixture(scope="module")
def fused_dir(model_store, tmp_path_factory):
    folder = tmp_path_factory.mktemp("fused")
    with zipfile.ZipFile(model_store / "seg_jpeg_fused.mar") as archive:
        archive.extractall(folder)
    return folder


def fused_statuses(model_dir, bodies: list[bytes]) -> tuple[list[int], list[bytes]]:
    handler = PipelineHandler()
    handler.initialize(make_context(model_dir, {"spec": "seg_jpeg.yaml"}, "seg.pt"))
    out, statuses = run(handler, bodies)
    return statuses, out


def jpeg_node_statuses(bodies: list[bytes]) -> tuple[list[int], list[bytes]]:
    handler = JpegHandler()
    handler.initialize(make_context(None, {}))
    out, statuses = run(handler, bodies)
    return statuses, out


def test_fused_pipeline_answers_65500_px_sides_and_refuses_65501_its_batch_mates_served(fused_dir):
    good = small_png()
    bodies = [good, png_of(1, 65_500), png_of(65_501, 1), png_of(4, 70_000), good]
    result, crashed = in_child(fused_statuses, fused_dir, bodies)
    assert crashed is None, crashed
    statuses, out = result
    assert statuses == [200, 200, 400, 400, 200]
    assert decode_jpeg(torch.frombuffer(bytearray(out[1]), dtype=torch.uint8)).shape == (3, 1, 65_500)
    assert json.loads(out[2])["error"] == (
        "png of 1x65501 pixels is refused: the limit of a JPEG answer at the size sent is 65500 pixels per side"
    )
    assert "70000x4 pixels is refused" in json.loads(out[3])["error"]


def test_jpeg_node_refuses_class_maps_claiming_sides_its_encoder_cannot_write():
    labels = torch.ones(4, 4, dtype=torch.uint8)
    bodies = [classmap.pack(labels, 2, 1, 65_500), classmap.pack(labels, 2, 65_501, 1), classmap.pack(labels, 2, 8, 8)]
    result, crashed = in_child(jpeg_node_statuses, bodies)
    assert crashed is None, crashed
    statuses, out = result
    assert statuses == [200, 400, 200]
    assert json.loads(out[1])["error"] == "output of 1x65501 pixels is refused: the JPEG encoder's limit is 65500 pixels per side"


def corrupt_pngs() -> dict[str, bytes]:
    """PNGs whose pixel data libpng rejects: each crashed torchvision 0.29's decode_png (SIGSEGV)."""
    import zlib

    png = bytearray(encode_png(make_sample(8, 13, 7)[0]).numpy().tobytes())
    at = png.index(b"IDAT")
    length = struct.unpack(">I", png[at - 4 : at])[0]

    def with_idat(data: bytes) -> bytes:
        chunk = struct.pack(">I", len(data)) + b"IDAT" + data + struct.pack(">I", zlib.crc32(b"IDAT" + data))
        return bytes(png[: at - 4] + chunk + png[at + 8 + length :])

    bad_crc = bytearray(png)
    bad_crc[at + 4 + length] ^= 0xFF
    rows = bytearray(zlib.decompress(bytes(png[at + 4 : at + 4 + length])))
    rows[0] = 9  # filter types are 0–4
    return {
        "bad CRC": bytes(bad_crc),
        "bad filter byte": with_idat(zlib.compress(bytes(rows))),
        "too little data": with_idat(zlib.compress(b"\x00" * 10)),
        "corrupt zlib stream": with_idat(b"\x78\x9c" + b"\x55" * 40),
    }


def seg_statuses(weights, bodies: list[bytes]) -> tuple[list[int], list[bytes]]:
    handler = SegmentationHandler()
    handler.initialize(make_context(weights.parent, {}, weights.name))
    out, statuses = run(handler, bodies)
    return statuses, out


def test_pngs_whose_pixels_libpng_rejects_are_refused_not_crashing_the_worker(tiny_weights):
    good = small_png()
    bodies = [good, *corrupt_pngs().values(), good]
    result, crashed = in_child(seg_statuses, tiny_weights, bodies)
    assert crashed is None, crashed
    statuses, out = result
    # The pixels behind a wrong IDAT CRC are intact: Pillow, like browsers, does not check it and decodes them.
    assert statuses == [200, 200, 400, 400, 400, 200]
    assert all(json.loads(body)["error"].startswith("could not decode the png image: ") for body in out[2:-1])
