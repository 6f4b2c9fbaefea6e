"""Semantic segmentation: image or raw tensor in, compact class map out.

Accepts JPEG/PNG bytes or a raw tensor body of exactly the configured
shape × dtype (the seed's FP16 [3, 256, 448] = 688,128 bytes, already
normalised). Answers a class map (see classmap.py): argmax is taken on the
device, so only 1 byte per model pixel leaves the worker, never logits.
"""

# First, before torchvision (also in an archive, whose top-level handler is a copy of this file): torchvision
# without torch._dynamo, about 2 s of a worker's start (handlers/light_torchvision.py).
import handlers.light_torchvision  # noqa: F401

# isort: split
import io
import logging
import re
import struct
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torchvision.io import ImageReadMode, decode_image, decode_jpeg, encode_jpeg

from handlers import classmap, limits, optimize
from handlers.base import BadRequest, SegserveHandler, entry_point
from handlers.batching import StagingPool, Streams, view_bytes
from handlers.segnet import DEFAULT_BACKBONE, MEAN_RGB, STD_RGB, SegNet
from handlers.settings import parse_settings

DTYPES = {"float16": torch.float16, "float32": torch.float32, "bfloat16": torch.bfloat16}
PRECISIONS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
JPEG_SOI = b"\xff\xd8"
# Start-of-frame markers carry the image size; C4 (DHT), C8 (JPG) and CC (DAC) do not.
JPEG_SOF_MARKERS = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
JPEG_FILL = re.compile(rb"\xff+")
JPEG_NEXT_MARKER = re.compile(rb"\xff(?=[^\x00\xd0-\xd7])")  # in entropy-coded data FF is followed by 00 or RSTn

logger = logging.getLogger(__name__)


@dataclass
class SegmentationSettings:
    backbone: str = DEFAULT_BACKBONE
    num_classes: int = 2
    input_height: int = 256
    input_width: int = 448
    raw_dtype: str = "float16"
    precision: str = "fp32"
    channels_last: bool = True
    optimize: str = "eager"  # eager | compile | int8 | ipex (handlers/optimize.py)
    max_image_pixels: int = 25_000_000
    # NaN/Inf in a raw tensor body give a meaningless mask: refused with a 400 unless allowed here.
    allow_non_finite: bool = False
    # A JPEG at least twice the model's input size on both sides is decoded at 1/2, 1/4 or 1/8 scale
    # (libjpeg's DCT scaling): the model needs only its input size, and a full decode of a 25-megapixel
    # photo keeps its batch-mates waiting. false: always decode at full size.
    reduced_jpeg_decode: bool = True
    # The serving path alone (benchmarks/serving_path.yaml): no network runs, the input's first num_classes channels
    # stand in for its logits, so a request costs everything around the model and nothing of it.
    skip_network: bool = False


class Decoded(NamedTuple):
    pixels: torch.Tensor  # uint8 [3, h, w] image (on the GPU when nvJPEG decoded it), or the raw tensor [3, H, W]
    is_raw: bool  # raw tensors are already normalised
    original_height: int
    original_width: int


class JpegFrame(NamedTuple):
    """What a JPEG's frame header (SOF segment) says: its size, and what nvJPEG needs to know whether it can decode it."""

    height: int
    width: int
    marker: int  # C0 baseline, C1 extended, C2 progressive, C3 lossless, C9+ arithmetic …
    precision_bits: int
    components: int  # 0 when the body ends inside the frame header


class Staged(NamedTuple):
    """A micro-batch written into its staging buffer (host rows filled; rows decoded on the GPU are filled in infer)."""

    host: torch.Tensor  # float32 [n, 3, H, W] in the model's memory format: a reused (pinned with CUDA) buffer
    items: list[Decoded]
    position: int  # in the TorchServe batch: micro-batches in flight together never share a buffer


def image_size(body: bytes) -> tuple[str, int, int] | None:
    """(kind, height, width) read from a PNG or JPEG header without decoding; None if neither. A JPEG's
    segments are walked to its end, so one with more scans or segments than limits.py allows is refused here."""
    header = image_header(body)
    return None if header is None else header[:3]


def image_header(body: bytes) -> tuple[str, int, int, JpegFrame | None] | None:
    """image_size's (kind, height, width) and, for a JPEG, its whole frame header."""
    if body.startswith(PNG_SIGNATURE):
        if len(body) < 24 or body[12:16] != b"IHDR":
            raise BadRequest("PNG is truncated before its IHDR header")
        width, height = struct.unpack(">II", body[16:24])
        return "png", height, width, None
    if not body.startswith(JPEG_SOI):
        return None
    frame = read_jpeg_frame(body)
    return "jpeg", frame.height, frame.width, frame


def jpeg_frame(body: bytes) -> tuple[int, int]:
    """(height, width) of a JPEG's frame header (read_jpeg_frame)."""
    return tuple(read_jpeg_frame(body)[:2])


def read_jpeg_frame(body: bytes) -> JpegFrame:
    """A JPEG's frame header, after walking its segments from SOI to EOI (or its end).

    Scans are counted here, where they are known to be scans: FF DA bytes also occur inside APPn payloads,
    EXIF thumbnails and data after EOI. Every step that could repeat per byte runs in C (regular expressions),
    so a 16 MiB body of fill bytes or stuffed entropy data costs milliseconds."""
    frame, pos, segments, scans = None, 2, 0, 0
    while pos + 4 <= len(body):
        if body[pos] != 0xFF:
            if frame is None:
                raise BadRequest(f"JPEG is corrupt: expected a marker at byte {pos}")
            break  # after the frame header: the decoder reports what is wrong
        pos = JPEG_FILL.match(body, pos).end() - 1  # FF FF … FF xx: fill bytes before the marker xx
        marker = body[pos + 1] if pos + 1 < len(body) else 0xD9
        segments += 1
        if segments > limits.JPEG_MAX_SEGMENTS:
            raise BadRequest(f"jpeg of more than {limits.JPEG_MAX_SEGMENTS} segments is refused (encoders write tens)")
        if marker == 0xD9:  # EOI: anything after it is not the image
            break
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            pos += 2
            continue
        if pos + 4 > len(body):
            break
        if marker in JPEG_SOF_MARKERS and frame is None and pos + 9 <= len(body):
            components = body[pos + 9] if pos + 10 <= len(body) else 0
            frame = JpegFrame(*struct.unpack(">HH", body[pos + 5 : pos + 9]), marker, body[pos + 4], components)
        pos += 2 + struct.unpack(">H", body[pos + 2 : pos + 4])[0]
        if marker == 0xDA:
            scans += 1
            if scans > limits.JPEG_MAX_SCANS:
                raise BadRequest(limits.jpeg_scans_error(scans))
            found = JPEG_NEXT_MARKER.search(body, pos)  # past the entropy-coded data: FF 00 and restarts are inside it
            if found is None:
                break
            pos = found.start()
    if frame is None:
        raise BadRequest("JPEG is truncated or corrupt: no frame header found")
    return frame


def decode_png(body: bytes) -> torch.Tensor:
    """uint8 [3, h, w] from any PNG (grey, palette, alpha dropped as torchvision drops it, 1–16 bits, interlaced,
    an APNG's first frame), with Pillow. Not torchvision 0.29's decode_png: any error libpng reports while
    reading the pixels (a bad CRC, a bad filter byte, a short or corrupt zlib stream) crashes the worker
    with SIGSEGV instead of raising, measured with 155-byte inputs the fuzzer found (tests/fuzz_corpus/)."""
    with Image.open(io.BytesIO(body), formats=["PNG"]) as image:
        if image.mode.startswith("I"):  # 16-bit grey ("I;16", "I"): to the 0–255 scale the normalisation expects
            grey = torch.from_numpy(np.array(image).astype(np.int32)) // 257
            return grey.clamp(0, 255).to(torch.uint8).expand(3, -1, -1)
        pixels = np.array(image.convert("RGB"))  # 16-bit colour: Pillow keeps the high byte (value // 256)
    return torch.from_numpy(pixels).permute(2, 0, 1)


def decode_jpeg_reduced(body: bytes, min_height: int, min_width: int) -> torch.Tensor:
    """uint8 [3, h, w] decoded at the smallest DCT scale (1/2 … 1/8) that keeps at least min_height × min_width:
    a fraction of a full decode's time and memory. torchvision has no scaled decode; Pillow (torchvision's own
    dependency) exposes libjpeg's through draft(). CMYK and other colour spaces are decoded at full size."""
    try:
        image = Image.open(io.BytesIO(body), formats=["JPEG"])
    except (OSError, SyntaxError):  # 12-bit, lossless …: torchvision decodes or names what it cannot
        return decode_image(view_bytes(body), mode=ImageReadMode.RGB)
    with image:
        if image.mode not in ("RGB", "L"):
            return decode_image(view_bytes(body), mode=ImageReadMode.RGB)
        image.draft(image.mode, (min_width, min_height))  # picks a scale whose result is at least this size
        pixels = np.array(image.convert("RGB"))  # a writable copy torch can own
    return torch.from_numpy(pixels).permute(2, 0, 1)


def load_network(path: Path, settings: SegmentationSettings) -> torch.nn.Module:
    """A TorchScript file or an exported program (int8: segserve/model/quantize.py) as is, or a state_dict loaded into
    SegNet(backbone, num_classes); in eval mode."""
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
    if any(name.endswith("constants.pkl") for name in names):
        return torch.jit.load(str(path), map_location="cpu").eval()
    if any(name.endswith("/archive_format") for name in names):
        from torch.ao.quantization.fx import _decomposed  # noqa: F401 (registers the quantize/dequantize ops the program calls)

        return torch.export.load(str(path)).module()  # already in inference form: exported modules refuse .eval()
    if settings.optimize == "int8":
        raise ValueError(f"optimize 'int8' needs a quantised program as the serialized file, not the weights {path.name} (segserve build)")
    network = SegNet(settings.num_classes, settings.backbone)
    network.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return network.eval()


def prepare_network(path: Path, settings: SegmentationSettings, device: torch.device, batch_sizes: tuple[int, ...] = ()) -> torch.nn.Module:
    """The network as a worker runs it: loaded, on its device in its precision and memory format, optimised
    and (compiled variants) compiled for these batch sizes. segserve's bare forward and accuracy checks call this too."""
    dtype = PRECISIONS[settings.precision]
    memory_format = torch.channels_last if settings.channels_last else torch.contiguous_format
    network = load_network(path, settings).to(device, dtype=dtype, memory_format=memory_format)
    network = optimize.optimise(network, settings.optimize, device, dtype)
    if optimize.compiles(settings.optimize):
        example = torch.zeros(1, 3, settings.input_height, settings.input_width, device=device)
        optimize.warm_up(network, batch_sizes, example.contiguous(memory_format=memory_format), dtype)
    if settings.optimize == "int8" and batch_sizes:
        kernels = optimize.int8_kernels()  # in the worker's log: whether int8 really runs as int8
        level = logging.INFO if kernels["int8_convolutions"] else logging.WARNING
        logger.log(level, "int8: %s over %d compiled batch size(s)%s", kernels, len(batch_sizes),
                   "" if kernels["int8_convolutions"] else ": no int8 kernel in use, the program runs in fp32")  # fmt: skip
    return network


def copy_into(slot: torch.Tensor, source: torch.Tensor) -> None:
    """slot[:] = source for a [C, H, W] row of a channels_last buffer: the channels interleaved in the source's own
    dtype first, then one contiguous converting copy. Half the time of one strided converting copy (0.21 against
    0.41 ms for the seed's FP16 body on one thread), the same values."""
    interleaved = slot.permute(1, 2, 0)
    if interleaved.is_contiguous() and not source.permute(1, 2, 0).is_contiguous():
        interleaved.copy_(source.permute(1, 2, 0).contiguous())
    else:
        slot.copy_(source)


class FirstChannels(torch.nn.Module):
    """skip_network's stand-in: the input's first channels as logits, written out as a network writes its output
    (a dense tensor in the input's memory format: the class map of a strided view of the input took 4.7 ms a batch
    of 8 where a network's dense logits take 1.1; the copy, 1.6 ms, stands for the last layer's write)."""

    def __init__(self, num_classes: int):
        super().__init__()
        self.num_classes = num_classes

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        layout = torch.channels_last if batch.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format
        return batch[:, : self.num_classes].contiguous(memory_format=layout)


class SegmentationHandler(SegserveHandler):
    content_type = "application/octet-stream"

    def load(self, model_dir: str, settings: dict, manifest: dict) -> None:
        self.settings = s = parse_settings(SegmentationSettings, settings)
        if s.raw_dtype not in DTYPES or s.precision not in PRECISIONS:
            raise ValueError(
                f"raw_dtype must be one of {sorted(DTYPES)} and precision one of {sorted(PRECISIONS)} "
                f"(got {s.raw_dtype!r}, {s.precision!r})"
            )
        self.compute_dtype = PRECISIONS[s.precision]
        self.raw_dtype = DTYPES[s.raw_dtype]
        self.raw_nbytes = 3 * s.input_height * s.input_width * self.raw_dtype.itemsize
        memory_format = torch.channels_last if s.channels_last else torch.contiguous_format
        self.memory_format = memory_format
        self.buckets = optimize.batch_buckets(s.optimize, self.max_rows)  # compiled networks: fixed batch sizes
        self.network = prepare_network(Path(model_dir) / manifest["model"]["serializedFile"], s, self.device, self.buckets)
        if s.skip_network:
            logger.warning("skip_network: no network runs in this worker, its answers are not segmentations (serving-path benchmark)")
            self.network = FirstChannels(s.num_classes)
        # Normalisation on the 0–255 scale, so a uint8 image is copied in and normalised in place.
        self.norm = {
            kind: (torch.tensor(MEAN_RGB, device=dev).view(3, 1, 1) * 255, torch.tensor(STD_RGB, device=dev).view(3, 1, 1) * 255)
            for kind, dev in {"cpu": "cpu", self.device.type: self.device}.items()
        }
        self.pool = StagingPool(self.device)
        self.streams = Streams(self.device)
        self.decode_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        # nvJPEG decodes the JPEGs it can (limits.nvjpeg_refusal); the CPU the rest. Tests set this and replace
        # decode_jpeg_on_device to check the fallback without a GPU.
        self.jpeg_on_device = self.device.type == "cuda"
        self.fallback_logged = False
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # weights and constants were queued on the default stream: done before any batch
            self.warm_up()

    def warm_up(self) -> None:
        """CUDA only: the network once at max_rows rows and once at 1, and nvJPEG once, so that CUDA's lazy kernel
        loading, cuDNN's choice of algorithms and nvJPEG's decoder are paid here, not by a fresh worker's first
        requests (a GPU run: 37 req/s over a cold first point, ~930 warm). A failed warm-up is logged, not fatal."""
        s, started = self.settings, time.perf_counter()
        sizes = dict.fromkeys(optimize.padded_rows(rows, self.buckets) for rows in (self.max_rows, 1))
        try:
            with torch.inference_mode(), self.streams.compute_context():
                for rows in sizes:
                    batch = torch.zeros(rows, 3, s.input_height, s.input_width, device=self.device)
                    self.network(batch.contiguous(memory_format=self.memory_format).to(self.compute_dtype)).argmax(1)
            torch.cuda.synchronize(self.device)
        except Exception as error:  # a worker that cannot warm up may still serve
            logger.warning("warm-up of the network on %s failed, first requests pay for it: %s", self.device, error)
        try:
            self.decode_jpeg_on_device(encode_jpeg(torch.zeros(3, 16, 16, dtype=torch.uint8)))
            torch.cuda.synchronize(self.device)
        except Exception as error:
            logger.warning("warm-up of nvJPEG on %s failed, the first JPEG pays for it: %s", self.device, error)
        logger.info("warmed up on %s in %.2f s: the network at %s rows, nvJPEG", self.device, time.perf_counter() - started, list(sizes))

    def decode_jpeg_on_device(self, data: torch.Tensor) -> torch.Tensor:
        """nvJPEG, on a stream of its own: its output is allocated on the caller's stream, which must not be a stream
        whose freed blocks other queued work may still read."""
        with torch.cuda.stream(self.decode_stream):
            return decode_jpeg(data, mode=ImageReadMode.RGB, device=self.device)

    def decode(self, body: bytes) -> Decoded:
        s = self.settings
        try:
            header = image_header(body)
        except BadRequest:
            if len(body) == self.raw_nbytes:  # a raw tensor whose first bytes happen to read as FF D8 or a PNG signature
                return self.decode_raw(body)
            raise
        if header is None:
            return self.decode_raw(body)
        kind, height, width, frame = header
        refused = limits.image_side_error(kind, height, width, limits.DECODER_MAX_SIDE_PX[kind], f"the {kind} decoder's limit") or (
            limits.image_side_error(kind, height, width, limits.ANSWER_MAX_SIDE_PX, "the limit of a JPEG answer at the size sent")
        )
        if refused:
            raise BadRequest(refused)
        if height * width > s.max_image_pixels:
            raise BadRequest(f"{kind} of {width}x{height} pixels is refused: the limit is {s.max_image_pixels} pixels")
        data = view_bytes(body)
        fallback = None  # why nvJPEG did not decode a JPEG on a CUDA worker
        if kind == "jpeg" and self.jpeg_on_device:
            fallback = limits.nvjpeg_refusal(frame.marker, frame.precision_bits, frame.components)
            if fallback is None:
                try:
                    return Decoded(self.decode_jpeg_on_device(data), False, height, width)
                except Exception as error:  # what nvJPEG cannot decode, libjpeg may: the CPU decides
                    fallback = f"nvJPEG: {limits.codec_message(error)}"
        try:
            image = self.decode_on_host(kind, body, data, height, width)
        except Exception as error:  # torchvision raises RuntimeError; Pillow OSError, SyntaxError, DecompressionBombError …
            raise BadRequest(f"could not decode the {kind} image: {limits.codec_message(error)}") from None
        if fallback is not None:
            self.count_fallback(fallback)
        return Decoded(image, False, height, width)

    def decode_on_host(self, kind: str, body: bytes, data: torch.Tensor, height: int, width: int) -> torch.Tensor:
        s = self.settings
        if kind == "png":
            return decode_png(body)
        if s.reduced_jpeg_decode and height >= 2 * s.input_height and width >= 2 * s.input_width:
            return decode_jpeg_reduced(body, s.input_height, s.input_width)
        return decode_image(data, mode=ImageReadMode.RGB)

    def count_fallback(self, reason: str) -> None:
        """A JPEG the CPU decoded on a CUDA worker: counted (SegserveDecodeFallbacks), the first reason logged."""
        self.stages.times.add("decode_fallbacks", 1)
        if not self.fallback_logged:
            self.fallback_logged = True
            logger.warning(
                "a JPEG nvJPEG cannot decode (%s) was decoded on the CPU; such rows are counted in SegserveDecodeFallbacks "
                "(logged once per worker)",
                reason,
            )

    def decode_raw(self, body: bytes) -> Decoded:
        s = self.settings
        if len(body) != self.raw_nbytes:
            raise BadRequest(
                f"expected a JPEG or PNG image, or a raw {s.raw_dtype} tensor of shape "
                f"[3, {s.input_height}, {s.input_width}] ({self.raw_nbytes} bytes); got {len(body)} bytes that are neither"
            )
        raw = view_bytes(body, self.raw_dtype).view(3, s.input_height, s.input_width)
        refused = None if s.allow_non_finite else limits.non_finite_error(raw)
        if refused:
            raise BadRequest(refused)
        return Decoded(raw, True, s.input_height, s.input_width)

    def fill(self, slot: torch.Tensor, item: Decoded) -> None:
        """Write one request into its row of the batch buffer: resize if needed, normalise in place."""
        if item.is_raw:
            copy_into(slot, item.pixels)
            return
        pixels = item.pixels
        if tuple(pixels.shape[1:]) != tuple(slot.shape[1:]):
            pixels = F.interpolate(pixels[None].float(), size=tuple(slot.shape[1:]), mode="bilinear", antialias=True, align_corners=False)[
                0
            ]
        mean, std = self.norm[slot.device.type]
        slot.copy_(pixels).sub_(mean).div_(std)

    def prepare(self, items: list[Decoded], position: int) -> Staged:
        """Write a micro-batch's rows into the staging buffer of its position in the batch. Runs in the decode
        stage: with overlap, micro-batch k+1 is written while k is in the model, so each position has its own buffer."""
        s = self.settings
        shape = (optimize.padded_rows(len(items), self.buckets), 3, s.input_height, s.input_width)  # rows past the items: padding
        host = self.pool.get(f"input.{position}", shape, torch.float32, memory_format=self.memory_format)
        for i, item in enumerate(items):
            if item.pixels.device.type != "cuda":
                self.fill(host[i], item)
        return Staged(host, items, position)

    @torch.inference_mode()
    def infer(self, staged: Staged | list[Decoded]) -> tuple[torch.Tensor, list[classmap.ClassMap]]:
        """The batch through the network: uint8 labels on the model's device, one ClassMap (a view) per row.

        In a fused pipeline the next node takes these directly, so nothing crosses to the host here."""
        if not isinstance(staged, Staged):
            staged = self.prepare(staged, 0)
        s, (host, items, position) = self.settings, staged
        shape = tuple(host.shape)
        on_device = [i for i, item in enumerate(items) if item.pixels.device.type == "cuda"]
        if self.streams.cuda:
            device_buffer = self.pool.get(f"input.{position}", shape, torch.float32, True, self.memory_format)
        else:
            device_buffer = host
        copying = time.perf_counter()
        batch = self.streams.to_device(host, device_buffer)
        if self.streams.cuda:  # on the CPU nothing is copied: no counter line a batch for it
            self.stages.times.add("copy_ms", (time.perf_counter() - copying) * 1000)
        with self.streams.compute_context():
            if on_device:  # nvJPEG decoded those rows on the decode stream: wait for it, not for the device
                self.streams.compute.wait_stream(self.decode_stream)
            for i in on_device:  # nvJPEG-decoded rows: filled on the device, after the copy of the others
                items[i].pixels.record_stream(self.streams.compute)
                self.fill(batch[i], items[i])
            forward = time.perf_counter()  # on CUDA: the launches (the kernels' time shows in copy_ms, which waits)
            logits = self.network(batch.to(self.compute_dtype))  # already in the model's memory format: fp32 is not copied
            labels = classmap.labels_of(logits[: len(items)])  # only the class map leaves the device, never logits
            self.stages.times.add("forward_ms", (time.perf_counter() - forward) * 1000)
        if self.streams.cuda:
            self.stages.times.add("host_to_device_bytes", host.numel() * host.element_size())
        ready = self.streams.done_event()  # a fused successor on another stream waits for this, not for later batches
        maps = [
            classmap.ClassMap(labels[i], s.num_classes, item.original_height, item.original_width, ready) for i, item in enumerate(items)
        ]
        return labels, maps

    def predict(self, staged: Staged | list[Decoded]) -> list[bytes]:
        labels, maps = self.infer(staged)
        if self.streams.cuda:  # into a reused pinned buffer on the copy stream
            copying = time.perf_counter()
            labels = self.streams.to_host(labels, self.pool.get("labels", tuple(labels.shape), torch.uint8))
            self.stages.times.add("copy_ms", (time.perf_counter() - copying) * 1000)
            self.stages.times.add("device_to_host_bytes", labels.numel())
        packing = time.perf_counter()
        packed = [classmap.pack(labels[i], m.num_classes, m.original_height, m.original_width) for i, m in enumerate(maps)]
        self.stages.times.add("answer_ms", (time.perf_counter() - packing) * 1000)
        return packed

    def encode(self, result: bytes) -> bytes:
        return result  # the class map was packed in predict, so the reused label buffer is free for the next batch


handle = entry_point(SegmentationHandler)
