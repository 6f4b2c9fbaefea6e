"""What each codec can handle, in one place: every node refuses more with a 400 that names the limit.

These are limits of the libraries, not settings: beyond them a codec fails, and some fail by
crashing the worker instead of raising (torchvision 0.29's encode_jpeg dies with SIGSEGV on a side
over 65,500 px), which would take the request's batch-mates down with it. The operator's own,
lower limits (max_image_pixels) are settings of each node.
"""

import re

import torch

# libjpeg(-turbo)'s JPEG_MAX_DIMENSION: the largest side a JPEG can be decoded or encoded at.
JPEG_MAX_SIDE_PX = 65_500
# libpng's default user limit (png_set_user_limits) on either side of a decoded PNG.
PNG_MAX_SIDE_PX = 1_000_000
# Every segserve DAG answers a JPEG at the size the client sent (the JPEG node encodes it), so an image
# whose side the JPEG encoder cannot write is refused where it enters, before any node spends time on it.
ANSWER_MAX_SIDE_PX = JPEG_MAX_SIDE_PX
DECODER_MAX_SIDE_PX = {"jpeg": JPEG_MAX_SIDE_PX, "png": PNG_MAX_SIDE_PX}
# Scans in one JPEG. Each scan of a progressive JPEG passes over every coefficient of the image, and a scan
# can be 39 bytes: 16 MiB of them kept a 25-megapixel decode busy for minutes (measured: 0.45 ms per extra
# scan, so ~430,000 scans ≈ 190 s). Encoders write 1 (baseline) to about 10–20 (progressive) scans.
JPEG_MAX_SCANS = 100
# Segments (markers) in one JPEG: walking 4 million empty comment segments held a worker for a second.
# Real files have tens (APPn, DQT, DHT per scan, up to 255 APP2 chunks of an ICC profile).
JPEG_MAX_SEGMENTS = 1000
# What nvJPEG decodes (torchvision's decode_jpeg on CUDA): 8-bit baseline, extended or progressive frames (SOF0–SOF2)
# of 1 or 3 components; torchvision never enables its CMYK path. A CUDA worker decodes every other JPEG on the CPU.
NVJPEG_SOF_MARKERS = (0xC0, 0xC1, 0xC2)
NVJPEG_PRECISION_BITS = 8
NVJPEG_COMPONENTS = (1, 3)

# "decode_jpeg, /__w/vision/.../decode_jpeg.cpp:171, Image is incomplete" → "Image is incomplete"
_SOURCE_LOCATION = re.compile(r"^(?:[\w:()]+, )?\S+\.(?:cpp|cc|h|hpp|cu):\d+, ")


def image_side_error(kind: str, height: int, width: int, max_side_px: int, limit_name: str) -> str | None:
    """The message refusing an image of `kind` with a side over `max_side_px` (or an empty side), else None."""
    if height == 0 or width == 0:
        return f"{kind} of {width}x{height} pixels is refused: it has no pixels"
    if max(height, width) > max_side_px:
        return f"{kind} of {width}x{height} pixels is refused: {limit_name} is {max_side_px} pixels per side"
    return None


def jpeg_scans_error(scans: int) -> str:
    return f"jpeg of {scans} scans is refused: the limit is {JPEG_MAX_SCANS} scans (encoders write 1 to about 20)"


def nvjpeg_refusal(marker: int, precision_bits: int, components: int) -> str | None:
    """Why nvJPEG cannot decode a JPEG with this frame header (then the CPU decodes it), else None."""
    if marker not in NVJPEG_SOF_MARKERS:
        return f"frame type SOF{marker - 0xC0} (nvJPEG decodes SOF0-SOF2)"
    if precision_bits != NVJPEG_PRECISION_BITS:
        return f"{precision_bits}-bit samples (nvJPEG decodes 8-bit)"
    if components not in NVJPEG_COMPONENTS:
        return f"{components} colour components (nvJPEG decodes 1 or 3; 4 is CMYK or YCCK)"
    return None


def non_finite_error(tensor: torch.Tensor) -> str | None:
    """The message refusing a raw tensor holding NaN or ±Inf (the model would answer a meaningless mask), else None."""
    # A float32 sum is NaN or ±Inf whenever a value is (NaN and Inf propagate), so a finite sum clears the tensor:
    # 0.17 ms against isfinite().all()'s 2.5 ms for [3, 256, 448] fp16 on one thread (7.6% of a fused worker's
    # samples at 128 connections). Only a non-finite sum is counted exactly: finite values can overflow it (float32
    # or bfloat16 near their largest), and those pass.
    if bool(torch.isfinite(tensor.sum(dtype=torch.float32))):
        return None
    finite = torch.isfinite(tensor)
    if bool(finite.all()):
        return None
    bad = finite.numel() - int(finite.sum())
    return f"raw tensor has {bad} non-finite value(s) (NaN or Inf) of {finite.numel()}: send finite, normalised values"


def codec_message(error: Exception) -> str:
    """A codec's error without the library's source path and line (torchvision prefixes both)."""
    lines = [line for line in str(error).splitlines() if line.strip() and not line.startswith("Exception raised from")]
    return _SOURCE_LOCATION.sub("", lines[0] if lines else type(error).__name__).strip()
