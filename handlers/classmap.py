"""The bytes that pass from the segmentation node to the JPEG node.

A class map is 1 byte per pixel at the model's resolution, behind an
18-byte header that also carries the original image size, so the JPEG node
can answer at the size the client sent without logits ever leaving the
segmentation worker:

    magic "SGCM" | version u8 | classes u8 | map height u16 | map width u16
    | original height u32 | original width u32 | height*width uint8 labels
"""

import struct
from typing import NamedTuple

import torch

from handlers.batching import view_bytes

MAGIC = b"SGCM"
VERSION = 1
HEADER = struct.Struct("<4sBBHHII")


class ClassMap(NamedTuple):
    labels: torch.Tensor  # uint8 [H, W]
    num_classes: int
    original_height: int
    original_width: int
    ready: object = None  # handed over in process from a CUDA stream: the event after which the labels are complete


def labels_of(logits: torch.Tensor) -> torch.Tensor:
    """uint8 [N, H, W]: the class of each pixel, argmax over the classes of [N, C, H, W] logits, the same bytes.

    On the CPU, for a few classes, by running comparison: argmax along the short class dimension of a
    channels_last tensor took 11-12 ms for a batch of 8 at 256 × 448 on one thread, the comparison 1 ms (issue #49:
    1.3 of a worker's 2.3 CPU-ms a request with no network). A strict > keeps the first of equal values, as argmax
    does; a NaN anywhere (argmax's own rule: NaN is the largest) goes to argmax itself. Beyond 5 classes argmax is as
    fast (measured at 16 and 21). On a GPU argmax is fast, and checking for NaN there would make the host wait for the
    forward pass."""
    classes = logits.shape[1]
    if logits.device.type != "cpu" or not 2 <= classes <= 5 or bool(torch.isnan(logits.sum())):
        return logits.argmax(1).to(torch.uint8)
    best, labels = logits[:, 0], None
    for label in range(1, classes):
        scores = logits[:, label]
        better = (scores > best).to(torch.uint8)
        # arithmetic, not masked_fill/where: those took 5 ms a batch here, this 0.4 (uint8: label > labels so far)
        labels = better if labels is None else labels + better * (label - labels)
        if label < classes - 1:
            best = torch.maximum(best, scores)
    return labels


def labels_for(class_map: ClassMap, device: torch.device) -> torch.Tensor:
    """The labels on `device`, safe to use on this thread's current stream: a CUDA producer's event is
    waited for by that stream (not by the device), and a device→host copy finishes before the CPU reads it."""
    labels = class_map.labels
    if class_map.ready is not None:
        stream = torch.cuda.current_stream(labels.device)
        stream.wait_event(class_map.ready)
        labels.record_stream(stream)  # the producer's allocator must not reuse it before this stream is done
    if labels.device != device:
        labels = labels.to(device, non_blocking=labels.device.type == "cpu")
    return labels


def pack(labels: torch.Tensor, num_classes: int, original_height: int, original_width: int) -> bytes:
    height, width = labels.shape
    header = HEADER.pack(MAGIC, VERSION, num_classes, height, width, original_height, original_width)
    return header + labels.to(torch.uint8).contiguous().cpu().numpy().tobytes()


def unpack(body: bytes) -> ClassMap:
    """Parse a class map; ValueError says what is wrong with the bytes."""
    if len(body) < HEADER.size or body[:4] != MAGIC:
        raise ValueError(
            f"expected a segserve class map (starts with {MAGIC!r}, {HEADER.size}-byte header), got {len(body)} bytes starting {body[:4]!r}"
        )
    magic, version, classes, height, width, orig_h, orig_w = HEADER.unpack_from(body)
    if version != VERSION:
        raise ValueError(f"class map version {version} is not supported (expected {VERSION})")
    expected = HEADER.size + height * width
    if len(body) != expected or min(height, width, orig_h, orig_w) == 0:
        raise ValueError(f"class map {height}x{width} (original {orig_h}x{orig_w}) needs {expected} bytes, got {len(body)}")
    labels = view_bytes(body, offset=HEADER.size).view(height, width)
    return ClassMap(labels, classes, orig_h, orig_w)
