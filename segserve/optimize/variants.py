"""`segserve optimize`: the torchprep job for a user who is not running a suite. Each asked variant of the
segmentation network (compile, int8, ipex, other precisions) is measured against eager fp32, which is always
measured as the variant `eager`: forward throughput at a batch, latency of one image, and accuracy on held-out
synthetic images (segserve/model/accuracy.py: invalid when IoU drops by more than 0.01). `--out F.mar` writes the
seg archive of the fastest valid variant.

Every variant runs in a fresh process (segserve/model/bare.py), ipex in .venv-ipex's Python.
"""

import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from segserve.bench.run.bare_forward import run_accuracy
from segserve.errors import RuntimeFailure, UsageError
from segserve.machine.identity import cpu_identity, int8_shortfall

JSON_KEYS = ("variant", "throughput_ips", "latency_ms", "iou", "agreement", "valid", "reason", "int8_kernels", "slower_than_eager_because",
             "disturbed", "others_cpu_pct")  # fmt: skip


@dataclass(frozen=True)
class Variant:
    optimize: str
    precision: str = "fp32"

    @property
    def name(self) -> str:
        return self.optimize if self.precision == "fp32" else f"{self.optimize}-{self.precision}"


def asked_variants(quantize: str | None, compile_: bool, ipex: bool, precisions: list[str]) -> list[Variant]:
    """eager fp32 first (the reference), then eager at each other precision, compile at each, int8, ipex."""
    precisions = list(dict.fromkeys(["fp32", *precisions]))
    found = [Variant("eager", p) for p in precisions]
    found += [Variant("compile", p) for p in precisions] if compile_ else []
    found += [Variant("int8")] if quantize == "int8" else []
    found += [Variant("ipex", p) for p in precisions if p in ("fp32", "bf16")] if ipex else []
    return found


def measure_variant(variant: Variant, weights: Path, settings: dict, shapes: list[str], python: str | None, work: Path) -> dict:
    """One variant's row: throughput at the batch, latency at batch 1, accuracy, valid/reason; a variant that
    cannot be built or run is invalid with the error."""
    row = {"variant": variant.name, "throughput_ips": None, "latency_ms": None, "iou": None, "agreement": None, "int8_kernels": None,
           "disturbed": None, "others_cpu_pct": None}  # fmt: skip
    from segserve.model.accuracy import verdict  # imports torch: not before the arguments are checked (a refusal is instant)

    spec = {**settings, "optimize": variant.optimize, "precision": variant.precision}
    try:
        if variant.optimize == "int8":
            from segserve.model.quantize import quantize_int8

            spec["program"] = quantize_int8(weights, settings, work / f"{variant.name}.pt2")
        scores = run_accuracy(
            weights, settings["threads"], spec, python, images=settings["images"], shapes=tuple(shapes), seconds=settings["seconds"]
        )
    except RuntimeFailure as failure:
        return {**row, "valid": False, "reason": str(failure), "load_s": None}
    valid, reason = verdict(scores)
    by_batch = {entry["batch_size"]: entry["throughput_ips"] for entry in scores["forward"]}
    batch = int(shapes[0].split(":")[0])
    return {
        **row,
        "throughput_ips": round(by_batch[batch], 2),
        "latency_ms": round(1000 / by_batch[1], 2),
        "iou": scores["iou"],
        "agreement": scores["agreement"],
        "valid": valid,
        "reason": reason,
        "load_s": scores["load_s"],
        "program": spec.get("program"),
        "int8_kernels": scores.get("int8_kernels"),
        # the bare forward watches others' CPU per slice: a variant measured while others used the machine says so
        "disturbed": any(entry.get("disturbed") for entry in scores["forward"]),
        "others_cpu_pct": max((entry.get("others_cpu_pct") or 0.0 for entry in scores["forward"]), default=None),
    }


def slower_cause(row: dict, eager_ips: float | None, isa: dict, vendor: str | None = None) -> str | None:
    """Why an int8 variant measured slower than eager fp32, named; None when it was not (or is not int8)."""
    if not row["variant"].startswith("int8") or not row["throughput_ips"] or not eager_ips or row["throughput_ips"] >= eager_ips:
        return None
    kernels = row.get("int8_kernels") or {}
    if not kernels.get("int8_convolutions"):
        return "no int8 kernels in use: inductor matched no int8 convolution, so the program ran its (de)quantize ops around fp32 ones"
    shortfall = int8_shortfall(isa, vendor)
    if shortfall:
        return f"int8 kernels in use ({kernels['int8_convolutions']} convolutions compiled), but {shortfall}"
    return f"int8 kernels in use ({kernels['int8_convolutions']} convolutions compiled) on a CPU with VNNI/AMX: not the ISA; profile it"


def fastest_valid(rows: list[dict]) -> dict | None:
    valid = [r for r in rows if r["valid"] and r["throughput_ips"]]
    return max(valid, key=lambda r: r["throughput_ips"]) if valid else None


def write_archive(root: Path, weights: Path, out: Path, row: dict, channels_last: bool, log) -> Path:
    """The seg .mar of a variant (its int8 program as the serialized file), named after --out."""
    from segserve.archives.build import Recipe
    from segserve.archives.catalog import Catalog

    catalog = Catalog(root)
    model = catalog.targets["seg"].nodes[0].model
    optimize, _, precision = row["variant"].partition("-")
    settings = {"optimize": optimize, "precision": precision or "fp32", "channels_last": channels_last}
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="segserve-optimize-") as tmp:
        recipe = Recipe(catalog, weights, out.parent, Path(tmp), log=log)
        return recipe.node_archive(model, out.stem, settings)


def to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run(args, log=to_stderr) -> int:
    """Progress and the archiver's commands go to stderr: stdout is the table, or the JSON with --json."""
    weights = Path(args.weights)
    if not weights.exists():
        raise UsageError(f"--weights {weights}: no such file (segserve build trains weights/seg.pt)")
    if args.out and Path(args.out).suffix != ".mar":  # said before minutes of measuring, not after
        raise UsageError(f"--out {args.out}: give a file name ending in .mar")
    ipex_python = Path(args.ipex_venv) / "bin" / "python"
    if args.ipex and not ipex_python.exists():
        raise UsageError(f"--ipex: {ipex_python} does not exist: run `make setup-ipex` (or give --ipex-venv)")
    height, width = args.input_size
    if args.images < 1:
        raise UsageError(f"--images must be at least 1 (got {args.images})")
    settings = {"input_height": height, "input_width": width, "threads": args.threads, "seconds": args.seconds, "images": args.images}
    shapes = [f"{args.batch_size}:{height}:{width}"] + ([f"1:{height}:{width}"] if args.batch_size != 1 else [])
    rows, here = [], cpu_identity()
    isa = here["cpu_isa"]
    variants = asked_variants(args.quantize, args.compile, args.ipex, args.precision or [])
    if any(v.optimize == "int8" for v in variants) and int8_shortfall(isa, here["cpu_vendor"]):
        log(f"warning: int8 on this machine: {int8_shortfall(isa, here['cpu_vendor'])}")  # said before minutes of measuring
    with tempfile.TemporaryDirectory(prefix="segserve-variants-") as tmp:
        for variant in variants:
            log(f"measuring {variant.name} …")
            python = str(ipex_python) if variant.optimize == "ipex" else None
            rows.append(measure_variant(variant, weights, settings, shapes, python, Path(tmp)))
            if not rows[-1]["valid"]:
                log(f"{variant.name} is invalid: {rows[-1]['reason']}")
        for row in rows:
            if row["disturbed"]:
                log(f"warning: {row['variant']} was measured while other processes took up to {row['others_cpu_pct']:.0f}% of the machine")
            row["slower_than_eager_because"] = slower_cause(row, rows[0]["throughput_ips"], isa, here["cpu_vendor"])
            if row["slower_than_eager_because"]:
                log(f"{row['variant']} is slower than eager: {row['slower_than_eager_because']}")
        chosen = fastest_valid(rows)
        archive = write_archive(Path.cwd(), weights, Path(args.out), chosen, args.channels_last, log) if args.out and chosen else None
    if args.json:
        print(json.dumps([{k: r[k] for k in JSON_KEYS} for r in rows], indent=2))
    else:
        print_table(rows, args.batch_size)
    if args.out and chosen is None:
        raise RuntimeFailure("--out: no variant is valid, no archive written")
    if archive:
        log(f"wrote {archive} ({chosen['variant']}, {chosen['throughput_ips']} img/s at batch {args.batch_size})")
    return 0


def print_table(rows: list[dict], batch_size: int) -> None:
    from segserve.bench.results.render import render_table

    eager = rows[0]["throughput_ips"]
    for row in rows:
        row["vs_eager"] = round(row["throughput_ips"] / eager, 2) if row["throughput_ips"] and eager else None
        for share in ("iou", "agreement"):  # to 4 decimals: the gate is 0.01, and 0.9997 is not 1
            row[share] = None if row[share] is None else f"{row[share]:.4f}"
    for row in rows:
        kernels = row.get("int8_kernels")
        row["int8_convs"] = kernels.get("int8_convolutions") if kernels else None
    columns = [
        "variant",
        "throughput_ips",
        "vs_eager",
        "latency_ms",
        "iou",
        "agreement",
        "int8_convs",
        "disturbed",
        "load_s",
        "valid",
        "reason",
    ]
    print(f"\nforward at batch {batch_size} (throughput) and batch 1 (latency); accuracy against eager fp32 on held-out images")
    print(render_table(rows, columns))
    for row in rows:
        if row.get("slower_than_eager_because"):
            print(f"{row['variant']} slower than eager: {row['slower_than_eager_because']}")
