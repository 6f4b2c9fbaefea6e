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
from torchvision.io import decode_jpeg, encode_jpeg, encode_png

from handlers import classmap, limits
from handlers.base import SegserveHandler
from handlers.jpeg import JpegHandler
from handlers.pipeline import PipelineHandler
from handlers.segmentation import SegmentationHandler
from segserve.model.synthetic import make_sample
from tests.conftest import make_context, status_of, with_rows

RAW_SHAPE = (3, 256, 448)


def run(handler, bodies):
    context = with_rows(make_context(None, {}), len(bodies))
    out = handler.handle([{"body": b} for b in bodies], context)
    return out, [status_of(context, i) for i in range(len(bodies))]


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


@pytest.fixture(scope="module")
def seg(tiny_weights):
    handler = SegmentationHandler()
    handler.initialize(make_context(tiny_weights.parent, {}, tiny_weights.name))
    return handler


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), float("-inf")])
def test_a_raw_tensor_with_non_finite_values_is_refused(seg, poison):
    raw = torch.zeros(RAW_SHAPE, dtype=torch.float16)
    raw[1, 5, 7] = poison
    out, statuses = run(seg, [raw.numpy().tobytes(), torch.zeros(RAW_SHAPE, dtype=torch.float16).numpy().tobytes()])
    assert statuses == [400, 200]
    assert json.loads(out[0])["error"].startswith("raw tensor has 1 non-finite value(s) (NaN or Inf) of 344064")


def test_non_finite_raw_values_pass_when_allowed(tiny_weights):
    handler = SegmentationHandler()
    handler.initialize(make_context(tiny_weights.parent, {"allow_non_finite": True}, tiny_weights.name))
    _, statuses = run(handler, [torch.full(RAW_SHAPE, float("nan"), dtype=torch.float16).numpy().tobytes()])
    assert statuses == [200]


def test_a_png_header_claiming_a_side_over_the_png_decoders_limit_is_refused(seg):
    ihdr = struct.pack(">II", limits.PNG_MAX_SIDE_PX + 1, 1) + b"\x08\x02\x00\x00\x00"
    header_only = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + b"\x00" * 4
    out, statuses = run(seg, [header_only])
    assert statuses == [400]
    assert "the png decoder's limit is 1000000 pixels per side" in json.loads(out[0])["error"]


def test_decoder_errors_do_not_show_the_librarys_source_path(seg):
    whole = encode_jpeg(make_sample(4, 64, 64)[0]).numpy().tobytes()
    out, statuses = run(seg, [whole[: len(whole) // 2]])
    message = json.loads(out[0])["error"]
    assert statuses == [400]
    assert message == "could not decode the jpeg image: Image is incomplete or truncated"


def test_a_large_jpeg_is_decoded_at_reduced_scale_with_the_same_labels(tiny_weights, seg):
    big = torch.nn.functional.interpolate(make_sample(5, 256, 448)[0][None].float(), size=(2048, 3584), mode="nearest")[0]
    body = encode_jpeg(big.to(torch.uint8), quality=95).numpy().tobytes()
    reduced = seg.decode(body)
    assert reduced.pixels.shape == (3, 256, 448) and (reduced.original_height, reduced.original_width) == (2048, 3584)
    full = SegmentationHandler()
    full.initialize(make_context(tiny_weights.parent, {"reduced_jpeg_decode": False}, tiny_weights.name))
    assert full.decode(body).pixels.shape == (3, 2048, 3584)
    a, b = classmap.unpack(run(seg, [body])[0][0]), classmap.unpack(run(full, [body])[0][0])
    assert (a.labels == b.labels).float().mean() > 0.99


class Flaky(SegserveHandler):
    """A handler whose hooks fail on marked rows with errors that are not BadRequest (a bug, a codec surprise)."""

    def load(self, model_dir, settings, manifest):
        pass

    def decode(self, body):
        if body == b"decode-bug":
            raise KeyError("oops")
        return body

    def predict(self, items):
        if b"predict-bug" in items:
            raise RuntimeError("the batch broke")
        return items

    def encode(self, result):
        if result == b"encode-bug":
            raise ValueError("cannot encode")
        return b"ok:" + result


@pytest.mark.parametrize("micro_batch_size, overlap", [(0, False), (2, True)])
def test_a_row_that_breaks_a_hook_gets_its_own_500_and_its_batch_mates_are_served(micro_batch_size, overlap):
    handler = Flaky()
    handler.initialize(make_context(None, {"micro_batch_size": micro_batch_size, "overlap": overlap}))
    bodies = [b"a", b"decode-bug", b"b", b"predict-bug", b"encode-bug", b"c"]
    out, statuses = run(handler, bodies)
    assert statuses == [200, 500, 200, 500, 500, 200]
    assert [out[i] for i in (0, 2, 5)] == [b"ok:a", b"ok:b", b"ok:c"]
    assert json.loads(out[3])["error"] == "internal error while predicting this request: RuntimeError: the batch broke"
    assert json.loads(out[1])["error"].startswith("internal error while decoding this request: KeyError")


@pytest.mark.parametrize("body", [b'{"error": ', b'{"error": }', b'{"error": "\xff\xfe"}', b'{"error": 5}'])
def test_a_body_that_only_looks_like_an_upstream_error_is_refused_with_a_400(body):
    handler = JpegHandler()
    handler.initialize(make_context(None, {}))
    out, statuses = run(handler, [body, classmap.pack(torch.ones(4, 4, dtype=torch.uint8), 2, 8, 8)])
    assert statuses == [400, 200]
    assert json.loads(out[0])["error"].startswith("expected a segserve class map or an upstream node's error, got ")


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


def jpeg_with_scans(scans: int) -> bytes:
    """A valid progressive JPEG whose smallest scan is repeated until it has `scans` scans (libjpeg warns, decodes)."""
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(make_sample(9, 64, 96)[0].permute(1, 2, 0).numpy()).save(buffer, "JPEG", progressive=True)
    body = buffer.getvalue()
    starts = [i for i in range(len(body) - 1) if body[i : i + 2] == b"\xff\xda"] + [body.rindex(b"\xff\xd9")]
    smallest = min((body[a:b] for a, b in zip(starts, starts[1:], strict=False)), key=len)
    extra = scans - (len(starts) - 1)
    assert extra >= 0
    return body[: starts[-1]] + smallest * extra + body[starts[-1] :]


def test_a_jpeg_of_100_scans_is_answered_and_of_101_refused(seg):
    out, statuses = run(seg, [jpeg_with_scans(limits.JPEG_MAX_SCANS), jpeg_with_scans(limits.JPEG_MAX_SCANS + 1)])
    assert statuses == [200, 400]
    assert json.loads(out[1])["error"] == "jpeg of 101 scans is refused: the limit is 100 scans (encoders write 1 to about 20)"


def small_jpeg() -> bytes:
    return encode_jpeg(make_sample(10, 60, 100)[0]).numpy().tobytes()


def test_ff_da_bytes_outside_scans_are_not_counted_as_scans(seg):
    body = small_jpeg()
    app9 = b"\xff\xe9" + (2 + 2 * 200).to_bytes(2, "big") + b"\xff\xda" * 200  # an application segment full of FF DA
    after_eoi = b"\xff\xda" * 200  # e.g. a Motion Photo's video after the image
    _, statuses = run(seg, [body[:2] + app9 + body[2:] + after_eoi])
    assert statuses == [200]


@pytest.mark.parametrize(
    "body, message",
    [
        (b"\xff\xd8" + b"\xff\xfe\x00\x02" * 400_000, "jpeg of more than 1000 segments is refused (encoders write tens)"),
        (b"\xff\xd8" + b"\xff\xd0" * 400_000, "jpeg of more than 1000 segments is refused (encoders write tens)"),
        (b"\xff\xd8" + b"\xff" * 400_000, "JPEG is truncated or corrupt: no frame header found"),
    ],
)
def test_jpeg_headers_built_to_keep_the_walker_busy_are_refused(seg, body, message):
    out, statuses = run(seg, [body])
    assert statuses == [400] and json.loads(out[0])["error"] == message


def test_a_raw_float32_tensor_that_starts_like_a_jpeg_is_read_as_raw(tiny_weights):
    handler = SegmentationHandler()
    handler.initialize(make_context(tiny_weights.parent, {"raw_dtype": "float32"}, tiny_weights.name))
    raw = torch.zeros(RAW_SHAPE, dtype=torch.float32)
    raw.view(-1)[0] = struct.unpack("<f", b"\xff\xd8\x80\x3f")[0]  # 1.0066, a plausible normalised value
    body = raw.numpy().tobytes()
    assert body.startswith(b"\xff\xd8")
    _, statuses = run(handler, [body])
    assert statuses == [200]


@pytest.mark.parametrize("classes, label", [(2, 200), (0, 0)])
def test_a_class_map_with_labels_beyond_its_classes_is_refused(classes, label):
    handler = JpegHandler()
    handler.initialize(make_context(None, {}))
    labels = torch.full((4, 4), label, dtype=torch.uint8)
    out, statuses = run(handler, [classmap.pack(labels, classes, 8, 8), classmap.pack(labels * 0, 2, 8, 8)])
    assert statuses == [400, 200]
    assert json.loads(out[0])["error"] == (
        f"class map declares {classes} classes but holds label {label}: labels must be below the number of classes"
    )
