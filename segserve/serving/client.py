"""Send images through a catalog target and save what comes back."""

import time
from pathlib import Path

from segserve.archives.catalog import Target
from segserve.serving.http import Connection

SUFFIXES = {"jpeg": ".jpg", "json": ".json", "class_map": ".classmap", "image": ".img"}  # by what the target gives


def predict(inference_url: str, token: str, images: list[Path], out_dir: Path, target: Target, log=print) -> int:
    """POST each image to the target's endpoint; write <out_dir>/<stem><suffix>; return how many failed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    connection = Connection(inference_url, token)
    failed = 0
    try:
        for image in images:
            started = time.perf_counter()
            response = connection.request("POST", target.endpoint, image.read_bytes())
            elapsed_ms = (time.perf_counter() - started) * 1000
            # /wfpredict answers 200 even when a node refused the input (TorchServe 0.12): look at the body.
            if response.status != 200 or response.body.startswith(b'{"error"'):
                failed += 1
                log(f"{image}: HTTP {response.status} {response.text()[:300]} ({elapsed_ms:.1f} ms)")
                continue
            destination = out_dir / f"{image.stem}{SUFFIXES[target.gives]}"
            destination.write_bytes(response.body)
            log(f"{image} -> {destination}  {len(response.body) / 1024:.1f} KiB  {elapsed_ms:.1f} ms")
    finally:
        connection.close()
    return failed
