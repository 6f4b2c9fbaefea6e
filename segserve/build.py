"""Build the archives: weights (trained if missing), the node models (seg, jpeg, jpeg_json, areas),
each workflow's .war (seg_jpeg, seg_fanout) and its fused twin (<workflow>_fused.mar).

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

# Node model archives: name → handler module. Each takes its config from model_config/<name>.yaml.
NODE_ARCHIVES = {"seg": "segmentation", "jpeg": "jpeg", "jpeg_json": "jpeg", "areas": "areas"}
WORKFLOWS = ("seg_jpeg", "seg_fanout")  # workflows/<name>.yaml; the fused twin: model_config/<name>_fused.yaml


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


def stage_fused_extras(extra: Path, spec: Path, node_configs: dict[str, Path]) -> Path:
    """What a fused archive carries beside the handlers: the DAG spec and the config of each node archive."""
    (extra / "nodes").mkdir(parents=True, exist_ok=True)
    for model in yaml.safe_load(spec.read_text())["models"].values():
        if isinstance(model, dict) and "url" in model:
            stem = Path(model["url"]).stem
            shutil.copy2(node_configs[stem], extra / "nodes" / f"{stem}.yaml")
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
    root: Path, model_store: Path, weights: Path | None = None, backbone: str | None = None, num_classes: int | None = None, log=print
) -> list[Path]:
    """Build every archive into model_store; return their paths."""
    root = root.resolve()
    if weights is not None and not weights.exists():
        raise UsageError(f"--weights {weights}: no such file (give a TorchScript file or a state_dict saved with torch.save)")
    weights = ensure_weights(weights or root / "weights" / "seg.pt", backbone, log)
    model_store.mkdir(parents=True, exist_ok=True)
    built = []
    with tempfile.TemporaryDirectory(prefix="segserve-build-") as tmp:
        staging = Path(tmp)
        extra = stage_handler_package(root, staging)
        seg_overrides = {"backbone": backbone, "num_classes": num_classes}
        node_configs = {
            name: write_model_config(
                root / "model_config" / f"{name}.yaml", staging / f"{name}.yaml", seg_overrides if name == "seg" else {}
            )
            for name in NODE_ARCHIVES
        }
        for name, module in NODE_ARCHIVES.items():
            serialized = weights if name == "seg" else None
            built.append(archive_model(name, root / "handlers" / module, serialized, node_configs[name], extra, model_store, log))
        for workflow in WORKFLOWS:
            spec = root / "workflows" / f"{workflow}.yaml"
            built.append(archive_workflow(spec, model_store, log))
            fused_config = write_model_config(root / "model_config" / f"{workflow}_fused.yaml", staging / f"{workflow}_fused.yaml", {})
            fused_extra = stage_fused_extras(staging / f"extra_{workflow}", spec, node_configs)
            shutil.copytree(extra / "handlers", fused_extra / "handlers")
            pipeline = root / "handlers" / "pipeline"
            built.append(archive_model(f"{workflow}_fused", pipeline, weights, fused_config, fused_extra, model_store, log))
    for path in built:
        log(f"built {path} ({path.stat().st_size / 1e6:.1f} MB)")
    return built
