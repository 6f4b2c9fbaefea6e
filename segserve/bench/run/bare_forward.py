"""The bare network's forward throughput (the compute limit a served point is held against) and a network variant's
accuracy, each measured by segserve/model/bare.py in a fresh process: in the server's Python (a venv's for ipex) or
this one, with the point's threads, shapes and device."""

import json
import os
import subprocess
import sys
from pathlib import Path

from segserve import ROOT
from segserve.errors import RuntimeFailure


def bare_shape(record: dict, node: str) -> tuple[int, str]:
    """(threads, "batch:height:width") of the weights-carrying node of a record, as segserve.model.bare takes it."""
    threads = record.get("omp_num_threads") or len(os.sched_getaffinity(0))
    height, width = record.get(f"{node}_input_size") or record.get("input_size") or (256, 448)
    batch_size = record.get(f"{node}_batch_size") or record["batch_size"]
    return threads, f"{batch_size}:{height}:{width}"


def bare_device(handler_device: str | None) -> str:
    """segserve.model.bare's --device for a node's handler `device` setting (handlers/base.py RunnerSettings): the
    CPU for a node set to it, else auto (the GPU where there is one), as its workers pick theirs."""
    return "cpu" if handler_device == "cpu" else "auto"


def bare_command(weights: Path, threads: int, variant: dict | None = None, python: str | None = None) -> list[str]:
    """`python -m segserve.model.bare` for a network variant ({optimize, precision, input_height, input_width,
    backbone, program, device}), in the server's Python (a venv's for ipex) or this one. Without a device, the
    CPU: what every caller measured on before the bench asked for the workers' device (issue #48)."""
    variant = variant or {}
    command = [python or sys.executable, "-m", "segserve.model.bare", "--weights", str(weights), "--threads", str(threads)]
    command += ["--device", variant.get("device") or "cpu"]
    for key in ("optimize", "precision", "backbone", "program"):
        if variant.get(key) is not None:
            command += [f"--{key}", str(variant[key])]
    if variant.get("input_height"):
        command += ["--input-size", f"{variant['input_height']}:{variant['input_width']}"]
    return command


def _run_bare_command(command: list[str], threads: int, timeout_s: float, env: dict | None = None) -> subprocess.CompletedProcess:
    # the project root on the path: a venv of its own (.venv-ipex) has torch but not segserve installed
    root = str(ROOT)
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    env = {**os.environ, **(env or {}), "OMP_NUM_THREADS": str(threads), "PYTHONPATH": path}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout_s)


def run_bare(
    weights: Path,
    threads: int,
    shapes: list[str],
    seconds: float = 6.0,
    rounds: int = 3,
    log=print,
    variant: dict | None = None,
    python: str | None = None,
    env: dict | None = None,
    max_others_share: float = 0.1,
    retries: int | None = None,
) -> list[dict]:
    """The network's in-process forward throughput at these shapes, in a fresh process (segserve/model/bare.py),
    each slice watched for others' use of the machine (disturbed slices measured again, up to `retries` more)."""
    command = bare_command(weights, threads, variant, python)
    command += [arg for shape in shapes for arg in ("--shape", shape)] + ["--seconds", str(seconds), "--rounds", str(rounds)]
    command += ["--max-others-share", str(max_others_share)] + (["--retries", str(retries)] if retries is not None else [])
    done = _run_bare_command(command, threads, 900, env)
    if done.returncode != 0:
        log(f"bare forward with {threads} threads failed: {done.stderr.strip()[-300:]}")
        return []
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def run_accuracy(
    weights: Path,
    threads: int,
    variant: dict,
    python: str | None = None,
    images: int = 32,
    shapes: tuple[str, ...] = (),
    seconds: float = 6.0,
    env: dict | None = None,
) -> dict:
    """{iou, iou_eager, agreement, images, load_s} of a network variant against eager fp32 (segserve/model/accuracy.py),
    and with `shapes` its forward throughput at each ({"forward": [entries]}), in one process; raises
    RuntimeFailure with the reason when the variant cannot be loaded or run."""

    command = [*bare_command(weights, threads, variant, python), "--accuracy", str(images), "--seconds", str(seconds)]
    done = _run_bare_command(command + [arg for shape in shapes for arg in ("--shape", shape)], threads, 900, env)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    scores = [line for line in lines if "accuracy" in line]
    if done.returncode != 0 or not scores:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeFailure(f"the {variant.get('optimize') or 'eager'} network could not be run: {last[-300:]}")
    return {
        **scores[0]["accuracy"],
        "load_s": scores[0]["load_s"],
        "int8_kernels": scores[0].get("int8_kernels"),
        "forward": [line for line in lines if "accuracy" not in line],
    }
