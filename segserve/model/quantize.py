"""int8 post-training static quantisation of the segmentation network, with PyTorch's PT2E flow for x86 CPUs.

Export the network (batch dimension dynamic), insert observers with torchao's X86InductorQuantizer, calibrate
on synthetic images, convert, export again and save with torch.export.save. The saved program is the int8
archive's serialized file: it is built once here (by `segserve build` or `segserve optimize`), not per
worker; workers compile it (handlers/optimize.py). Calibration seeds are a range of their own: neither the
training seeds nor the held-out seeds the accuracy check scores on (segserve/model/accuracy.py).
"""

import hashlib
import json
import os
from pathlib import Path

import torch

from segserve.errors import RuntimeFailure

CALIBRATION_SEED_BASE = 5_000_000
CALIBRATION_IMAGES = 32
CALIBRATION_BATCH = 8
# the handler settings a program depends on: the network (backbone, classes) and the input size it is exported for
PROGRAM_KEYS = ("backbone", "num_classes", "input_height", "input_width")


def calibration_batches(height: int, width: int, images: int = CALIBRATION_IMAGES) -> list[torch.Tensor]:
    from segserve.model.synthetic import make_sample
    from segserve.model.train import normalise

    pictures = torch.stack([make_sample(CALIBRATION_SEED_BASE + i, height, width)[0] for i in range(images)])
    return list(normalise(pictures).split(CALIBRATION_BATCH))


def quantize_int8(weights: Path, settings: dict, out: Path, images: int = CALIBRATION_IMAGES) -> Path:
    """Write the int8 program of `weights` (a state_dict or TorchScript) for the node's handler `settings`
    (backbone, num_classes, input size) to `out`. A network that cannot be exported or quantised raises
    RuntimeFailure naming the step and the reason."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86

    from handlers.segmentation import SegmentationSettings, load_network
    from handlers.settings import parse_settings

    seg = parse_settings(SegmentationSettings, {k: v for k, v in settings.items() if k in PROGRAM_KEYS})
    batches = calibration_batches(seg.input_height, seg.input_width, images)
    example = (batches[0][:2].clone(),)  # a batch of 2 (export specialises a size of 1), saved in the program: not a view
    dynamic = {"images": {0: torch.export.Dim("batch", min=1, max=1024)}}
    step = "loading"
    try:
        network = load_network(weights, seg)
        step = "exporting"
        exported = torch.export.export(network, example, dynamic_shapes=dynamic).module()
        quantizer = x86.X86InductorQuantizer().set_global(x86.get_default_x86_inductor_quantization_config())
        step = "calibrating"
        observed = prepare_pt2e(exported, quantizer)
        with torch.no_grad():
            for batch in batches:
                observed(batch)
        step = "converting"
        quantized = convert_pt2e(observed)
        step = "saving"
        out.parent.mkdir(parents=True, exist_ok=True)
        torch.export.save(torch.export.export(quantized, example, dynamic_shapes=dynamic), str(out))
    except Exception as error:  # torch.export raises many kinds; the message is what the user needs
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise RuntimeFailure(f"int8 quantisation of {weights.name} failed while {step}: {type(error).__name__}: {message}") from error
    return out


def int8_program(weights: Path, settings: dict, folder: Path, stem: str, log=None) -> Path:
    """The int8 program of `weights` for these handler settings, in `folder` as `<stem>-<digest>.pt2`: quantised
    the first time, then reused. The digest covers the weights' bytes and the settings it depends on, so a folder
    kept between runs or shared by processes (a recipe's staging, the peer apps' temp folder) never serves a stale
    program; a process building it beside another writes its own file and renames it into place."""
    keys = {k: settings.get(k) for k in PROGRAM_KEYS}
    digest = hashlib.sha1(weights.read_bytes() + json.dumps(keys, sort_keys=True).encode()).hexdigest()[:8]
    program = folder / f"{stem}-{digest}.pt2"
    if not program.exists():
        if log:
            log(f"quantising {weights.name} to int8 for {stem} ({keys['input_height']}x{keys['input_width']})")
        partial = program.with_name(f"{program.stem}.{os.getpid()}.pt2")
        quantize_int8(weights, {k: v for k, v in keys.items() if v is not None}, partial)
        partial.replace(program)
    return program
