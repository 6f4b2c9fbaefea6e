"""The seg → JPEG pipeline on Triton through PyTriton: model `seg_jpeg`, input `image` (BYTES, the JPEG), output
`jpeg` (BYTES); POST /v2/models/seg_jpeg/infer with the binary-tensor extension (triton_protocol.py);
GET /v2/health/ready.

    .peers/triton/bin/python benchmarks/peers/triton_app.py --port 8000 [--max-batch-size 8]
        [--batch-timeout-s 0.0] [--workers 1] [--optimize eager|int8] [--grpc-port P] [--metrics-port P]

Triton's dynamic batcher (max_queue_delay_microseconds = --batch-timeout-s, max_batch_size) hands batches to
--workers model instances (PyTriton: one inference callable per instance, each a thread of this process, each
with its own segserve fused pipeline handler). gRPC and metrics are off unless their ports are given.
Stops on SIGTERM or SIGINT: PyTriton stops tritonserver and its Python backend stubs; exit status 0.
"""

import os
import signal
import sys
import sysconfig
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
from pytriton.exceptions import PyTritonBadParameterError  # noqa: E402
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor  # noqa: E402
from pytriton.triton import Triton, TritonConfig, TritonLifecyclePolicy  # noqa: E402

from benchmarks.peers.common import BadRequest, arguments, load_handler, print_versions, threads_for  # noqa: E402
from benchmarks.peers.triton_protocol import MODEL  # noqa: E402

# Triton's batcher guide: start with the default delay (0) and one instance, then raise each while throughput grows
DEFAULTS = {"max_batch_size": 8, "batch_timeout_s": 0.0, "workers": 1, "workers_help": "Triton model instances (instance_group count)"}


def extra_flags(parser) -> None:
    parser.add_argument("--grpc-port", type=int, default=0, help="Triton's gRPC port; 0: gRPC off")
    parser.add_argument("--metrics-port", type=int, default=0, help="Triton's Prometheus metrics port; 0: metrics off")


def infer_function(handler):
    """One instance's callable: PyTriton hands it the batch Triton formed, as one Request per client request."""

    def infer(requests: list) -> list[dict]:
        bodies = [bytes(request["image"].reshape(-1)[0]) for request in requests]
        results = handler.stages.run(bodies)
        failed = [f"request {i}: {result}" for i, result in enumerate(results) if isinstance(result, Exception)]
        if failed:
            # PyTriton answers an execute() with one error for all its requests: there is no per-request status
            error = (
                PyTritonBadParameterError if all(isinstance(r, BadRequest) for r in results if isinstance(r, Exception)) else RuntimeError
            )
            raise error("; ".join(failed))
        return [{"jpeg": np.array([[bytes(result)]], dtype=np.object_)} for result in results]

    return infer


def own_libpython_first() -> None:
    """Triton's Python backend stub (PyTriton's, for this Python's minor version) links libpython3.X.so.1.0 and
    finds the system's first (Debian 12: 3.11.2) while it runs this interpreter's standard library (here pyenv's
    3.11.7): the model's initialize then fails in multiprocessing with "AttributeError: '_thread.RLock' object has
    no attribute '_recursion_count'". The interpreter's own library folder first on LD_LIBRARY_PATH, which
    tritonserver and its stubs inherit, makes them match."""
    libdir, soname = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
    if libdir and soname and (Path(libdir) / soname).exists():
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [libdir, os.environ.get("LD_LIBRARY_PATH")]))


def main() -> None:
    args = arguments("triton", __doc__.splitlines()[0], DEFAULTS, extra_flags)
    delay_us = round(args.batch_timeout_s * 1e6)
    settings = {"max_batch_size": args.max_batch_size, "max_queue_delay_microseconds": delay_us, "instances": args.workers,
                "threads": threads_for(args.workers), "optimize": args.optimize}  # fmt: skip
    print_versions("triton", ["nvidia-pytriton", "tritonclient"], settings)
    own_libpython_first()
    handlers = [load_handler("fused", args.max_batch_size, threads_for(args.workers), optimize=args.optimize) for _ in range(args.workers)]
    config = TritonConfig(
        http_address="127.0.0.1",
        http_port=args.port,
        allow_grpc=bool(args.grpc_port),
        grpc_address="127.0.0.1",
        grpc_port=args.grpc_port or None,
        allow_metrics=bool(args.metrics_port),
        metrics_port=args.metrics_port or None,
        exit_timeout_secs=5,
    )
    # SIGTERM as Ctrl+C: Triton.serve() stops tritonserver on KeyboardInterrupt
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    # the model store written before tritonserver starts, which then loads the model at its start: /v2/health/ready
    # (strict readiness) is 200 only once seg_jpeg is ready; by default PyTriton loads it after the server is up,
    # and the server reports ready before that
    local_store = TritonLifecyclePolicy(launch_triton_on_startup=False, local_model_store=True)
    with Triton(config=config, triton_lifecycle_policy=local_store) as triton:
        triton.bind(
            model_name=MODEL,
            infer_func=[infer_function(handler) for handler in handlers],
            inputs=[Tensor(name="image", dtype=np.bytes_, shape=(1,))],
            outputs=[Tensor(name="jpeg", dtype=np.bytes_, shape=(1,))],
            config=ModelConfig(max_batch_size=args.max_batch_size, batcher=DynamicBatcher(max_queue_delay_microseconds=delay_us)),
            strict=False,
        )
        print(f"triton: serving on http://127.0.0.1:{args.port}/v2/models/{MODEL}/infer", flush=True)
        triton.serve()


if __name__ == "__main__":
    main()
