"""Build the archives: weights (trained if missing), seg.mar, jpeg.mar and seg_jpeg.war.

Runs the real torch-model-archiver / torch-workflow-archiver and prints each
command, so a user can run the same steps by hand.
"""

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from segserve.errors import RuntimeFailure, UsageError

HANDLERS = ("segmentation", "jpeg")


def tool(name: str) -> str:
    """A console script from this Python's environment, falling back to PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if not found:
        raise RuntimeFailure(f"{name} is not installed: run `make setup` (or pip install -e .)")
    return found


def run_tool(command: list[str], log=print) -> None:
    log("$ " + " ".join(command))
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeFailure(f"{Path(command[0]).name} failed ({done.returncode}): {(done.stderr or done.stdout).strip()[-2000:]}")


def stage_handler_package(root: Path, staging: Path) -> Path:
    """A folder whose only entry is the handlers/ package: --extra-files copies it into the archive root."""
    package = staging / "extra" / "handlers"
    package.mkdir(parents=True)
    for source in sorted((root / "handlers").glob("*.py")):
        shutil.copy2(source, package / source.name)
    return package.parent


def stage_fused_extras(extra: Path, spec: Path, seg_config: Path, jpeg_config: Path) -> Path:
    """What the fused archive carries beside the handlers: the DAG spec and each node's config."""
    (extra / "nodes").mkdir(exist_ok=True)
    shutil.copy2(seg_config, extra / "nodes" / "seg.yaml")
    shutil.copy2(jpeg_config, extra / "nodes" / "jpeg.yaml")
    shutil.copy2(spec, extra / spec.name)
    return extra


def write_model_config(source: Path, target: Path, handler_overrides: dict) -> Path:
    config = yaml.safe_load(source.read_text()) or {}
    config.setdefault("handler", {}).update({k: v for k, v in handler_overrides.items() if v is not None})
    target.write_text(yaml.safe_dump(config, sort_keys=False))
    return target


def archive_model(name: str, handler: str, serialized_file: Path | None, config: Path, extra: Path, model_store: Path, log=print) -> Path:
    command = [tool("torch-model-archiver"), "--model-name", name, "--version", "1.0", "--handler", f"{handler}:handle"]
    if serialized_file is not None:
        command += ["--serialized-file", str(serialized_file)]
    command += ["--config-file", str(config), "--extra-files", str(extra), "--export-path", str(model_store), "--force"]
    run_tool(command, log)
    return model_store / f"{name}.mar"


def archive_workflow(spec: Path, model_store: Path, log=print) -> Path:
    name = spec.stem
    handler = spec.with_name(f"{name}_handler.py")
    command = [tool("torch-workflow-archiver"), "--workflow-name", name, "--spec-file", str(spec), "--handler", str(handler)]
    run_tool(command + ["--export-path", str(model_store), "--force"], log)
    return model_store / f"{name}.war"


def ensure_weights(weights: Path, backbone: str | None, log=print) -> Path:
    if weights.exists():
        log(f"using weights {weights}")
        return weights
    from segserve.train import TrainSettings, train  # imported here: training pulls in the data generator

    log(f"{weights} is missing: training on synthetic data (deterministic, a few minutes on 2 cores)")
    settings = TrainSettings(backbone=backbone) if backbone else TrainSettings()
    train(weights, settings, log=log)
    return weights


def build(
    root: Path,
    model_store: Path,
    weights: Path | None = None,
    backbone: str | None = None,
    num_classes: int | None = None,
    workflow_spec: Path | None = None,
    log=print,
) -> list[Path]:
    """Build every archive into model_store; return their paths."""
    root = root.resolve()
    if weights is not None and not weights.exists():
        raise UsageError(f"--weights {weights}: no such file (give a TorchScript file or a state_dict saved with torch.save)")
    weights = ensure_weights(weights or root / "weights" / "seg.pt", backbone, log)
    workflow_spec = workflow_spec or root / "workflows" / "seg_jpeg.yaml"
    model_store.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="segserve-build-") as tmp:
        staging = Path(tmp)
        extra = stage_handler_package(root, staging)
        seg_config = write_model_config(
            root / "model_config" / "seg.yaml", staging / "seg.yaml", {"backbone": backbone, "num_classes": num_classes}
        )
        jpeg_config = write_model_config(root / "model_config" / "jpeg.yaml", staging / "jpeg.yaml", {})
        built = [
            archive_model("seg", root / "handlers" / "segmentation", weights, seg_config, extra, model_store, log),
            archive_model("jpeg", root / "handlers" / "jpeg", None, jpeg_config, extra, model_store, log),
            archive_workflow(workflow_spec, model_store, log),
        ]
        fused_config = write_model_config(root / "model_config" / "seg_jpeg_fused.yaml", staging / "seg_jpeg_fused.yaml", {})
        fused_extra = stage_fused_extras(extra, workflow_spec, seg_config, jpeg_config)
        built.append(archive_model("seg_jpeg_fused", root / "handlers" / "pipeline", weights, fused_config, fused_extra, model_store, log))
    for path in built:
        log(f"built {path} ({path.stat().st_size / 1e6:.1f} MB)")
    return built
