"""The Java CPU of one TorchServe frontend over a test-like life, with and without JVM options (docs/testing.md).

    .venv/bin/python benchmarks/frontend_jvm.py [--load-s 8] [--rounds 2] [VMARGS ...]

Per round and per option set (alternating; '' is the JVM's defaults): start a TorchServe on free ports from
model_store/ (`segserve build` first), register seg, jpeg, seg_jpeg and seg_jpeg_fused, put 4 connections of
samples/shapes_0.jpg on /wfpredict/seg_jpeg for --load-s, stop; print the frontend's CPU seconds at each stage.
"""

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from segserve.bench.run.profiler import Background, torchserve_load  # noqa: E402
from segserve.serving.launch import register, served_targets  # noqa: E402
from segserve.serving.server import VMARGS_ENV, TorchServe  # noqa: E402


def life(vmargs: str, load_s: float) -> str:
    run_dir = Path(tempfile.mkdtemp(prefix="segserve-jvm-"))
    # '' → no vmargs key at all: the JVM's defaults
    server = TorchServe(
        run_dir, ROOT / "model_store", ROOT / "config.properties", free_ports=True, config_overrides={"vmargs": vmargs} if vmargs else {}
    )
    server.start(log=lambda _: None)
    try:
        java = next(p for p in map(psutil.Process, server.process_ids()) if p.name() == "java")

        def cpu_s() -> float:
            times = java.cpu_times()
            return times.user + times.system

        started = cpu_s()
        register(server, served_targets(None), log=lambda _: None)
        registered = cpu_s()
        load = Background(
            torchserve_load(server, "/wfpredict/seg_jpeg", [(ROOT / "samples" / "shapes_0.jpg").read_bytes()], 4), load_s + 30
        )
        load.start()
        time.sleep(load_s)
        result = load.finish()
        loaded, ok = cpu_s(), sum(result.ok)
    finally:
        server.stop()
    per_request_ms = 1000 * (loaded - registered) / max(ok, 1)
    return (
        f"{vmargs or 'JVM defaults':45s} start {started:4.1f}  +register {registered - started:4.1f}  "
        f"+load {loaded - registered:5.1f} CPU-s "
        f"({ok} requests, {per_request_ms:.1f} ms/request)  total {loaded:5.1f} CPU-s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("vmargs", nargs="*", default=["", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"])
    parser.add_argument("--load-s", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if not (ROOT / "model_store" / "seg_jpeg.war").exists():
        print("error: no model_store/seg_jpeg.war: run `segserve build` first", file=sys.stderr)
        return 2
    os.environ.pop(VMARGS_ENV, None)  # '' measures the JVM's own defaults, whatever this shell sets
    print(f"cores: {len(psutil.Process().cpu_affinity())}")
    for _ in range(args.rounds):
        for vmargs in args.vmargs:
            print(life(vmargs, args.load_s), flush=True)
            time.sleep(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
