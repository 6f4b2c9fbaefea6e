"""The batching machinery on the CPU: reused buffers, micro-batches, overlap, clean shutdown."""

import subprocess
import sys

import torch
from torchvision.io import encode_jpeg, encode_png

from handlers.segmentation import SegmentationHandler
from segserve.model.synthetic import make_sample
from tests.conftest import ROOT, make_context, status_of, with_rows


def segmenter(weights, **settings):
    handler = SegmentationHandler()
    handler.initialize(make_context(weights.parent, settings, weights.name))
    return handler


def mixed_batch() -> list[bytes]:
    """Seven requests of every kind, two of them bad, in one TorchServe batch."""
    image = make_sample(31)[0]
    raw = torch.randn(3, 256, 448, generator=torch.Generator().manual_seed(1)).half().numpy().tobytes()
    return [
        encode_jpeg(image).numpy().tobytes(),
        b"broken",
        encode_png(make_sample(32, 120, 200)[0]).numpy().tobytes(),
        raw,
        encode_jpeg(make_sample(33, 300, 500)[0]).numpy().tobytes(),
        encode_png(image).numpy().tobytes()[:500],
        encode_png(make_sample(34)[0]).numpy().tobytes(),
    ]


def handle(handler, bodies):
    context = with_rows(make_context(None, {}), len(bodies))
    out = handler.handle([{"body": b} for b in bodies], context)
    return out, [status_of(context, i) for i in range(len(bodies))]


def test_a_worker_with_stage_threads_exits_without_close(tiny_weights):
    # TorchServe ends a worker by ending its process: the stage threads must not keep it alive.
    script = f"""
import sys; sys.path.insert(0, {str(ROOT)!r})
from tests.integration.test_batching import segmenter, handle, mixed_batch
from pathlib import Path
handler = segmenter(Path({str(tiny_weights)!r}), micro_batch_size=2, overlap=True)
handle(handler, mixed_batch())
print("served")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("served")


def test_handle_passes_torchserves_bytearray_bodies_to_decode_uncopied():
    from handlers.base import request_body

    body = bytearray(b"\x89PNG not really")
    assert request_body({"body": body}) is body
    assert request_body({"data": body, "body": b"other"}) is body
