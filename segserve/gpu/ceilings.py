"""Each stage's ceiling in this process, on the device the workers use: what the served rates are read against.

    python -m segserve.gpu.ceilings OUT.json [--seconds S] [--batch-size N]

- forward + argmax (what a seg worker runs on the device) at the served batch size, eager and replayed as a CUDA
  graph (launch gaps gone: the network's own limit);
- nvJPEG batched decode and encode at the seed's size (256 × 448), one call per batch as the handlers make it;
- host→device copies of raw FP16 [3, 256, 448] bodies (688,128 B each), from pinned and from pageable memory;
- whether torchvision's CUDA encoder waits for the stream that wrote its input (#48's wrong bytes): the same image
  encoded after a long kernel, through torchvision directly and through handlers/jpeg.encode_jpegs.
Without CUDA (the bundle's dry run) the same on the CPU, briefly, in fp32, with no copies and no graph.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from segserve import ROOT

HEIGHT, WIDTH = 256, 448
# without CUDA each measurement is this short: it checks that every part runs (3 slices, each one call at least)
DRY_RUN_SECONDS = 0.3


def timed(work, seconds: float, items: int, sync) -> dict:
    """items/s of work() over about `seconds`, after two warm-up calls; the median of three slices."""
    for _ in range(2):
        work()
    sync()
    rates = []
    for _ in range(3):
        count, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds / 3:
            work()
            count += items
        sync()
        rates.append(count / (time.perf_counter() - started))
    return {"per_s": sorted(rates)[1], "slices_per_s": [round(r, 1) for r in rates]}


def forward(device: torch.device, batch_size: int, seconds: float, sync) -> dict:
    from handlers.segmentation import SegmentationSettings, prepare_network

    precision = "fp16" if device.type == "cuda" else "fp32"
    settings = SegmentationSettings(precision=precision)
    network = prepare_network(ROOT / "weights" / "seg.pt", settings, device)
    dtype = torch.float16 if precision == "fp16" else torch.float32
    batch = torch.randn(batch_size, 3, HEIGHT, WIDTH, device=device, dtype=dtype).contiguous(memory_format=torch.channels_last)

    def step():
        return network(batch).argmax(1).to(torch.uint8)

    with torch.inference_mode():
        eager = timed(step, seconds, batch_size, sync)
        result = {"precision": precision, "batch_size": batch_size, "eager_img_per_s": round(eager["per_s"], 1), "eager": eager}
        if device.type == "cuda":
            try:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(3):
                        step()
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    step()
                replayed = timed(graph.replay, seconds, batch_size, sync)
                result.update(cuda_graph_img_per_s=round(replayed["per_s"], 1), cuda_graph=replayed)
            except Exception as error:  # a network that cannot be captured says why; the eager number stands
                result["cuda_graph_error"] = f"{type(error).__name__}: {error}"[:300]
    return result


def codecs(device: torch.device, batch_size: int, seconds: float, sync) -> dict:
    from torchvision.io import decode_jpeg, encode_jpeg

    from handlers.jpeg import encode_jpegs
    from segserve.model.synthetic import make_sample

    images = [make_sample(1000 + i, HEIGHT, WIDTH)[0] for i in range(batch_size)]
    jpegs = [encode_jpeg(image, quality=90) for image in images]
    on_device = [image.to(device) for image in images]
    decode = timed(lambda: decode_jpeg(jpegs, device=device), seconds, batch_size, sync)
    encode = timed(lambda: encode_jpegs(on_device, 90), seconds, batch_size, sync)
    return {
        "batch_size": batch_size,
        "decode_img_per_s": round(decode["per_s"], 1),
        "encode_img_per_s": round(encode["per_s"], 1),
        "decode": decode,
        "encode": encode,
    }


def copies(device: torch.device, batch_size: int, seconds: float, sync) -> dict:
    nbytes = batch_size * 3 * HEIGHT * WIDTH * 2
    target = torch.empty(batch_size, 3, HEIGHT, WIDTH, dtype=torch.float16, device=device)
    result = {"bytes_per_copy": nbytes}
    for kind, pinned in (("pinned", True), ("pageable", False)):
        host = torch.randn(batch_size, 3, HEIGHT, WIDTH).half()
        host = host.pin_memory() if pinned else host
        rate = timed(lambda host=host, pinned=pinned: target.copy_(host, non_blocking=pinned), seconds, nbytes, sync)
        result[f"{kind}_gb_per_s"] = round(rate["per_s"] / 1e9, 2)
    return result


def encoder_race(device: torch.device, rounds: int = 8) -> dict:
    """How many of `rounds` encodes of an image written behind a ~0.1 s kernel came out as the finished image."""
    from torchvision.io import encode_jpeg

    from handlers.jpeg import encode_jpegs

    image = torch.zeros(3, 512, 512, dtype=torch.uint8, device=device)
    expected = encode_jpegs([torch.full_like(image, 200)], 90)[0]
    right = {"torchvision": 0, "segserve": 0}
    for _ in range(rounds):
        for name in right:
            image.zero_()
            torch.cuda.synchronize()
            torch.cuda._sleep(200_000_000)
            image.fill_(200)
            if name == "torchvision":
                got = encode_jpeg([image], quality=90)[0].cpu()
                torch.cuda.synchronize()
            else:
                got = encode_jpegs([image], 90)[0]
            right[name] += bool(torch.equal(got, expected))
    return {"rounds": rounds, "finished_image": right}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement (default 3)")
    parser.add_argument("--batch-size", type=int, default=32, help="the served batch size (default 32)")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    batch_size = args.batch_size if cuda else min(args.batch_size, 4)
    seconds = args.seconds if cuda else min(args.seconds, DRY_RUN_SECONDS)
    found: dict = {"device": torch.cuda.get_device_name(0) if cuda else "cpu"}
    parts = [("forward", lambda: forward(device, batch_size, seconds, sync)), ("jpeg", lambda: codecs(device, batch_size, seconds, sync))]
    if cuda:
        parts += [("host_to_device", lambda: copies(device, batch_size, seconds, sync)), ("encoder_race", lambda: encoder_race(device))]
    failed = False
    for name, part in parts:
        started = time.perf_counter()
        try:
            found[name] = part()
        except Exception as error:  # one part failing leaves the others' numbers
            found[name] = {"error": f"{type(error).__name__}: {error}"[:400]}
            failed = True
        found[name]["seconds"] = round(time.perf_counter() - started, 1)
        print(name, json.dumps(found[name]), flush=True)
    args.out.write_text(json.dumps(found, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
