"""Build the archives of the catalog (segserve/archives/catalog.py): weights (trained if missing), every node model
(model_config/*.yaml), each workflow's .war (workflows/*.yaml) and its fused twin (<workflow>_fused.mar).

Runs the real torch-model-archiver / torch-workflow-archiver and prints each command, so a user can run
the same steps by hand. The bench builds its per-point archives with the same `Recipe`, with the
handler settings and registration values of the point.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from segserve.archives.catalog import Catalog, Dag, NodeModel, Target
from segserve.archives.registration import model_config_entry, write_models
from segserve.errors import RuntimeFailure, UsageError

# A worker that compiles its network (optimize compile/int8/ipex) takes tens of seconds to load on 2 cores:
# TorchServe's startupTimeout (default 120 s) must not cut it off.
COMPILED_STARTUP_TIMEOUT_S = 600

# torch-workflow-archiver requires a handler file; a DAG of model nodes needs nothing in it.
WORKFLOW_HANDLER_TEXT = '''"""Workflow handler of {name}.war (written by segserve build): model nodes only. A function node would
run in the frontend's single workflow worker, without batching."""
'''


def tool(name: str) -> str:
    """A console script from this Python's environment, falling back to PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if not found:
        raise RuntimeFailure(f"{name} is not installed: run `make setup` (or pip install -e .)")
    return found


def run_tool(command: list[str], log=print) -> None:
    log("$ " + " ".join(command))
    # The archivers stage files in $TMPDIR/<model or workflow name>, removed first: two builds of the same
    # name at once (two bench processes sharing a study) delete each other's files. Each run gets its own.
    with tempfile.TemporaryDirectory(prefix="segserve-archiver-") as private_tmp:
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "TMPDIR": private_tmp})
    if done.returncode != 0:
        raise RuntimeFailure(f"{Path(command[0]).name} failed ({done.returncode}): {(done.stderr or done.stdout).strip()[-2000:]}")


def stage_handler_package(root: Path, staging: Path) -> Path:
    """A folder whose only entry is the handlers/ package: --extra-files copies it into the archive root."""
    package = staging / "extra" / "handlers"
    package.mkdir(parents=True)
    for source in sorted((root / "handlers").glob("*.py")):
        shutil.copy2(source, package / source.name)
    return package.parent


def write_model_config(source: Path, target: Path, handler_overrides: dict, registration: dict | None = None) -> Path:
    """A model config from `source` with some `handler:` values (and TorchServe registration keys, archives/registration.py) replaced."""
    config = yaml.safe_load(source.read_text()) or {}
    config.update(registration or {})
    config.setdefault("handler", {}).update({k: v for k, v in handler_overrides.items() if v is not None})
    target.write_text(yaml.safe_dump(config, sort_keys=False))
    return target


def default_fused_config(dag: Dag) -> dict:
    """The fused twin's config when model_config/<dag>_fused.yaml is not there: the spec, one worker."""
    handler = {"spec": dag.spec_path.name}
    registration = model_config_entry({"batch_size": 8, "max_batch_delay_ms": 5, "response_timeout": 120}, workers=1)
    return {**registration, "handler": handler}


def node_handler_settings(model: NodeModel, settings: dict) -> dict:
    """A node's `handler:` settings: its model config's, with these values over them."""
    return {**(yaml.safe_load(model.config.read_text()) or {}).get("handler", {}), **settings}


def compile_registration(model: NodeModel, settings: dict) -> dict:
    """TorchServe keys a node's archive needs for its optimisation: a longer startupTimeout when it compiles."""
    compiles = node_handler_settings(model, settings).get("optimize", "eager") != "eager"
    return {"startupTimeout": COMPILED_STARTUP_TIMEOUT_S} if compiles else {}


def archive_model(name: str, handler: Path, serialized_file: Path | None, config: Path, extra: Path, model_store: Path, log=print) -> Path:
    command = [tool("torch-model-archiver"), "--model-name", name, "--version", "1.0", "--handler", f"{handler}:handle"]
    if serialized_file is not None:
        command += ["--serialized-file", str(serialized_file)]
    command += ["--config-file", str(config), "--extra-files", str(extra), "--export-path", str(model_store), "--force"]
    run_tool(command, log)
    return model_store / f"{name}.mar"


def archive_workflow(name: str, spec: dict, handler: Path | None, model_store: Path, log=print) -> Path:
    """<name>.war from a spec (written beside a copy of the handler; a default handler when there is none)."""
    with tempfile.TemporaryDirectory(prefix="segserve-war-") as tmp:
        spec_path = Path(tmp) / f"{name}.yaml"
        spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
        handler_path = Path(tmp) / f"{name}_handler.py"
        handler_path.write_text(handler.read_text() if handler and handler.exists() else WORKFLOW_HANDLER_TEXT.format(name=name))
        command = [tool("torch-workflow-archiver"), "--workflow-name", name, "--spec-file", str(spec_path), "--handler", str(handler_path)]
        run_tool(command + ["--export-path", str(model_store), "--force"], log)
    return model_store / f"{name}.war"


class Recipe:
    """Archives of catalog targets with given settings, into one model store.

    node_settings: node name → `handler:` overrides of that node's model; stage_settings: overrides of the
    worker that runs the target's stages (a model's own worker, the fused twin's); registration: TorchServe
    keys of a model config (archives/registration.py) or, for a workflow, of its spec's `models:`."""

    def __init__(self, catalog: Catalog, weights: Path, model_store: Path, staging: Path, log=print):
        self.catalog, self.weights, self.store, self.staging, self.log = catalog, weights, model_store, staging, log
        self.extra = stage_handler_package(catalog.root, staging)

    def serialized_file(self, model: NodeModel, settings: dict) -> Path | None:
        """What the archive of a node carries: nothing, the weights, or (optimize int8) the program quantised
        from them, built once per recipe for each distinct network and input size."""
        if not model.weights:
            return None
        handler = node_handler_settings(model, settings)
        if handler.get("optimize", "eager") != "int8":
            return self.weights
        from segserve.model.quantize import int8_program  # torchao: only when an int8 archive is asked for

        return int8_program(self.weights, handler, self.staging / "int8", model.name, self.log)

    def node_archive(self, model: NodeModel, name: str, settings: dict, registration: dict | None = None) -> Path:
        registration = {**compile_registration(model, settings), **(registration or {})}
        config = write_model_config(model.config, self.staging / f"{name}.yaml", settings, registration)
        handler = self.catalog.root / "handlers" / model.handler
        return archive_model(name, handler, self.serialized_file(model, settings), config, self.extra, self.store, self.log)

    def fused_archive(self, dag: Dag, name: str, node_settings: dict, stage_settings: dict, registration: dict | None = None) -> Path:
        """The DAG in one worker: the handlers, the spec and each node's config (nodes/<model>.yaml) in one .mar."""
        extra = self.staging / f"extra-{name}"
        shutil.copytree(self.extra, extra)
        (extra / "nodes").mkdir()
        for node, model in dag.nodes.items():
            write_model_config(model.config, extra / "nodes" / f"{model.name}.yaml", node_settings.get(node, {}))
        shutil.copy2(dag.spec_path, extra / dag.spec_path.name)
        source = dag.fused_config
        if not source.exists():
            source = self.staging / f"{dag.name}-default-fused.yaml"
            source.write_text(yaml.safe_dump(default_fused_config(dag), sort_keys=False))
        compiled = [compile_registration(model, node_settings.get(node, {})) for node, model in dag.nodes.items()]
        registration = {k: v for entry in compiled for k, v in entry.items()} | (registration or {})
        config = write_model_config(source, self.staging / f"{name}.yaml", stage_settings, registration)
        carried = [self.serialized_file(model, node_settings.get(node, {})) for node, model in dag.nodes.items() if model.weights]
        handler = self.catalog.root / "handlers" / "pipeline"
        archive = archive_model(name, handler, next(iter(carried), None), config, extra, self.store, self.log)
        shutil.rmtree(extra)
        return archive

    def workflow_archive(self, dag: Dag, name: str, node_urls: dict[str, str], spec_models: dict | None = None) -> Path:
        """<name>.war: the DAG's spec with each node's url replaced and `models:` registration keys set,
        DAG-wide (a value) or per node (a mapping under the node's name)."""
        spec = yaml.safe_load(dag.spec_path.read_text())
        for node, url in node_urls.items():
            spec["models"][node]["url"] = url
        spec["models"] = write_models(spec["models"], spec_models or {})
        return archive_workflow(name, spec, dag.spec_path.with_name(f"{dag.name}_handler.py"), self.store, self.log)

    def target_archive(self, target: Target, node_settings: dict) -> Path:
        """The archive `segserve serve` registers for a target, under its catalog name (a workflow's .war
        points at its nodes' .mar files by their catalog names)."""
        if target.is_model:
            return self.node_archive(target.nodes[0].model, target.name, node_settings.get(target.name, {}))
        dag = self.catalog.dags[target.dag]
        if target.is_fused:
            return self.fused_archive(dag, target.name, node_settings, {})
        return self.workflow_archive(dag, target.name, {node.name: f"{node.model.name}.mar" for node in target.nodes})


def ensure_weights(weights: Path, backbone: str | None, log=print) -> Path:
    if weights.exists():
        log(f"using weights {weights}")
        return weights
    from segserve.model.train import TrainSettings, train  # imported here: training pulls in the data generator

    log(f"{weights} is missing: training on synthetic data (deterministic, a few minutes on 2 cores)")
    settings = TrainSettings(backbone=backbone) if backbone else TrainSettings()
    train(weights, settings, log=log)
    return weights


def build(
    root: Path, model_store: Path, weights: Path | None = None, backbone: str | None = None, num_classes: int | None = None, log=print
) -> list[Path]:
    """Build every archive of the catalog into model_store; return their paths."""
    root = root.resolve()
    catalog = Catalog(root)
    if weights is not None and not weights.exists():
        raise UsageError(f"--weights {weights}: no such file (give a TorchScript file or a state_dict saved with torch.save)")
    weights = ensure_weights(weights or root / "weights" / "seg.pt", backbone, log)
    model_store.mkdir(parents=True, exist_ok=True)
    # --backbone / --num-classes describe the weights: they go to every node that carries them.
    described = {"backbone": backbone, "num_classes": num_classes}
    node_settings = {node.name: described for t in catalog.targets.values() for node in t.nodes if node.model.weights}
    with tempfile.TemporaryDirectory(prefix="segserve-build-") as tmp:
        recipe = Recipe(catalog, weights, model_store, Path(tmp), log)
        built = [recipe.target_archive(target, node_settings) for target in catalog.targets.values()]
    for path in built:
        log(f"built {path} ({path.stat().st_size / 1e6:.1f} MB)")
    return built
