"""The compute limit: the bare network's in-process forward throughput at a batch size and thread count.

Run as `python -m segserve.bench.bare --weights W --batch-size B --threads T`, in its
own process so the thread count is set before torch starts; prints one JSON line.
"""

import argparse
import json
import statistics
import time

import torch

from handlers.segnet import SegNet


def forward_throughput_ips(
    weights: str, backbone: str, batch_size: int, seconds: float, height: int = 256, width: int = 448, repeats: int = 3
) -> float:
    """Median over `repeats` timed runs of images per second through forward() (fp32, channels_last)."""
    network = SegNet(2, backbone)
    network.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    network = network.eval().to(memory_format=torch.channels_last)
    batch = torch.randn(batch_size, 3, height, width).contiguous(memory_format=torch.channels_last)
    rates = []
    with torch.inference_mode():
        network(batch)  # warm-up: first call allocates and picks kernels
        for _ in range(repeats):
            images, started = 0, time.perf_counter()
            while time.perf_counter() - started < seconds / repeats:
                network(batch)
                images += batch_size
            rates.append(images / (time.perf_counter() - started))
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--weights", required=True)
    parser.add_argument("--backbone", default="mobilenet_v3_small")
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--height", type=int, default=256)
    parser.add_argument("--width", type=int, default=448)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rate = forward_throughput_ips(args.weights, args.backbone, args.batch_size, args.seconds, args.height, args.width)
    print(
        json.dumps(
            {"batch_size": args.batch_size, "threads": args.threads, "input_size": [args.height, args.width], "throughput_ips": rate}
        )
    )


if __name__ == "__main__":
    main()
