"""The Java CPU of one TorchServe frontend over a test-like life, with and without JVM options (docs/testing.md),
or at steady state under the seed's load (issue #49, docs/measurements.md).

    .venv/bin/python benchmarks/frontend_jvm.py [--load-s 8] [--rounds 2] [VMARGS ...]
    .venv/bin/python benchmarks/frontend_jvm.py --raw --connections 128 --endpoint /predictions/seg_jpeg_fused \
        --load-s 75 --steady-after-s 40 -- -XX:+UseG1GC "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

Per round and per option set (alternating; '' is the JVM's defaults): start a TorchServe on free ports from
model_store/ (`segserve build` first), register seg, jpeg, seg_jpeg and seg_jpeg_fused, put --connections of
samples/shapes_0.jpg (--raw: the seed's FP16 [3, 256, 448] bodies) on --endpoint for --load-s, stop; print the
frontend's CPU seconds at each stage (`--` before option sets that start with a dash). With --steady-after-s S,
also its CPU per request answered after S seconds of the load, once the JIT has compiled what the requests run (a
benchmark point's windows start seconds after its server's start).
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
from segserve.serving.served_pipeline import register, served_targets  # noqa: E402
from segserve.serving.server import VMARGS_ENV, TorchServe  # noqa: E402


def bodies(raw: bool) -> list[bytes]:
    if not raw:
        return [(ROOT / "samples" / "shapes_0.jpg").read_bytes()]
    import torch

    return [torch.randn(3, 256, 448, generator=torch.Generator().manual_seed(i)).half().numpy().tobytes() for i in range(8)]


def life(
    vmargs: str, load_s: float, endpoint: str = "/wfpredict/seg_jpeg", connections: int = 4, raw: bool = False, steady_after_s=None
) -> str:
    run_dir = Path(tempfile.mkdtemp(prefix="segserve-jvm-"))
    # '' → an empty vmargs (config.properties sets its own since #49): the JVM's defaults
    server = TorchServe(run_dir, ROOT / "model_store", ROOT / "config.properties", free_ports=True, config_overrides={"vmargs": vmargs})
    server.start(log=lambda _: None)
    try:
        java = next(p for p in map(psutil.Process, server.process_ids()) if p.name() == "java")

        def cpu_s() -> float:
            times = java.cpu_times()
            return times.user + times.system

        started = cpu_s()
        register(server, served_targets(None), log=lambda _: None)
        registered = cpu_s()
        load = Background(torchserve_load(server, endpoint, bodies(raw), connections), load_s + 30)
        load.start()
        steady = ""
        if steady_after_s:
            time.sleep(steady_after_s)
            at, begun = load.now(), cpu_s()
            time.sleep(load_s - steady_after_s)
            spent, until = cpu_s() - begun, load.now()
        else:
            time.sleep(load_s)
        result = load.finish()
        loaded, ok = cpu_s(), sum(result.ok)
        if steady_after_s:
            answered = result.rate_rps(at, until) * (until - at)
            steady = f"  steady after {steady_after_s:.0f} s: {1000 * spent / max(answered, 1):.2f} ms/request ({answered:.0f} requests)"
    finally:
        server.stop()
    per_request_ms = 1000 * (loaded - registered) / max(ok, 1)
    return (
        f"{vmargs or 'JVM defaults':45s} start {started:4.1f}  +register {registered - started:4.1f}  "
        f"+load {loaded - registered:5.1f} CPU-s "
        f"({ok} requests, {per_request_ms:.1f} ms/request)  total {loaded:5.1f} CPU-s{steady}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("vmargs", nargs="*", default=["", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"])
    parser.add_argument("--load-s", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--endpoint", default="/wfpredict/seg_jpeg")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--raw", action="store_true", help="the seed's raw FP16 bodies instead of samples/shapes_0.jpg")
    parser.add_argument("--steady-after-s", type=float, help="also the CPU per request answered after this much of the load")
    args = parser.parse_args()
    if args.steady_after_s is not None and not 0 < args.steady_after_s < args.load_s:
        print(f"error: --steady-after-s {args.steady_after_s} must be inside --load-s {args.load_s}", file=sys.stderr)
        return 2
    if not (ROOT / "model_store" / "seg_jpeg.war").exists():
        print("error: no model_store/seg_jpeg.war: run `segserve build` first", file=sys.stderr)
        return 2
    os.environ.pop(VMARGS_ENV, None)  # '' measures the JVM's own defaults, whatever this shell sets
    print(f"cores: {len(psutil.Process().cpu_affinity())}")
    for _ in range(args.rounds):
        for vmargs in args.vmargs:
            print(life(vmargs, args.load_s, args.endpoint, args.connections, args.raw, args.steady_after_s), flush=True)
            time.sleep(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
