"""The compute limit: the bare network's in-process forward throughput at a batch size and thread count.

Run as `python -m segserve.model.bare --weights W --threads T --shape B:H:W [--shape …]`, in its
own process so the thread count is set before torch starts; prints one JSON line per shape. The network is
loaded as a worker loads it (handlers/segmentation.prepare_network), in a variant: `--optimize`, `--precision`,
`--program` (the int8 program quantised from W), on `--device` (auto: the GPU where there is one, as a worker
with handler.device auto; issue #48); `--accuracy N` also scores it against eager fp32 on N held-out images
(segserve/model/accuracy.py) and prints {"accuracy": …, "load_s": …}. It imports only torch and the handlers, so
it runs in the server's Python (.venv-ipex for ipex).
The work timed is what a worker does with the network on its device: forward on the CPU (as before #48, so CPU
numbers stay comparable with earlier runs), forward + argmax to uint8 on a GPU (only the class map leaves it),
each slice ended by a synchronise; every line says which (`device`, `work`).
The shapes are measured round-robin, `--rounds` slices each: a slow spell on a shared machine
then lands on every shape instead of on one, and the median per shape ignores it. Each slice watches others'
use of the machine (segserve/machine/disturbance.py) as a served window does: a disturbed slice is measured
again (`--retries`), and a shape still short of clean slices is printed `disturbed`.
"""

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from handlers import optimize, segmentation
from segserve.machine.disturbance import OwnSpan
from segserve.model import accuracy

DEVICES = ("auto", "cpu", "cuda")


def pick_device(name: str) -> torch.device:
    """auto: CUDA where torch sees it, else the CPU; cuda without CUDA is refused in one line."""
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device cuda: torch {torch.__version__} sees no CUDA device here; use --device auto or --device cpu")
    return torch.device("cuda" if name == "cuda" or (name == "auto" and torch.cuda.is_available()) else "cpu")


def load_network(
    weights: str, backbone: str, batch_sizes: tuple[int, ...] = (), device: torch.device | None = None, **variant
) -> torch.nn.Module:
    """The network as the seg handler loads it (TorchScript, state_dict or int8 program) on `device` (the CPU by
    default), optimised and, when it compiles, compiled for these batch sizes."""
    settings = segmentation.SegmentationSettings(backbone=backbone, **variant)
    return segmentation.prepare_network(Path(weights), settings, device or torch.device("cpu"), batch_sizes)


def worker_work(network: torch.nn.Module, device: torch.device) -> tuple[Callable[[torch.Tensor], object], str]:
    """(the work a worker does with the network per batch, its name): forward alone on the CPU (the measure of
    earlier runs), forward + argmax to uint8 on a GPU (handlers/segmentation.py: only the class map leaves it)."""
    if device.type == "cuda":
        return (lambda batch: network(batch).argmax(1).to(torch.uint8)), "forward+argmax"
    return network, "forward"


def synchronise(device: torch.device) -> None:
    """Wait for the device's queued work: a GPU runs it after the call returns, so the clock is read after this."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rate_ips(work: Callable[[torch.Tensor], object], batch: torch.Tensor, seconds: float, device: torch.device | None = None) -> float:
    """Images per second through `work` (a network's forward) for about `seconds`, its queued work done."""
    images, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        work(batch)
        images += batch.shape[0]
    synchronise(device or batch.device)
    return images / (time.perf_counter() - started)


def forward_throughputs(
    network: torch.nn.Module,
    shapes: list[tuple[int, int, int]],
    seconds: float,
    rounds: int,
    dtype: torch.dtype = torch.float32,
    max_others_share: float = 0.1,
    retries: int | None = None,
    device: torch.device | None = None,
) -> list[dict]:
    """Per (batch, height, width): median, min and max over `rounds` interleaved slices of `seconds` in all, of
    the work a worker does on `device` (the network's; the CPU by default: worker_work).

    Watched as a served window is: a slice during which other processes took more than `max_others_share` of
    the machine (a server still draining its queue, a busy neighbour) is measured again, up to `retries` more
    slices per shape (default: `rounds`). A shape left with fewer than `rounds` clean slices keeps them all
    and says `disturbed`: its number is not the network's alone."""
    retries = rounds if retries is None else retries
    device = device or torch.device("cpu")
    work, work_name = worker_work(network, device)
    batches = {
        shape: torch.randn(shape[0], 3, *shape[1:], dtype=dtype, device=device).contiguous(memory_format=torch.channels_last)
        for shape in shapes
    }
    clean: dict[tuple, list[float]] = {shape: [] for shape in shapes}
    every: dict[tuple, list[tuple[float, float]]] = {shape: [] for shape in shapes}  # (img/s, others' share)
    with torch.inference_mode():
        for batch in batches.values():
            work(batch)  # warm-up: the first call per shape allocates and picks kernels
        synchronise(device)
        for _ in range(rounds + retries):
            wanted = [shape for shape in shapes if len(clean[shape]) < rounds and len(every[shape]) < rounds + retries]
            if not wanted:
                break
            for shape in wanted:
                span = OwnSpan()
                rate = rate_ips(work, batches[shape], seconds / rounds, device)
                others = span.others_share()
                every[shape].append((rate, others))
                if others <= max_others_share:
                    clean[shape].append(rate)
    entries = []
    for shape in shapes:
        disturbed = len(clean[shape]) < rounds
        values = [rate for rate, _ in every[shape]] if disturbed else clean[shape]
        shares = [share for _, share in every[shape]]
        entries.append(
            {
                "batch_size": shape[0],
                "threads": torch.get_num_threads(),
                "device": device.type,
                "work": work_name,
                "input_size": [shape[1], shape[2]],
                "throughput_ips": statistics.median(values),
                "throughput_min_ips": min(values),
                "throughput_max_ips": max(values),
                "rounds": rounds,
                "slices_ips": values,
                # others' share of the machine in every slice measured (% of all cores), and what was done about it
                "slices_others_cpu_pct": [round(100 * share, 1) for share in shares],
                "slices_discarded": len(every[shape]) - len(clean[shape]) if not disturbed else 0,
                "others_cpu_pct": round(100 * max(shares), 1),
                "disturbed": disturbed,
            }
        )
    return entries


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
    parser.add_argument(
        "--max-others-share", type=float, default=0.1, help="a slice where others took more of the machine is measured again"
    )
    parser.add_argument("--retries", type=int, help="disturbed slices measured again, per shape (default: --rounds)")
    parser.add_argument("--optimize", default="eager", choices=optimize.OPTIMIZATIONS)
    parser.add_argument("--precision", default="fp32", choices=sorted(segmentation.PRECISIONS))
    parser.add_argument("--device", default="auto", choices=DEVICES, help="auto: CUDA where torch sees it, else the CPU")
    parser.add_argument("--program", help="optimize int8: the program quantised from --weights")
    parser.add_argument("--input-size", type=parse_size, help="HEIGHT:WIDTH the network is prepared for (default: the first shape's)")
    parser.add_argument("--accuracy", type=int, default=0, metavar="IMAGES", help="score against eager fp32 on this many held-out images")
    args = parser.parse_args()
    device = pick_device(args.device)
    torch.set_num_threads(args.threads)
    shapes = list(dict.fromkeys(args.shape))
    height, width = args.input_size or (shapes[0][1:] if shapes else (256, 448))
    variant = {"optimize": args.optimize, "precision": args.precision, "input_height": height, "input_width": width}
    started = time.perf_counter()
    batch_sizes = tuple(sorted({shape[0] for shape in shapes} | (accuracy.score_batches(args.accuracy) if args.accuracy else set())))
    network = load_network(args.program or args.weights, args.backbone, batch_sizes, device, **variant)
    load_s = time.perf_counter() - started
    # int8: how many convolutions inductor compiled to int8 kernels (0: the program runs in fp32)
    kernels = optimize.int8_kernels() if args.optimize == "int8" else None
    dtype = segmentation.PRECISIONS[args.precision]
    if args.accuracy:
        reference = load_network(args.weights, args.backbone, input_height=height, input_width=width)  # eager fp32, on the CPU
        scores = accuracy.score(on_host(network, device), reference, dtype, torch.channels_last, args.accuracy, (height, width))
        print(json.dumps({"accuracy": scores, "load_s": round(load_s, 2), "int8_kernels": kernels, "device": device.type}), flush=True)
    entries = forward_throughputs(network, shapes, args.seconds, args.rounds, dtype, args.max_others_share, args.retries, device)
    for entry in entries:
        print(json.dumps({**entry, "optimize": args.optimize, "precision": args.precision, "int8_kernels": kernels}))


def on_host(network: torch.nn.Module, device: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
    """The network called with and answering host tensors (the accuracy check's, beside the CPU reference)."""
    if device.type == "cpu":
        return network
    return lambda batch: network(batch.to(device)).cpu()


def parse_size(text: str) -> tuple[int, int]:
    height, width = (int(part) for part in text.split(":"))
    return height, width


if __name__ == "__main__":
    main()
