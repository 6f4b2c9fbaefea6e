"""What large images cost their neighbours: small-request latency with and without 25-megapixel JPEGs arriving.

    python -m segserve.qa.mix [--targets seg_jpeg_fused,seg_jpeg] [--seconds 20] [--large-rps 0.5]

Starts its own TorchServe on free loopback ports (the archives in --model-store), then per target runs,
alternating, a closed loop of small requests (samples/*.jpg, --concurrency connections) alone and the same
loop while an open loop sends large JPEGs beside it. Prints small-request p50/p99 for both, the ratio, and
the large requests' own latency: one run, so compare the rows of one run, not runs with each other.

Goal (exit 1 when missed): every request, small and large, answered 200. A short form (what `make test` runs,
tests/system/test_smoke.py): `--targets seg_jpeg_fused --seconds 2 --rounds 1`.
"""

import argparse
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torchvision.io import encode_jpeg

from segserve import ROOT
from segserve.bench.run.load import LoadResult, LoadSpec, run_load
from segserve.model.synthetic import make_sample
from segserve.serving.server import TorchServe


def large_jpeg(height: int = 4000, width: int = 6250) -> bytes:
    """A photo-like JPEG (shapes plus sensor-like noise, so it does not compress to nothing) of height × width."""
    image = F.interpolate(make_sample(11, 256, 448)[0][None].float(), size=(height, width), mode="bilinear")[0]
    noise = torch.randint(-20, 21, image.shape, generator=torch.Generator().manual_seed(0))
    return encode_jpeg((image + noise).clamp(0, 255).to(torch.uint8), quality=90).numpy().tobytes()


def percentiles_ms(result: LoadResult) -> tuple[float, float]:
    ok = [latency for latency, good in zip(result.latency_ms, result.ok, strict=True) if good]
    if not ok:
        return float("nan"), float("nan")
    p50, p99 = np.percentile(ok, [50, 99])
    return float(p50), float(p99)


def measure(server: TorchServe, path: str, small: list[bytes], large: bytes | None, args) -> tuple[LoadResult, LoadResult | None]:
    url, token = server.url("inference"), server.token("inference")
    results: dict[str, LoadResult] = {}
    threads = []
    specs = {"small": LoadSpec(url, path, small, token, concurrency=args.concurrency, timeout_s=120)}
    if large is not None:
        specs["large"] = LoadSpec(url, path, [large], token, concurrency=4, request_rate_rps=args.large_rps, timeout_s=120)
    for name, spec in specs.items():
        threads.append(threading.Thread(target=lambda name=name, spec=spec: results.setdefault(name, run_load(spec, args.seconds))))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results["small"], results.get("large")


def main(argv: list[str] | None = None) -> int:
    from segserve.serving.served_pipeline import served_targets, start_pipeline

    parser = argparse.ArgumentParser(prog="python -m segserve.qa.mix", description=__doc__.splitlines()[0])
    parser.add_argument("--model-store", default="model_store")
    parser.add_argument("--targets", default="seg_jpeg_fused,seg_jpeg", help="comma-separated catalog targets that take images")
    parser.add_argument("--seconds", type=float, default=20, help="each measurement (default 20)")
    parser.add_argument("--rounds", type=int, default=2, help="alone/with-large pairs per target (default 2)")
    parser.add_argument("--concurrency", type=int, default=4, help="small-request connections (default 4)")
    parser.add_argument("--large-rps", type=float, default=0.5, help="large JPEGs per second (default 0.5)")
    args = parser.parse_args(argv)
    small = [p.read_bytes() for p in sorted((ROOT / "samples").glob("*.jpg"))]
    large = large_jpeg()
    small_kb = sum(map(len, small)) // len(small) // 1000
    print(f"small: {len(small)} sample JPEGs of ~{small_kb} KB; large: a 6250x4000 JPEG of {len(large) // 1000} KB")
    with tempfile.TemporaryDirectory(prefix="segserve-mix-") as tmp:
        server = TorchServe(Path(tmp), Path(args.model_store), ROOT / "config.properties", free_ports=True)
        targets = {t.name: t for t in served_targets(args.targets)}
        start_pipeline(server, list(targets.values()), log=lambda _: None)
        failed = 0  # requests not answered 200, small and large
        with server:  # stopped, every process of it, however the block ends
            header = ("target", "large/s", "small p50", "small p99", "small rps", "large p50", "large ok")
            print("{:16s} {:>7s} {:>10s} {:>10s} {:>9s} {:>10s} {:>8s}".format(*header))
            for target in args.targets.split(","):
                for _ in range(args.rounds):
                    for with_large in (False, True):
                        small_result, large_result = measure(server, targets[target].endpoint, small, large if with_large else None, args)
                        p50, p99 = percentiles_ms(small_result)
                        rps = sum(small_result.ok) / small_result.wall_s
                        large_p50 = percentiles_ms(large_result)[0] if large_result else float("nan")
                        large_ok = f"{sum(large_result.ok)}/{len(large_result.ok)}" if large_result else "-"
                        failed += sum(not ok for result in (small_result, large_result) if result for ok in result.ok)
                        rate = args.large_rps if with_large else 0
                        print(f"{target:16s} {rate:7.2f} {p50:10.1f} {p99:10.1f} {rps:9.1f} {large_p50:10.1f} {large_ok:>8s}")
    print(f"goal {'met' if not failed else 'MISSED'}: {failed} request(s) not answered 200")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
