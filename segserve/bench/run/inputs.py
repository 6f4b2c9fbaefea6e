"""Request bodies for each target: image files, any files, raw tensors, JSON from a template, multipart
form data of named parts, a join's named inputs, and class maps for the jpeg member."""

import glob
import hashlib
import json
from pathlib import Path

import torch
import yaml

from segserve.bench.run.load import Body
from segserve.bench.suite.input_spec import InputSpec
from segserve.model.synthetic import make_sample
from segserve.model.train import normalise

TORCH_DTYPES = {"float16": torch.float16, "float32": torch.float32, "bfloat16": torch.bfloat16}


def request_bodies(specs: list[InputSpec]) -> list[bytes]:
    """What clients send, in the specs' order."""
    bodies = []
    for spec in specs:
        if spec.images is not None or spec.files is not None:
            paths = [Path(p) for pattern in spec.images or spec.files for p in sorted(glob.glob(pattern))]
            bodies += [Body(path.read_bytes(), "application/octet-stream", path.name) for path in paths]
        elif spec.synthetic is not None:
            from torchvision.io import encode_jpeg

            photos = spec.synthetic
            for index in range(photos.count):
                image, _ = make_sample(photos.seed + index, photos.height, photos.width)
                bodies.append(encode_jpeg(image, quality=photos.quality).numpy().tobytes())
        elif spec.tensor is not None:
            bodies += [tensor_bytes(spec.tensor, spec.tensor.seed + index) for index in range(spec.tensor.count)]
        elif spec.json_template is not None:
            template = spec.json_template
            bodies += [Body(json.dumps(_fill(template.template, index)).encode(), "application/json") for index in range(template.count)]
        elif spec.multipart is not None:
            bodies.append(multipart(spec.multipart))
        else:
            raw = spec.raw
            for index in range(raw.count):
                image, _ = make_sample(raw.seed + index, raw.shape[1], raw.shape[2])
                tensor = normalise(image[None])[0].to(TORCH_DTYPES[raw.dtype])
                bodies.append(tensor.view(torch.uint8).numpy().tobytes())
    return bodies


def tensor_bytes(spec, seed: int) -> bytes:
    """A tensor's raw bytes (C order): normal values for floats, integers in [0, 100)."""
    generator = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, spec.dtype)
    if dtype.is_floating_point:
        tensor = torch.randn(spec.shape, generator=generator).to(dtype)
    else:
        tensor = torch.randint(0, 100, spec.shape, generator=generator, dtype=dtype)
    return tensor.contiguous().view(torch.uint8).numpy().tobytes()


def _fill(value, index: int):
    if isinstance(value, str):
        return value.replace("{index}", str(index))
    if isinstance(value, list):
        return [_fill(item, index) for item in value]
    if isinstance(value, dict):
        return {key: _fill(item, index) for key, item in value.items()}
    return value


def multipart(parts) -> Body:
    """One multipart/form-data body of named parts (TorchServe gives the handler each part under its name)."""
    contents = []
    for part in parts:
        if part.file is not None:
            contents.append((part.name, Path(part.file).read_bytes()))
        elif part.text is not None:
            contents.append((part.name, part.text.encode()))
        else:
            contents.append((part.name, tensor_bytes(part.tensor, part.tensor.seed)))
    return form_data(contents)


def form_data(contents: list[tuple[str, bytes]]) -> Body:
    """multipart/form-data of (name, bytes) parts. A part without a file name is a form field to TorchServe's frontend
    (NettyUtils.getFormData): a parameter without a content type, which the worker hands over as a bytearray, as a
    workflow hands a join each parent's answer."""
    # from the contents, so that the same parts give the same body (run ids); a part holding a hash of itself: never
    boundary = "segserve-" + hashlib.sha256(b"".join(name.encode() + data for name, data in contents)).hexdigest()[:40]
    lines = b""
    for name, data in contents:
        lines += f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n'.encode()
        lines += b"Content-Type: application/octet-stream\r\n\r\n" + data + b"\r\n"
    return Body(lines + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}")


def named_inputs(contents: dict[str, bytes]) -> Body:
    """A row of named inputs (a join's parents' answers): sent over gRPC, an input each (Body.parts); its bytes the same
    row as multipart/form-data (what a function node run here decodes, dag_requests.worker_row)."""
    form = form_data(list(contents.items()))
    return Body(form, form.content_type, parts=dict(contents))


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
