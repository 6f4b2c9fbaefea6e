"""The accuracy gate of an optimised network: how its answers compare with the eager fp32 network's.

Scored on held-out synthetic images (seeds that training and int8 calibration never see) against their exact
masks: `iou` is the foreground IoU of the variant, `iou_eager` the eager fp32 network's, `agreement` the share
of pixels whose class equals eager fp32's. A variant whose IoU is more than MAX_IOU_DROP below eager fp32's is
invalid. Imports only torch and the handlers, so it runs in any server's Python (segserve/model/bare.py calls
it, in .venv-ipex for ipex).
"""

import torch

from segserve.model.synthetic import make_sample
from segserve.model.train import HELD_OUT_SEED_BASE, normalise

MAX_IOU_DROP = 0.01
ACCURACY_IMAGES = 32
SCORE_BATCH = 8


def score_batches(images: int) -> set[int]:
    """The batch sizes score() runs (a compiled variant is compiled for them first)."""
    return {min(SCORE_BATCH, images - start) for start in range(0, images, SCORE_BATCH)}


def held_out(images: int, height: int, width: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(normalised images [n, 3, H, W], masks [n, H, W]) in batches."""
    pairs = [make_sample(HELD_OUT_SEED_BASE + i, height, width) for i in range(images)]
    pictures, masks = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
    return list(zip(normalise(pictures).split(SCORE_BATCH), masks.split(SCORE_BATCH), strict=True))


@torch.inference_mode()
def score(network, reference, dtype: torch.dtype, memory_format, images: int = ACCURACY_IMAGES, size=(256, 448)) -> dict:
    """IoU of `network` and of `reference` (eager fp32) against the masks, and their pixel agreement."""
    counts = {"variant": [0, 0], "eager": [0, 0]}  # [intersection, union] of the foreground
    agree = total = 0
    for batch, masks in held_out(images, *size):
        expected = reference(batch.contiguous(memory_format=memory_format)).argmax(1)
        got = network(batch.to(dtype).contiguous(memory_format=memory_format)).argmax(1)
        for name, labels in (("variant", got), ("eager", expected)):
            foreground, truth = labels != 0, masks != 0
            counts[name][0] += int((foreground & truth).sum())
            counts[name][1] += int((foreground | truth).sum())
        agree += int((got == expected).sum())
        total += got.numel()
    iou = {name: inter / union if union else 1.0 for name, (inter, union) in counts.items()}
    return {"iou": round(iou["variant"], 5), "iou_eager": round(iou["eager"], 5), "agreement": round(agree / total, 5), "images": images}


def verdict(scores: dict) -> tuple[bool, str | None]:
    """(valid, reason): a variant is invalid when its IoU is more than MAX_IOU_DROP below eager fp32's."""
    drop = scores["iou_eager"] - scores["iou"]
    if drop > MAX_IOU_DROP:
        return False, f"IoU {scores['iou']:.4f} is {drop:.4f} below eager fp32's {scores['iou_eager']:.4f} (the gate allows {MAX_IOU_DROP})"
    return True, None
