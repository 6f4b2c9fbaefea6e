"""The compute limit: the bare network's in-process forward throughput at a batch size and thread count.

Run as `python -m segserve.bench.bare --weights W --threads T --shape B:H:W [--shape …]`, in its
own process so the thread count is set before torch starts; prints one JSON line per shape.
The shapes are measured round-robin, `--rounds` slices each: a slow spell on a shared machine
then lands on every shape instead of on one, and the median per shape ignores it.
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from handlers import segmentation


def load_network(weights: str, backbone: str) -> torch.nn.Module:
    """The network as the seg handler loads it (TorchScript or state_dict), in eval mode and channels_last."""
    network = segmentation.load_network(Path(weights), segmentation.SegmentationSettings(backbone=backbone))
    return network.eval().to(memory_format=torch.channels_last)


def rate_ips(network: torch.nn.Module, batch: torch.Tensor, seconds: float) -> float:
    """Images per second through forward() for about `seconds` (fp32, channels_last)."""
    images, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        network(batch)
        images += batch.shape[0]
    return images / (time.perf_counter() - started)


def forward_throughputs(network: torch.nn.Module, shapes: list[tuple[int, int, int]], seconds: float, rounds: int) -> list[dict]:
    """Per (batch, height, width): median, min and max over `rounds` interleaved slices of `seconds` in all."""
    batches = {shape: torch.randn(shape[0], 3, shape[1], shape[2]).contiguous(memory_format=torch.channels_last) for shape in shapes}
    rates: dict[tuple, list[float]] = {shape: [] for shape in shapes}
    with torch.inference_mode():
        for batch in batches.values():
            network(batch)  # warm-up: the first call per shape allocates and picks kernels
        for _ in range(rounds):
            for shape, batch in batches.items():
                rates[shape].append(rate_ips(network, batch, seconds / rounds))
    return [
        {
            "batch_size": shape[0],
            "threads": torch.get_num_threads(),
            "input_size": [shape[1], shape[2]],
            "throughput_ips": statistics.median(values),
            "throughput_min_ips": min(values),
            "throughput_max_ips": max(values),
            "rounds": rounds,
            "slices_ips": values,
        }
        for shape, values in rates.items()
    ]


def parse_shape(text: str) -> tuple[int, int, int]:
    batch, height, width = (int(part) for part in text.split(":"))
    return batch, height, width


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--weights", required=True)
    parser.add_argument("--backbone", default="mobilenet_v3_small")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--shape", type=parse_shape, action="append", required=True, help="BATCH:HEIGHT:WIDTH, repeatable")
    parser.add_argument("--seconds", type=float, default=6.0, help="per shape, over all rounds")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    network = load_network(args.weights, args.backbone)
    for entry in forward_throughputs(network, list(dict.fromkeys(args.shape)), args.seconds, args.rounds):
        print(json.dumps(entry))


if __name__ == "__main__":
    main()
