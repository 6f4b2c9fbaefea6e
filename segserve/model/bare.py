"""The compute limit: the bare network's in-process forward throughput at a batch size and thread count.

Run as `python -m segserve.model.bare --weights W --threads T --shape B:H:W [--shape …]`, in its
own process so the thread count is set before torch starts; prints one JSON line per shape. The network is
loaded as a worker loads it (handlers/segmentation.prepare_network), in a variant: `--optimize`, `--precision`,
`--program` (the int8 program quantised from W); `--accuracy N` also scores it against eager fp32 on N
held-out images (segserve/model/accuracy.py) and prints {"accuracy": …, "load_s": …}. It imports only torch and the
handlers, so it runs in the server's Python (.venv-ipex for ipex).
The shapes are measured round-robin, `--rounds` slices each: a slow spell on a shared machine
then lands on every shape instead of on one, and the median per shape ignores it.
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from handlers import optimize, segmentation
from segserve.model import accuracy


def load_network(weights: str, backbone: str, batch_sizes: tuple[int, ...] = (), **variant) -> torch.nn.Module:
    """The network as the seg handler loads it (TorchScript, state_dict or int8 program), optimised and, when it
    compiles, compiled for these batch sizes."""
    settings = segmentation.SegmentationSettings(backbone=backbone, **variant)
    return segmentation.prepare_network(Path(weights), settings, torch.device("cpu"), batch_sizes)


def rate_ips(network: torch.nn.Module, batch: torch.Tensor, seconds: float) -> float:
    """Images per second through forward() for about `seconds` (fp32, channels_last)."""
    images, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        network(batch)
        images += batch.shape[0]
    return images / (time.perf_counter() - started)


def forward_throughputs(
    network: torch.nn.Module, shapes: list[tuple[int, int, int]], seconds: float, rounds: int, dtype: torch.dtype = torch.float32
) -> list[dict]:
    """Per (batch, height, width): median, min and max over `rounds` interleaved slices of `seconds` in all."""
    batches = {shape: torch.randn(shape[0], 3, *shape[1:], dtype=dtype).contiguous(memory_format=torch.channels_last) for shape in shapes}
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
    parser.add_argument("--shape", type=parse_shape, action="append", default=[], help="BATCH:HEIGHT:WIDTH, repeatable")
    parser.add_argument("--seconds", type=float, default=6.0, help="per shape, over all rounds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--optimize", default="eager", choices=optimize.OPTIMIZATIONS)
    parser.add_argument("--precision", default="fp32", choices=sorted(segmentation.PRECISIONS))
    parser.add_argument("--program", help="optimize int8: the program quantised from --weights")
    parser.add_argument("--input-size", type=parse_size, help="HEIGHT:WIDTH the network is prepared for (default: the first shape's)")
    parser.add_argument("--accuracy", type=int, default=0, metavar="IMAGES", help="score against eager fp32 on this many held-out images")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shapes = list(dict.fromkeys(args.shape))
    height, width = args.input_size or (shapes[0][1:] if shapes else (256, 448))
    variant = {"optimize": args.optimize, "precision": args.precision, "input_height": height, "input_width": width}
    started = time.perf_counter()
    batch_sizes = tuple(sorted({shape[0] for shape in shapes} | (accuracy.score_batches(args.accuracy) if args.accuracy else set())))
    network = load_network(args.program or args.weights, args.backbone, batch_sizes, **variant)
    load_s = time.perf_counter() - started
    dtype = segmentation.PRECISIONS[args.precision]
    if args.accuracy:
        reference = load_network(args.weights, args.backbone, input_height=height, input_width=width)
        scores = accuracy.score(network, reference, dtype, torch.channels_last, args.accuracy, (height, width))
        print(json.dumps({"accuracy": scores, "load_s": round(load_s, 2)}), flush=True)
    for entry in forward_throughputs(network, shapes, args.seconds, args.rounds, dtype):
        print(json.dumps({**entry, "optimize": args.optimize, "precision": args.precision}))


def parse_size(text: str) -> tuple[int, int]:
    height, width = (int(part) for part in text.split(":"))
    return height, width


if __name__ == "__main__":
    main()
