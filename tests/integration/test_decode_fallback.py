"""Every JPEG the CPU decodes, a CUDA worker decodes: what nvJPEG cannot decode (by its frame header, or because it
raised) is decoded on the CPU and counted in SegserveDecodeFallbacks (#48). Without a GPU the device decoder is a
stand-in: `jpeg_on_device` on, `decode_jpeg_on_device` replaced."""

import io
import json
import logging
import types

import pytest
import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_image, decode_jpeg, encode_png

from handlers import classmap, limits
from handlers.segmentation import SegmentationHandler, jpeg_frame, read_jpeg_frame
from segserve.model.synthetic import make_sample
from tests.conftest import make_context, status_of, with_rows
from tests.unit.test_handlers import jpeg_bytes, png_bytes

REFUSED = "Error while decoding JPEG images: Failed to decode the image"  # what nvJPEG answered #48's CMYK JPEG


def pillow_jpeg(mode: str = "RGB", height: int = 256, width: int = 448, seed: int = 31, **options) -> bytes:
    """A synthetic scene the trained network segments, saved by Pillow in `mode` (CMYK, L, RGB …)."""
    image = Image.fromarray(make_sample(seed, height, width)[0].permute(1, 2, 0).numpy()).convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=85, **options)
    return buffer.getvalue()


def served(handler, bodies: list[bytes]) -> tuple[list[bytes], list[int], dict[str, float]]:
    """The answers, their statuses and the TorchServe counters the handler reported for one batch."""
    counters: dict[str, float] = {}
    context = with_rows(make_context(None, {}), len(bodies))
    context.metrics = types.SimpleNamespace(add_counter=lambda name, value: counters.update({name: counters.get(name, 0) + value}))
    out = handler.handle([{"body": body} for body in bodies], context)
    return out, [status_of(context, i) for i in range(len(bodies))], counters


class FakeDeviceDecoder:
    """The GPU decoder as a test wants it: refuses the bodies it is told to (as nvJPEG raised on #48's CMYK JPEG),
    decodes the others on the CPU, and remembers every body it was asked for."""

    def __init__(self, refuse: tuple[bytes, ...] = ()):
        self.refuse, self.asked = set(refuse), []

    def __call__(self, data: torch.Tensor) -> torch.Tensor:
        body = data.numpy().tobytes()
        self.asked.append(body)
        if body in self.refuse:
            raise RuntimeError(REFUSED)
        return decode_jpeg(data)


@pytest.fixture(scope="module")
def cpu_seg(trained_weights):
    handler = SegmentationHandler()
    handler.initialize(make_context(trained_weights.parent, {}, trained_weights.name))
    return handler


@pytest.fixture
def device_seg(trained_weights):
    """A handler that takes itself for a CUDA worker's: JPEGs go to decode_jpeg_on_device (set a FakeDeviceDecoder)."""
    handler = SegmentationHandler()
    handler.initialize(make_context(trained_weights.parent, {}, trained_weights.name))
    handler.jpeg_on_device = True
    return handler


def test_rows_the_device_decoder_refuses_are_decoded_on_the_cpu_and_answered_as_the_cpu_answers(cpu_seg, device_seg, caplog):
    refused, refused_large = jpeg_bytes(seed=41), jpeg_bytes(600, 1000, seed=42)  # the large one: reduced CPU decode
    bodies = [refused, png_bytes(seed=43), jpeg_bytes(seed=44), refused_large]
    device_seg.decode_jpeg_on_device = fake = FakeDeviceDecoder(refuse=(refused, refused_large))
    want, want_statuses, _ = served(cpu_seg, bodies)
    assert want_statuses == [200] * 4
    assert all(len(set(classmap.unpack(answer).labels.flatten().tolist())) == 2 for answer in want)  # not one flat class
    for _ in range(2):  # a second batch: counted again, not logged again
        got, statuses, counters = served(device_seg, bodies)
        assert statuses == [200] * 4
        assert got == want  # the same class map bytes, batch-mates included
        assert counters["SegserveDecodeFallbacks"] == 2
    assert fake.asked == [refused, bodies[2], refused_large] * 2  # every JPEG went to the device first, the PNG never
    warnings = [r.getMessage() for r in caplog.records if "SegserveDecodeFallbacks" in r.getMessage()]
    assert len(warnings) == 1 and REFUSED in warnings[0], warnings


def test_a_cmyk_jpeg_goes_to_the_cpu_without_asking_the_device_decoder(cpu_seg, device_seg):
    cmyk, grey = pillow_jpeg("CMYK", seed=51), pillow_jpeg("L", seed=52)
    cmyk_large = pillow_jpeg("CMYK", 600, 1000, seed=53)
    device_seg.decode_jpeg_on_device = fake = FakeDeviceDecoder()
    bodies = [cmyk, grey, cmyk_large]
    got, statuses, counters = served(device_seg, bodies)
    assert statuses == [200] * 3
    assert fake.asked == [grey]  # 4 components: nvJPEG is not asked; 1 component: it is
    assert got == served(cpu_seg, bodies)[0]
    assert counters["SegserveDecodeFallbacks"] == 2


def test_a_corrupt_jpeg_both_decoders_refuse_is_a_400_and_not_a_fallback(device_seg):
    whole = jpeg_bytes(seed=61)
    corrupt = whole[: len(whole) // 3]
    device_seg.decode_jpeg_on_device = FakeDeviceDecoder(refuse=(corrupt,))
    out, statuses, counters = served(device_seg, [corrupt, jpeg_bytes(seed=62)])
    assert statuses == [400, 200]
    error = json.loads(out[0])["error"]
    assert error.startswith("could not decode the jpeg image: ") and REFUSED not in error  # the CPU decoder's reason
    assert counters.get("SegserveDecodeFallbacks", 0) == 0


def patched(body: bytes, offset: int, value: int) -> bytes:
    """The JPEG with one byte of its (first) SOF0 segment changed: offset 1 is the marker, 4 the sample precision."""
    at = body.index(b"\xff\xc0")
    return body[: at + offset] + bytes([value]) + body[at + offset + 1 :]


@pytest.mark.parametrize(
    "body, reason",
    [
        (pillow_jpeg("RGB"), None),
        (pillow_jpeg("RGB", progressive=True), None),
        (pillow_jpeg("L"), None),
        (pillow_jpeg("CMYK"), "4 colour components"),
        (patched(pillow_jpeg("RGB"), 4, 12), "12-bit samples"),
        (patched(pillow_jpeg("RGB"), 1, 0xC3), "frame type SOF3"),
        (patched(pillow_jpeg("RGB"), 1, 0xC9), "frame type SOF9"),
    ],
    ids=["baseline", "progressive", "grey", "cmyk", "12-bit", "lossless", "arithmetic"],
)
def test_the_frame_header_says_what_nvjpeg_cannot_decode(body, reason):
    frame = read_jpeg_frame(body)
    assert (frame.height, frame.width) == jpeg_frame(body) == (256, 448)
    refusal = limits.nvjpeg_refusal(frame.marker, frame.precision_bits, frame.components)
    assert refusal == reason if reason is None else reason in refusal


def test_a_cpu_worker_does_not_warm_up(trained_weights, monkeypatch):
    """The warm-up is for CUDA's lazy loading; CPU workers start as before (tests count their start time)."""
    warmed = []
    monkeypatch.setattr(SegmentationHandler, "warm_up", lambda self: warmed.append(self))
    handler = SegmentationHandler()
    handler.initialize(make_context(trained_weights.parent, {}, trained_weights.name))
    assert handler.device.type == "cpu" and not handler.jpeg_on_device and warmed == []


@pytest.mark.gpu
def test_on_cuda_every_jpeg_the_cpu_decodes_is_answered(cpu_seg, trained_weights, caplog):
    """#48: nvJPEG refused a valid CMYK JPEG with a 400. On the GPU now: 200 for every kind, and the CMYK row is
    decoded as the CPU decodes it: the same bytes as a PNG of the CPU's pixels through the same GPU worker. Against
    the CPU worker the network itself differs in the last bits (cuDNN), so there a few boundary pixels may too."""
    caplog.set_level(logging.INFO)
    gpu_seg = SegmentationHandler()
    gpu_seg.initialize(make_context(trained_weights.parent, {}, trained_weights.name, gpu_id=0))
    assert gpu_seg.device.type == "cuda" and gpu_seg.jpeg_on_device
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("warmed up on cuda") for m in messages) and not any("warm-up of" in m for m in messages), messages
    cmyk = pillow_jpeg("CMYK", seed=71)
    others = [pillow_jpeg("RGB", seed=72, progressive=True), pillow_jpeg("L", seed=73), jpeg_bytes(seed=74)]
    got, statuses, counters = served(gpu_seg, [cmyk, *others])
    assert statuses == [200] * 4
    assert counters["SegserveDecodeFallbacks"] >= 1  # the CMYK row at least
    cpu_pixels = decode_image(torch.frombuffer(bytearray(cmyk), dtype=torch.uint8), mode=ImageReadMode.RGB)
    as_png = encode_png(cpu_pixels).numpy().tobytes()  # decoded on the CPU by any worker: the same pixels
    assert got[0] == served(gpu_seg, [as_png, *others])[0][0]
    on_cpu = classmap.unpack(served(cpu_seg, [cmyk])[0][0]).labels
    assert (classmap.unpack(got[0]).labels.cpu() == on_cpu).float().mean() > 0.99
    for answer in got[1:]:  # nvJPEG's rows: its pixels differ from libjpeg's in the last bit of some
        unpacked = classmap.unpack(answer)
        assert unpacked.labels.shape == (256, 448) and (unpacked.original_height, unpacked.original_width) == (256, 448)
        assert int(unpacked.labels.max()) < unpacked.num_classes
