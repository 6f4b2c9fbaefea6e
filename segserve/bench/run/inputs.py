"""Request bodies for each target: image files, raw tensors, and class maps for the jpeg member."""

import glob
from pathlib import Path

import torch
import yaml

from segserve.bench.suite.spec import InputSpec
from segserve.model.synthetic import make_sample
from segserve.model.train import normalise

TORCH_DTYPES = {"float16": torch.float16, "float32": torch.float32, "bfloat16": torch.bfloat16}


def request_bodies(specs: list[InputSpec]) -> list[bytes]:
    """What clients send to seg, the workflow and the fused pipeline, in the specs' order."""
    bodies = []
    for spec in specs:
        if spec.images is not None:
            bodies += [Path(p).read_bytes() for pattern in spec.images for p in sorted(glob.glob(pattern))]
        elif spec.synthetic is not None:
            from torchvision.io import encode_jpeg

            photos = spec.synthetic
            for index in range(photos.count):
                image, _ = make_sample(photos.seed + index, photos.height, photos.width)
                bodies.append(encode_jpeg(image, quality=photos.quality).numpy().tobytes())
        else:
            raw = spec.raw
            for index in range(raw.count):
                image, _ = make_sample(raw.seed + index, raw.shape[1], raw.shape[2])
                tensor = normalise(image[None])[0].to(TORCH_DTYPES[raw.dtype])
                bodies.append(tensor.view(torch.uint8).numpy().tobytes())
    return bodies


def class_maps(bodies: list[bytes], weights: Path, seg_config_path: Path) -> list[bytes]:
    """The jpeg member's inputs: what the seg handler answers for `bodies`, computed in process."""
    from handlers.segmentation import SegmentationHandler
    from segserve.model.worker_context import worker_context

    settings = (yaml.safe_load(seg_config_path.read_text()) or {}).get("handler", {})
    context = worker_context(weights.parent, settings, weights.name, rows=len(bodies))
    handler = SegmentationHandler()
    handler.initialize(context)
    maps = handler.handle([{"body": body} for body in bodies], context)
    refused = [i for i in range(len(bodies)) if context.get_response_status(i)[0] != 200]
    if refused:
        raise ValueError(f"inputs {refused} are refused by the seg handler: {maps[refused[0]][:200]!r}")
    return maps
