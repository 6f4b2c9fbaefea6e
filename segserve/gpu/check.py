"""A short GPU benchmark for `make gpu-check`: the handlers on CUDA, in process.

Prints the throughput of the seg handler (nvJPEG decode → pinned staging → model → argmax →
class map) and of the jpeg handler (nvJPEG encode), and the bytes copied device→host per request,
which must be the class map or the JPEG, never logits.
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from torchvision.io import encode_jpeg

from handlers.jpeg import JpegHandler
from handlers.segmentation import SegmentationHandler
from handlers.segnet import SegNet
from segserve.model.synthetic import make_sample
from segserve.model.worker_context import worker_context


def timed(handler, bodies: list[bytes], context, seconds: float) -> tuple[float, list[bytes], dict]:
    """Requests per second over repeated batches after one warm-up batch, the last outputs, and
    the handler's counters per request (bytes moved, stage ms)."""
    out = handler.handle([{"body": b} for b in bodies], context)
    handler.stages.times.drain()
    torch.cuda.synchronize()
    requests, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        out = handler.handle([{"body": b} for b in bodies], context)
        requests += len(bodies)
    rate = requests / (time.perf_counter() - started)
    return rate, out, {name: value / requests for name, value in handler.stages.times.drain().items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", default="weights/seg.pt", help="state_dict; an untrained network when missing")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu-check: CUDA is not available")
    weights = Path(args.weights)
    if not weights.exists():
        weights = Path(tempfile.mkdtemp()) / "untrained.pt"
        torch.save(SegNet(2).state_dict(), weights)
    bodies = [encode_jpeg(make_sample(9_000_000 + i)[0], quality=90).numpy().tobytes() for i in range(args.batch_size)]
    report = {"device": torch.cuda.get_device_name(0), "batch_size": args.batch_size}
    for precision in ("fp32", "fp16"):
        seg = SegmentationHandler()
        settings = {"precision": precision, "micro_batch_size": max(args.batch_size // 4, 1), "overlap": True}
        context = worker_context(weights.parent, settings, weights.name, rows=args.batch_size, gpu_id=0)
        seg.initialize(context)
        rate, maps, per_request = timed(seg, bodies, context, args.seconds)
        report[f"seg_{precision}_rps"] = round(rate, 1)
        report[f"seg_{precision}_device_to_host_bytes_per_request"] = per_request.get("device_to_host_bytes", 0.0)
    report["class_map_bytes"] = len(maps[0])
    jpeg = JpegHandler()
    context = worker_context(weights.parent, {}, rows=args.batch_size, gpu_id=0)
    jpeg.initialize(context)
    rate, jpegs, per_request = timed(jpeg, maps, context, args.seconds)
    report["jpeg_rps"] = round(rate, 1)
    report["jpeg_device_to_host_bytes_per_request"] = per_request.get("device_to_host_bytes", 0.0)
    report["jpeg_mean_bytes"] = sum(len(j) for j in jpegs) / len(jpegs)
    report["logits_bytes_per_request_if_copied"] = 2 * 256 * 448 * 4
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
