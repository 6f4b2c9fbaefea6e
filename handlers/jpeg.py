"""JPEG post-processing: class map in, palette-coloured JPEG at the original size out.

A batch is encoded in one `torchvision.io.encode_jpeg` call: libjpeg-turbo
on the CPU, nvJPEG when the worker has a GPU (then only the JPEG bytes
cross to the host; encode_jpegs below says what that call needs first).
"""

# First, before torchvision (also in an archive, whose top-level handler is a copy of this file): torchvision
# without torch._dynamo, about 2 s of a worker's start (handlers/light_torchvision.py).
import handlers.light_torchvision  # noqa: F401

# isort: split
import base64
import json
import logging
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torchvision.io import encode_jpeg

from handlers import classmap, limits
from handlers.base import BadRequest, SegserveHandler, entry_point
from handlers.settings import parse_settings

UPSTREAM_ERROR_PREFIX = b'{"error": '
# The most output pixels the JPEG node makes per class-map pixel. A class map is the model's resolution and the
# original size is the client's: segserve's seg node at 256x448 gives up to 218 for a 25-megapixel image, at 64x96
# up to 4069. A larger factor is a small body asking for a large encode (19 bytes claiming 5000x5000 made 25 MP).
MAX_UPSCALE_PX_PER_PX = 4096
logger = logging.getLogger(__name__)


def encode_jpegs(images: list[torch.Tensor], quality: int) -> list[torch.Tensor]:
    """The JPEGs of uint8 [3, H, W] images, in host memory.

    On CUDA the images are complete before nvJPEG starts: torchvision's CUDA encoder (0.19 to 0.29 at least,
    encode_jpegs_cuda.cpp) encodes on a stream of its own and only makes the caller's stream wait for *that*
    one, never the other way round, so it can read an image whose kernels are still queued on the caller's
    stream. One at a time that rarely shows; with micro-batches overlapped the GPU is busy with the next
    batch, the colouring kernels wait, and the encoder read half-written images (wrong bytes on an H200,
    issue #48). Waiting on an event of this stream costs the host what the encoder's own stream synchronize
    costs it anyway."""
    if not images or images[0].device.type != "cuda":
        return encode_jpeg(images, quality=quality)
    device = images[0].device
    written = torch.cuda.Event()
    written.record(torch.cuda.current_stream(device))
    written.synchronize()
    # The encoder copies each JPEG out of its state on the legacy default stream (stream 0): the copy to the
    # host is queued there too, so it follows that copy whatever stream the caller was on.
    with torch.cuda.stream(torch.cuda.default_stream(device)):
        return [jpeg.cpu() for jpeg in encode_jpeg(images, quality=quality)]


def voc_palette(size: int = 256) -> list[list[int]]:
    """The PASCAL VOC colour map: class 0 black, 1 dark red, 2 green, …; distinct for 256 classes."""
    palette = []
    for label in range(size):
        rgb, bits = [0, 0, 0], label
        for shift in range(7, -1, -1):
            for channel in range(3):
                rgb[channel] |= ((bits >> channel) & 1) << shift
            bits >>= 3
        palette.append(rgb)
    return palette


def upstream_error(body: bytes) -> str:
    """The message of an upstream node's {"error": "..."} body; anything else that starts like one is named as such."""
    try:
        message = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):  # not UTF-8, not JSON, not an object with "error"
        message = None
    if isinstance(message, str):
        return message
    return f"expected a segserve class map or an upstream node's error, got {len(body)} bytes starting {bytes(body[:16])!r}"


class ClassMapInput:
    """Decoding for nodes whose input is a class map: the JPEG and the areas node."""

    max_side_px: int | None = None  # the largest original side the node's output can be made at
    side_limit_reason = ""
    max_upscale: int | None = None  # the most output pixels per class-map pixel (None: the node does not upsample)

    def decode(self, body: bytes) -> classmap.ClassMap:
        if body.startswith(UPSTREAM_ERROR_PREFIX):
            # In a TorchServe 0.12 workflow the previous node's 400 body arrives here as input:
            # pass its message on instead of complaining about the bytes.
            raise BadRequest(upstream_error(body))
        try:
            class_map = classmap.unpack(body)
        except ValueError as error:
            raise BadRequest(str(error)) from None
        top_label = int(class_map.labels.max())
        if top_label >= class_map.num_classes:  # also catches 0 classes
            raise BadRequest(
                f"class map declares {class_map.num_classes} classes but holds label {top_label}: "
                "labels must be below the number of classes"
            )
        height, width = class_map.original_height, class_map.original_width
        refused = self.max_side_px and limits.image_side_error("output", height, width, self.max_side_px, self.side_limit_reason)
        if refused:
            raise BadRequest(refused)
        if height * width > self.settings.max_image_pixels:
            raise BadRequest(
                f"output of {class_map.original_width}x{class_map.original_height} pixels is refused: "
                f"the limit is {self.settings.max_image_pixels}"
            )
        map_height, map_width = class_map.labels.shape
        if self.max_upscale and height * width > self.max_upscale * map_height * map_width:
            raise BadRequest(
                f"output of {width}x{height} pixels from a {map_width}x{map_height} class map is refused: the limit is "
                f"{self.max_upscale} output pixels per class-map pixel"
            )
        return class_map

    def accept(self, upstream):
        """A class map handed over in process by the segmentation node (fused pipeline): no bytes in between."""
        return upstream if isinstance(upstream, classmap.ClassMap) else NotImplemented


@dataclass
class JpegSettings:
    quality: int = 90
    # Colours for the first classes; classes beyond the list keep the VOC colours.
    palette: list = field(default_factory=list)
    max_image_pixels: int = 25_000_000
    # image: the JPEG bytes; json: {"content_type": "image/jpeg", "jpeg_base64": …}, for a DAG with
    # several leaves, whose TorchServe response is one JSON object made of each leaf's JSON.
    response: str = "image"


class JpegHandler(ClassMapInput, SegserveHandler):
    content_type = "image/jpeg"
    max_side_px = limits.JPEG_MAX_SIDE_PX  # encode_jpeg crashes the worker beyond it: refused here
    side_limit_reason = "the JPEG encoder's limit"
    max_upscale = MAX_UPSCALE_PX_PER_PX

    def load(self, model_dir: str, settings: dict, manifest: dict) -> None:
        self.settings = s = parse_settings(JpegSettings, settings)
        if not 1 <= s.quality <= 100:
            raise ValueError(f"handler.quality must be 1–100 (got {s.quality})")
        colours = voc_palette()
        for label, rgb in enumerate(s.palette):
            if len(rgb) != 3 or not all(0 <= c <= 255 for c in rgb):
                raise ValueError(f"handler.palette[{label}] must be [r, g, b] in 0–255 (got {rgb!r})")
            colours[label] = list(rgb)
        if s.response not in ("image", "json"):
            raise ValueError(f"handler.response must be 'image' or 'json' (got {s.response!r})")
        if s.response == "json":
            self.content_type = "application/json"
        self.palette = torch.tensor(colours, dtype=torch.uint8, device=self.device)
        if self.device.type == "cuda":
            self.warm_up()

    def warm_up(self) -> None:
        """nvJPEG's encoder is made at its first call (a fraction of a second): at load, not in a client's request."""
        try:
            encode_jpegs([torch.zeros(3, 16, 16, dtype=torch.uint8, device=self.device)], self.settings.quality)
        except Exception as error:  # a warm-up that fails says so; the requests will tell the rest
            logger.warning("nvJPEG warm-up failed on %s: %s", self.device, error)

    def colourise(self, class_map: classmap.ClassMap) -> torch.Tensor:
        """uint8 [3, H, W] at the original size: palette lookup at the map's size, then nearest-neighbour
        upsampling. The same pixels as upsampling the labels first, without an int64 index per output pixel
        (measured: 0.06 s instead of 0.30 s at 25 megapixels)."""
        labels = classmap.labels_for(class_map, self.device)
        colours = self.palette[labels.long()].permute(2, 0, 1)
        size = (class_map.original_height, class_map.original_width)
        if tuple(labels.shape) != size:
            colours = F.interpolate(colours[None], size=size, mode="nearest-exact")[0]
        return colours.contiguous()

    @torch.inference_mode()
    def predict(self, items: list[classmap.ClassMap]) -> list[torch.Tensor]:
        images = [self.colourise(item) for item in items]
        # One call for the whole batch; on CUDA tensors this is nvJPEG and only the JPEG bytes come back.
        jpegs = encode_jpegs(images, self.settings.quality)
        if self.device.type == "cuda":
            self.stages.times.add("host_to_device_bytes", sum(item.labels.numel() for item in items if item.labels.device.type == "cpu"))
            self.stages.times.add("device_to_host_bytes", sum(j.numel() for j in jpegs))
        return jpegs

    def encode(self, result: torch.Tensor) -> bytes:
        jpeg = result.numpy().tobytes()
        if self.settings.response == "image":
            return jpeg
        return json.dumps({"content_type": "image/jpeg", "jpeg_base64": base64.b64encode(jpeg).decode()}).encode()


handle = entry_point(JpegHandler)
