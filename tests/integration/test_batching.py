"""The batching machinery on the CPU: reused buffers, micro-batches, overlap, clean shutdown."""

import subprocess
import sys

from tests.conftest import ROOT


def test_a_worker_with_stage_threads_exits_without_close(tiny_weights):
    # TorchServe ends a worker by ending its process: the stage threads must not keep it alive.
    script = f"""
import sys; sys.path.insert(0, {str(ROOT)!r})
from tests.unit.test_batching import segmenter, handle, mixed_batch
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
