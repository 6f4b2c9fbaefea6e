"""`segserve optimize`: optimised variants of the seg network measured against eager fp32 (segserve/optimize/)."""

import argparse


def _size(text: str) -> tuple[int, int]:
    try:
        height, width = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give HEIGHTxWIDTH, like 256x448") from None
    if min(height, width) < 32:
        raise argparse.ArgumentTypeError(f"{text!r}: each side must be at least 32 pixels")
    return height, width


def add_parser(sub, common) -> None:
    p = sub.add_parser(
        "optimize", help="measure optimised variants of the seg network against eager fp32 (speed, accuracy); --out: the best's .mar"
    )
    p.add_argument(
        "--quantize", choices=["int8"], help="int8: post-training static quantisation (PT2E, x86), calibrated on synthetic images"
    )
    p.add_argument("--compile", action="store_true", help="torch.compile (inductor) at each precision")
    p.add_argument("--ipex", action="store_true", help="Intel Extension for PyTorch, in --ipex-venv's Python (make setup-ipex)")
    p.add_argument("--ipex-venv", default=".venv-ipex", help="the venv with intel-extension-for-pytorch (default: .venv-ipex)")
    p.add_argument("--precision", action="append", choices=["fp32", "fp16", "bf16"], help="also at this precision (repeatable)")
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=True, help="channels_last memory format (default)")
    p.add_argument("--weights", default="weights/seg.pt", help="a state_dict or TorchScript file (default: weights/seg.pt)")
    p.add_argument("--batch-size", type=int, default=8, help="throughput at this batch (latency: batch 1; default 8)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default: 2)")
    p.add_argument("--input-size", type=_size, default=(256, 448), metavar="HxW", help="network input (default: 256x448)")
    p.add_argument("--seconds", type=float, default=6.0, help="timing per shape (default: 6)")
    p.add_argument("--images", type=int, default=32, help="held-out images the accuracy is scored on (default: 32)")
    p.add_argument(
        "--json",
        action="store_true",
        help="print [{variant, throughput_ips, latency_ms, iou, agreement, valid, reason, int8_kernels, slower_than_eager_because, "
        "disturbed, others_cpu_pct}]",
    )
    p.add_argument("--out", help="write the fastest valid variant's seg archive here (F.mar)")
    p.set_defaults(run=run)


def run(args) -> int:
    from segserve.optimize.variants import run as run_variants

    return run_variants(args)
