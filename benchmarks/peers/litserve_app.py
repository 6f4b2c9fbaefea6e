"""The seg → JPEG pipeline on LitServe: POST /predict (raw JPEG body) → 200 image/jpeg; GET /health.

    .peers/litserve/bin/python benchmarks/peers/litserve_app.py --port 8080 [--max-batch-size 8]
        [--batch-timeout-s 0.01] [--workers 2] [--optimize eager|int8]

LitServe forms the batch (max_batch_size, batch_timeout) in each of `--workers` inference worker processes
(workers_per_device on the CPU); one uvicorn API server process per worker (LitServe's default). Each worker runs
segserve's fused pipeline handler (handlers/pipeline.py) on the batch, with the cores split among the workers.
Stops on SIGTERM or SIGINT (LitServe's own graceful shutdown ends its workers and API servers), exit status 0.
"""

import signal
import sys
from pathlib import Path
from typing import Annotated

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import litserve as ls  # noqa: E402
from fastapi import Depends, Request, Response  # noqa: E402

from benchmarks.peers.common import arguments, http_answer, load_handler, print_versions, threads_for  # noqa: E402

# LitServe's docs: batch_timeout in seconds, workers_per_device "for CPU, set to the number of cores" (README.md).
DEFAULTS = {"max_batch_size": 8, "batch_timeout_s": 0.01, "workers": 2, "workers_help": "LitServe workers_per_device (CPU)"}


async def raw_body(request: Request) -> bytes:
    """The request body as sent: LitServe parses a body as JSON unless decode_request's parameter says otherwise,
    and a FastAPI dependency is how a FastAPI app takes raw bytes."""
    return await request.body()


class SegJpegAPI(ls.LitAPI):
    def __init__(self, workers: int, optimize: str, **batching):
        super().__init__(**batching)
        self.workers, self.optimize = workers, optimize

    def setup(self, device):
        self.handler = load_handler("fused", self.max_batch_size, threads_for(self.workers), optimize=self.optimize)

    def decode_request(self, request: Annotated[bytes, Depends(raw_body)]) -> bytes:
        return request  # decoded with its batch-mates in predict, as segserve's handler decodes its rows

    def batch(self, inputs: list) -> list:
        return inputs

    def predict(self, bodies: list) -> list:
        return self.handler.stages.run(bodies)

    def unbatch(self, output: list) -> list:
        return output

    def encode_response(self, result) -> Response:
        # a bad row answers its own 400 as a Response: an exception here would fail the whole batch
        status, content_type, body = http_answer(result)
        return Response(content=body, status_code=status, media_type=content_type)


def main() -> None:
    args = arguments("litserve", __doc__.splitlines()[0], DEFAULTS)
    settings = {"max_batch_size": args.max_batch_size, "batch_timeout_s": args.batch_timeout_s, "workers_per_device": args.workers,
                "threads_per_worker": threads_for(args.workers), "optimize": args.optimize}  # fmt: skip
    print_versions("litserve", ["litserve", "fastapi", "uvicorn"], settings)
    api = SegJpegAPI(args.workers, args.optimize, max_batch_size=args.max_batch_size, batch_timeout=args.batch_timeout_s)
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=args.workers, timeout=60)
    # SIGTERM as Ctrl+C: LitServer.run() shuts its workers down on KeyboardInterrupt
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    server.run(host="127.0.0.1", port=args.port, generate_client_file=False, log_level="warning")


if __name__ == "__main__":
    main()
