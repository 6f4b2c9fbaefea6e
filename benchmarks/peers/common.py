"""What the peer apps share: segserve's own handlers loaded as a TorchServe worker loads them, the command line,
the startup line, and the stop on SIGTERM/SIGINT.

Each app lets its server form the batch, then runs segserve's stage code on it (`handler.stages.run(bodies)`:
per-row decode, one batched network forward with argmax, per-row palette + JPEG encode; a bad row comes back as
a BadRequest value, its batch-mates are served). So the server is what differs, not the work.

Imports only the standard library, torch and the repository's handlers (the peer venvs see the project venv's
torch through a .pth file: `make setup-peers`).
"""

import argparse
import importlib.metadata
import json
import os
import platform
import shutil
import sys
import tempfile
import types
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import yaml  # noqa: E402 (the repository root must be on sys.path first; yaml comes with the project venv)

from handlers.base import BadRequest, SegserveHandler  # noqa: E402
from handlers.batching import RowFailure  # noqa: E402
from handlers.pipeline import PipelineHandler, node_handler  # noqa: E402
from segserve.model.quantize import int8_program  # noqa: E402

WEIGHTS = REPO_ROOT / "weights" / "seg.pt"
WEIGHTS_DESCRIPTION = REPO_ROOT / "weights" / "seg.json"  # what the weights are: backbone, num_classes
SPEC = REPO_ROOT / "workflows" / "seg_jpeg.yaml"
NODE_CONFIGS = {"seg": REPO_ROOT / "model_config" / "seg.yaml", "jpeg": REPO_ROOT / "model_config" / "jpeg.yaml"}
JPEG_TYPE = "image/jpeg"
OPTIMIZE_CHOICES = ("eager", "int8")  # segserve's network variants a peer can run as well (its archives' optimize)


def threads_for(workers: int) -> int:
    """torch intra-op threads of one worker: the process's cores split evenly among the workers that share them, as
    segserve's SharedCores sizes a TorchServe worker's pool without a core plan (handlers/pinning.py)."""
    return max(1, len(os.sched_getaffinity(0)) // max(workers, 1))


def stage_model_dir(directory: Path, optimize: str = "eager") -> Path:
    """A model directory laid out as `segserve build` lays out the fused archive seg_jpeg_fused.mar: the workflow's
    spec, each node's model config under nodes/, and the weights (or, for `optimize: int8`, the int8 program in
    their place, as in segserve's int8 archive); the weights' own description (seg.json) names the backbone and
    class count, as `segserve build --backbone/--num-classes` would."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "nodes").mkdir(exist_ok=True)
    shutil.copy2(SPEC, directory / SPEC.name)
    described = json.loads(WEIGHTS_DESCRIPTION.read_text())
    serialized = WEIGHTS
    for stem, path in NODE_CONFIGS.items():
        config = yaml.safe_load(path.read_text())
        if (config.get("segserve") or {}).get("weights"):
            config["handler"].update(backbone=described["backbone"], num_classes=described["num_classes"])
            if optimize == "int8":
                # built once as `segserve build` builds it, and kept in the temp folder for later starts and workers
                config["handler"]["optimize"] = optimize
                serialized = int8_program(WEIGHTS, config["handler"], Path(tempfile.gettempdir()) / "segserve-peer-int8", "seg")
        (directory / "nodes" / f"{stem}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    target = directory / serialized_name(optimize)
    if not target.exists():
        target.symlink_to(serialized)
    return directory


def serialized_name(optimize: str) -> str:
    """The model directory's serialized file: the weights, or the int8 program."""
    return "seg-int8.pt2" if optimize == "int8" else "seg.pt"


def load_handler(kind: str, max_batch_size: int, threads: int, model_dir: Path | None = None, optimize: str = "eager") -> SegserveHandler:
    """segserve's handler for `kind`: "fused" (the whole seg → JPEG DAG in one worker, handlers/pipeline.py),
    "seg" (image → packed class map) or "jpeg" (packed class map → JPEG), initialised as a TorchServe worker
    initialises it (the node's model-config handler settings, this batch size, this many torch threads; `optimize`
    the network variant, as segserve's archive of that variant carries it: int8 compiles its batch buckets here)."""
    model_dir = model_dir or stage_model_dir(Path(tempfile.mkdtemp(prefix="segserve-peer-")), optimize)
    if kind == "fused":
        handler, settings = PipelineHandler(), {"spec": SPEC.name}
    elif kind in NODE_CONFIGS:
        config = yaml.safe_load((model_dir / "nodes" / f"{kind}.yaml").read_text())
        handler, settings = node_handler(config["segserve"]["handler"]), dict(config["handler"])
    else:
        raise ValueError(f"kind {kind!r} is not one of 'fused', 'seg', 'jpeg'")
    settings["threads"] = threads
    context = types.SimpleNamespace(
        system_properties={"model_dir": str(model_dir), "gpu_id": None, "batch_size": max_batch_size},
        manifest={"model": {"serializedFile": serialized_name(optimize)}},
        model_yaml_config={"handler": settings},
        metrics=None,
    )
    handler.initialize(context)
    return handler


def http_answer(result) -> tuple[int, str, bytes]:
    """(status, content type, body) of one row's result as segserve's handle() answers it: the bytes with 200, a
    BadRequest with 400 and a JSON {"error": ...}, any other row failure with 500."""
    if isinstance(result, (BadRequest, RowFailure)):
        status = 400 if isinstance(result, BadRequest) else 500
        return status, "application/json", json.dumps({"error": str(result)}).encode()
    return 200, JPEG_TYPE, bytes(result)


def arguments(peer: str, description: str, defaults: dict, extra=None) -> argparse.Namespace:
    """The command line every app takes: --port (HTTP), --max-batch-size, --batch-timeout-s, --workers, --optimize;
    `extra` adds the peer's own flags to the parser."""
    parser = argparse.ArgumentParser(prog=f"{peer}_app.py", description=description)
    parser.add_argument("--port", type=int, required=True, help="the HTTP port the benchmark talks to (loopback)")
    parser.add_argument("--max-batch-size", type=int, default=defaults["max_batch_size"], help="largest batch the server forms")
    parser.add_argument("--batch-timeout-s", type=float, default=defaults["batch_timeout_s"], help="longest wait for a batch to fill")
    parser.add_argument("--workers", type=int, default=defaults["workers"], help=defaults["workers_help"])
    parser.add_argument(
        "--optimize",
        choices=OPTIMIZE_CHOICES,
        default="eager",
        help="the network variant: eager, or segserve's int8 program (built at the first start, then kept in the temp folder)",
    )
    if extra:
        extra(parser)
    args = parser.parse_args()
    for name in ("max_batch_size", "workers"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(args, name)})")
    if args.batch_timeout_s < 0:
        parser.error(f"--batch-timeout-s must be 0 or more (got {args.batch_timeout_s})")
    return args


def print_versions(peer: str, packages: list[str], settings: dict) -> None:
    """The one JSON line the benchmark records: the server package, torch, torchvision, python, and the settings."""
    versions = {}
    for package in [*packages, "torch", "torchvision", "numpy"]:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    versions["python"] = platform.python_version()
    print(json.dumps({"peer": peer, "versions": versions, "settings": settings}), flush=True)
