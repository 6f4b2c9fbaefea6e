"""Log bytes per request at the default level: `python benchmarks/log_volume.py [--requests 300]`.

Starts a TorchServe of its own (free loopback ports, a temporary run folder) with seg_jpeg_fused from
model_store/ (`segserve build` first), sends sequential requests and prints the bytes each file under
logs/ grew by, per request. Rotated files count: the sum is over every file.
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from segserve.serving.http import request  # noqa: E402
from segserve.serving.server import TorchServe  # noqa: E402


def sizes(logs: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in logs.iterdir() if p.is_file()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--model-store", default=str(ROOT / "model_store"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="segserve-logs-") as tmp:
        server = TorchServe(Path(tmp), Path(args.model_store), ROOT / "config.properties", free_ports=True)
        server.start(log=lambda _: None)
        try:
            server.register_model("seg_jpeg_fused.mar", "seg_jpeg_fused", log=lambda _: None)
            body = (ROOT / "samples" / "shapes_1.jpg").read_bytes()
            url, token = server.url("inference"), server.token("inference")

            def send(count: int) -> None:
                for _ in range(count):
                    assert request(url, "POST", "/predictions/seg_jpeg_fused", token, body=body, timeout_s=60).status == 200

            logs = Path(tmp) / "logs"
            send(10)
            time.sleep(2)
            before = sizes(logs)
            send(args.requests)
            time.sleep(2)  # log4j flushes
            after = sizes(logs)
        finally:
            server.stop()
    added = {name: after.get(name, 0) - before.get(name, 0) for name in sorted(set(after) | set(before))}
    total = sum(added.values())
    print(f"{args.requests} sequential requests to /predictions/seg_jpeg_fused: {total / args.requests:.0f} B of log per request")
    for name, grown in added.items():
        if grown:
            print(f"  {name:24s} {grown / args.requests:7.0f} B/request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
