"""Hostile and odd inputs against the served seg and fused models, judged against what the CPU path answers them.

The GPU bundle's serve step (segserve/gpu/steps.py) sends each input below to a running TorchServe, one request at
a time, and compares with the same handlers run in this process on the CPU (the archives' own settings, no GPU):
the same status class for every input (a valid JPEG the CPU decodes is 200 on the GPU too: nvJPEG's refusals are
decoded on the CPU, handlers/segmentation.py), the class maps of the 200s against the CPU's (pixels that agree: the
GPU computes in other kernels, so a few border pixels may differ), and every worker's pid unchanged.
"""

import json
import random
import struct
import tempfile
import zipfile
from pathlib import Path

from segserve.qa.fuzz_inputs import Input, image_seeds, pil_bytes, raw_body
from segserve.serving.http import Connection

RAW_NBYTES = 3 * 256 * 448 * 2  # the seed's FP16 [3, 256, 448] body


def _sof(body: bytes) -> int:
    return next(i for i in range(2, len(body) - 9) if body[i] == 0xFF and body[i + 1] in (0xC0, 0xC1, 0xC2))


def _edited(body: bytes, offset: int, fmt: str, *values) -> bytes:
    edited = bytearray(body)
    struct.pack_into(fmt, edited, offset, *values)
    return bytes(edited)


def _without_segment(body: bytes, marker: int) -> bytes:
    """The JPEG with every segment of this marker (DQT: 0xDB) cut out."""
    out, pos = bytearray(body[:2]), 2
    while pos + 4 <= len(body) and body[pos] == 0xFF and body[pos + 1] != 0xDA:
        length = struct.unpack(">H", body[pos + 2 : pos + 4])[0]
        if body[pos + 1] != marker:
            out += body[pos : pos + 2 + length]
        pos += 2 + length
    return bytes(out + body[pos:])


def inputs() -> list[Input]:
    """The fuzzer's seeds (real files of every kind, truncations, extreme sizes in few bytes) and the inputs a GPU
    decoder meets differently from libjpeg: CMYK, 12-bit and arithmetic-coded frames, corrupt scans, odd sizes."""
    from PIL import Image

    from segserve.model.synthetic import make_sample

    pixels = make_sample(11, 120, 200)[0]
    image = Image.fromarray(pixels.permute(1, 2, 0).numpy())
    baseline = pil_bytes(image, "JPEG", quality=85)
    sof = _sof(baseline)
    scan = baseline.index(b"\xff\xda")
    corrupt_scan = bytearray(baseline)
    for i in range(scan + 40, len(baseline) - 2, 7):
        corrupt_scan[i] ^= 0x5A
    rng = random.Random(48)
    made = [
        Input("jpeg 200x120 cmyk quality 85", pil_bytes(image.convert("CMYK"), "JPEG", quality=85)),
        Input("jpeg 200x120 greyscale", pil_bytes(image.convert("L"), "JPEG")),
        Input("jpeg 200x120 progressive 4:4:4", pil_bytes(image, "JPEG", progressive=True, subsampling=0)),
        Input("jpeg 200x120 restart markers", pil_bytes(image, "JPEG", restart_marker_blocks=1)),
        Input("jpeg 17x4097", pil_bytes(image.resize((17, 4097)), "JPEG")),
        Input("jpeg 4097x17", pil_bytes(image.resize((4097, 17)), "JPEG")),
        Input("jpeg 1920x1080", pil_bytes(image.resize((1920, 1080)), "JPEG", quality=90)),
        Input("jpeg corrupt scan (bytes flipped)", bytes(corrupt_scan)),
        Input("jpeg SOF 65000x65000", _edited(baseline, sof + 5, ">HH", 65000, 65000)),
        Input("jpeg SOF 0x0", _edited(baseline, sof + 5, ">HH", 0, 0)),
        Input("jpeg SOF precision 12", _edited(baseline, sof + 4, ">B", 12)),
        Input("jpeg SOF marker C9 (arithmetic)", _edited(baseline, sof + 1, ">B", 0xC9)),
        Input("jpeg SOF marker C3 (lossless)", _edited(baseline, sof + 1, ">B", 0xC3)),
        Input("jpeg without DQT", _without_segment(baseline, 0xDB)),
        Input("jpeg SOI + garbage", b"\xff\xd8" + rng.randbytes(4000)),
        Input("jpeg SOI only", b"\xff\xd8"),
        raw_body(rng, RAW_NBYTES, "normal"),
        raw_body(rng, RAW_NBYTES, "NaN"),
        raw_body(rng, RAW_NBYTES, "+Inf"),
        Input("raw fp16 one byte short", bytes(RAW_NBYTES - 1)),
        Input("empty body", b""),
        Input("json body", json.dumps({"image": "x"}).encode()),
    ]
    return list(image_seeds()) + made


def cpu_handler(target, model_store: Path, scratch: Path):
    """A catalog target's handler in this process on the CPU, with its archive's own handler settings: the fused
    pipeline's, or its one model's handler module (handlers/<module>.py)."""
    import yaml

    from handlers.pipeline import PipelineHandler, node_handler
    from segserve.model.worker_context import worker_context

    folder = scratch / target.name
    with zipfile.ZipFile(model_store / target.archive) as mar:
        mar.extractall(folder)
    manifest = json.loads((folder / "MAR-INF" / "MANIFEST.json").read_text())
    config = yaml.safe_load((folder / manifest["model"]["configFile"]).read_text()) or {}
    handler = PipelineHandler() if target.is_fused else node_handler(target.nodes[0].model.handler)
    handler.initialize(worker_context(folder, dict(config.get("handler") or {}), manifest["model"].get("serializedFile")))
    return handler


def cpu_answer(handler, body: bytes) -> tuple[int, bytes]:
    from segserve.model.worker_context import worker_context

    context = worker_context(None, {}, rows=1)
    out = handler.handle([{"body": bytearray(body)}], context)
    return context.get_response_status(0)[0] or 200, out[0]


def label_agreement(a: bytes, b: bytes) -> float | None:
    """The share of class-map pixels two answers agree on (None: not two class maps of one size)."""
    from handlers import classmap

    try:
        left, right = classmap.unpack(a), classmap.unpack(b)
    except ValueError:
        return None
    if left.labels.shape != right.labels.shape:
        return None
    return float((left.labels == right.labels).float().mean())


def image_targets(targets: list) -> list:
    """The served catalog targets that take an image and answer it themselves: every model and fused target whose
    root takes images (a workflow answers 200 with its node's error body, so its statuses say nothing)."""
    return [t for t in targets if t.takes == "image" and not t.is_workflow]


def check(server, targets: list, model_store: Path, log=print) -> dict:
    """Every input to every image target, over HTTP, against the CPU's answer; the workers' pids before and after."""
    items, targets = inputs(), image_targets(targets)
    models = [model for target in targets for model in target.models]
    pids_before = {model: sorted(w.get("pid") for w in server.describe(model).get("workers", [])) for model in models}
    rows, connection = [], Connection(server.url("inference"), server.token("inference"), timeout_s=60)
    with tempfile.TemporaryDirectory() as scratch:
        for target in targets:
            handler = cpu_handler(target, model_store, Path(scratch))
            for item in items:
                cpu_status, cpu_body = cpu_answer(handler, item.body)
                try:
                    reply = connection.request("POST", target.endpoint, item.body)
                    status, body = reply.status, reply.body
                except OSError as error:  # no answer: a dead worker's or a dead server's
                    status, body = 0, str(error).encode()
                    connection.close()
                same = (status // 100) == (cpu_status // 100) and status != 0
                class_maps = target.gives == "class_map" and status == 200 and cpu_status == 200
                agreement = label_agreement(body, cpu_body) if class_maps else None
                rows.append(
                    {
                        "target": target.name,
                        "input": item.description,
                        "bytes": len(item.body),
                        "cpu_status": cpu_status,
                        "gpu_status": status,
                        "same_status": same,
                        "label_agreement": agreement,
                        "error": body[:160].decode(errors="replace") if status >= 400 else None,
                    }
                )
                if not same:
                    log(f"{target.name} {item.description}: {status} here, {cpu_status} on the CPU: {body[:160]!r}")
    connection.close()
    pids_after = {model: sorted(w.get("pid") for w in server.describe(model).get("workers", [])) for model in models}
    valid = [r for r in rows if r["cpu_status"] == 200]
    agreements = [r["label_agreement"] for r in rows if r["label_agreement"] is not None]
    return {
        "targets": [target.name for target in targets],
        "inputs": len(items),
        "requests": len(rows),
        "valid_on_cpu": len(valid),
        "valid_answered_200": sum(r["gpu_status"] == 200 for r in valid),
        "invalid_on_cpu": len(rows) - len(valid),
        "invalid_answered_4xx": sum(400 <= r["gpu_status"] < 500 for r in rows if r["cpu_status"] != 200),
        "mismatches": [r for r in rows if not r["same_status"]],
        "min_label_agreement": min(agreements) if agreements else None,
        "workers_killed": sum(len(set(pids_before[m]) - set(pids_after[m])) for m in models),
        "pids_before": pids_before,
        "pids_after": pids_after,
        "rows": rows,
    }
