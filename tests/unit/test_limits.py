"""Every node refuses what its codecs cannot handle with a 400 naming the limit, and no row takes its batch-mates down.

The boundary inputs run in a child process: before these limits, a side over 65,500 px crashed the
worker (torchvision's encode_jpeg, SIGSEGV), which a test in this process could not survive.
"""

import json
import struct

import pytest
import torch
from torchvision.io import encode_jpeg

from handlers import classmap, limits
from handlers.base import SegserveHandler
from handlers.jpeg import JpegHandler
from handlers.segmentation import SegmentationHandler
from segserve.model.synthetic import make_sample
from tests.conftest import make_context, status_of, with_rows

RAW_SHAPE = (3, 256, 448)


def run(handler, bodies):
    context = with_rows(make_context(None, {}), len(bodies))
    out = handler.handle([{"body": b} for b in bodies], context)
    return out, [status_of(context, i) for i in range(len(bodies))]


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


def test_finite_values_whose_sum_overflows_are_not_refused():
    huge = torch.full(RAW_SHAPE, 3e38, dtype=torch.float32)  # finite, but their float32 sum is inf
    assert not torch.isfinite(huge.sum()) and limits.non_finite_error(huge) is None
    huge[0, 0, 0] = float("nan")
    assert limits.non_finite_error(huge).startswith("raw tensor has 1 non-finite value(s)")
    assert limits.non_finite_error(torch.zeros(RAW_SHAPE, dtype=torch.float16)) is None


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
def test_a_row_that_breaks_a_hook_gets_its_own_500_and_its_batch_mates_are_served(micro_batch_size, overlap, caplog):
    handler = Flaky()
    handler.initialize(make_context(None, {"micro_batch_size": micro_batch_size, "overlap": overlap}))
    bodies = [b"a", b"decode-bug", b"b", b"predict-bug", b"encode-bug", b"c"]
    out, statuses = run(handler, bodies)
    assert statuses == [200, 500, 200, 500, 500, 200]
    assert [out[i] for i in (0, 2, 5)] == [b"ok:a", b"ok:b", b"ok:c"]
    # the body says "internal error" and the request's id; what broke is in the worker's log under that id only
    failed = [json.loads(out[i]) for i in (1, 3, 4)]
    assert [body["error"] for body in failed] == [f"internal error (request id {body['request_id']})" for body in failed]
    assert len({body["request_id"] for body in failed}) == 3
    logged = {record.getMessage() for record in caplog.records}
    detail = "internal error while predicting this request: RuntimeError: the batch broke"
    predicted = f"request {failed[1]['request_id']} answered 500: {detail}"
    assert predicted in logged, logged


@pytest.mark.parametrize("body", [b'{"error": ', b'{"error": }', b'{"error": "\xff\xfe"}', b'{"error": 5}'])
def test_a_body_that_only_looks_like_an_upstream_error_is_refused_with_a_400(body):
    handler = JpegHandler()
    handler.initialize(make_context(None, {}))
    out, statuses = run(handler, [body, classmap.pack(torch.ones(4, 4, dtype=torch.uint8), 2, 8, 8)])
    assert statuses == [400, 200]
    assert json.loads(out[0])["error"].startswith("expected a segserve class map or an upstream node's error, got ")


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
