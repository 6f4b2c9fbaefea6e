"""What can be built, served and measured, read from the project's YAML: one catalog for every command.

    model_config/<model>.yaml      a node model (its `segserve:` key: handler module, weights, takes, gives)
    workflows/<dag>.yaml           a DAG of node models → <dag>.war, served at /wfpredict/<dag>
    model_config/<dag>_fused.yaml  its fused twin → <dag>_fused.mar (optional: a default is written)

Targets: every node model (`/predictions/<model>`), every DAG as a workflow and as its fused twin.
Adding a DAG is adding its YAML; a broken one is refused here, naming the file and the node, before
anything is built or started.
"""

import difflib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import ClassVar

import yaml

from handlers.dag import parse_dag
from segserve.archives.registration import WORKFLOW_MODEL_KEYS
from segserve.errors import UsageError

BODY_KINDS = ("image", "class_map", "jpeg", "json")  # what a node takes or gives
FUSED_SUFFIX = "_fused"


@dataclass(frozen=True)
class NodeModel:
    """A model archive segserve builds from model_config/<name>.yaml."""

    name: str
    config: Path
    handler: str  # module in handlers/
    weights: bool  # the archive carries the model weights (--serialized-file)
    takes: str
    gives: str


@dataclass(frozen=True)
class Node:
    name: str  # the node's name in its DAG (a model target's only node has the model's name)
    model: NodeModel


@dataclass(frozen=True)
class Target:
    """Something TorchServe serves: its nodes and what its kind means there. One class per kind (ModelTarget,
    WorkflowTarget, FusedTarget): code elsewhere asks a target, it never compares a kind's name."""

    name: str
    nodes: tuple[Node, ...]  # in DAG order, the root first
    dag: str | None = None  # the workflow YAML's stem (workflow and fused targets)
    leaves: tuple[str, ...] = ()
    kind: ClassVar[str] = ""  # its label, in records and messages
    is_model: ClassVar[bool] = False  # one model alone
    is_workflow: ClassVar[bool] = False  # a TorchServe workflow: each node a model of its own, behind the frontend
    is_fused: ClassVar[bool] = False  # a DAG run in one worker (one batch, one set of stage threads)
    management: ClassVar[str] = "models"  # its management API collection: /models or /workflows
    best_rank: ClassVar[int] = 2  # which suite winner best/ describes: a workflow's (0), a fused twin's (1), a model's

    @property
    def archive(self) -> str:
        """The file in the model store that registers it."""
        return f"{self.name}.mar"

    @property
    def endpoint(self) -> str:
        return f"/predictions/{self.name}"

    def registered(self, node: str) -> str:
        """The TorchServe model that runs a node."""
        return self.name

    @property
    def models(self) -> tuple[str, ...]:
        """The TorchServe models it registers (for metrics, scaling, readiness)."""
        return tuple(dict.fromkeys(self.registered(n.name) for n in self.nodes))

    @property
    def takes(self) -> str:
        return self.nodes[0].model.takes

    @property
    def gives(self) -> str:
        if len(self.leaves) > 1:
            return "json"
        return next(n.model.gives for n in self.nodes if n.name == self.leaves[0])

    @property
    def members(self) -> tuple[str, ...]:
        """The model targets its nodes run (a DAG's members, measured alone for the efficiency bounds)."""
        return tuple(dict.fromkeys(n.model.name for n in self.nodes))

    @property
    def handlers(self) -> set[str]:
        return {n.model.handler for n in self.nodes}

    @property
    def scaled_nodes(self) -> tuple[str, ...]:
        """What runtime worker counts are given for: each node (`<node>_workers`), or () for the one model."""
        return tuple(n.name for n in self.nodes)

    @property
    def weights_node(self) -> Node | None:
        """The node whose archive carries segserve's weights (seg), None for a target without one."""
        return next((n for n in self.nodes if n.model.weights), None)


@dataclass(frozen=True)
class ModelTarget(Target):
    kind: ClassVar[str] = "model"
    is_model: ClassVar[bool] = True


@dataclass(frozen=True)
class WorkflowTarget(Target):
    kind: ClassVar[str] = "workflow"
    is_workflow: ClassVar[bool] = True
    management: ClassVar[str] = "workflows"
    best_rank: ClassVar[int] = 0

    @property
    def archive(self) -> str:
        return f"{self.name}.war"

    @property
    def endpoint(self) -> str:
        return f"/wfpredict/{self.name}"

    def registered(self, node: str) -> str:
        """Workflow nodes are registered as <workflow>__<node>."""
        return f"{self.name}__{node}"


@dataclass(frozen=True)
class FusedTarget(Target):
    kind: ClassVar[str] = "fused"
    is_fused: ClassVar[bool] = True
    best_rank: ClassVar[int] = 1

    @property
    def scaled_nodes(self) -> tuple[str, ...]:
        return ()  # one model: its `workers`


@dataclass(frozen=True)
class Dag:
    name: str
    spec_path: Path
    spec: dict
    nodes: dict[str, NodeModel]  # node name → its model

    @property
    def fused_config(self) -> Path:
        return self.spec_path.parent.parent / "model_config" / f"{self.name}{FUSED_SUFFIX}.yaml"


class Catalog:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.models = {path.stem: _node_model(path) for path in self._model_configs()}
        self.dags = {path.stem: _dag(self.root, path, self.models) for path in sorted((self.root / "workflows").glob("*.yaml"))}
        self._check_names()
        self.foreign: dict = {}  # target name → a user's archive (add_foreign)
        for model in self.models.values():  # models no DAG uses (a DAG's own nodes were checked with its file)
            if not _handler_exists(self.root, model.handler):
                raise UsageError(f"{model.config}: segserve.handler {model.handler!r} does not exist (no handlers/{model.handler}.py)")

    def _check_names(self) -> None:
        """A model config and a DAG (or its fused twin) would both be the target of one name."""
        for dag in self.dags:
            for name in (dag, dag + FUSED_SUFFIX):
                if name in self.models:
                    raise UsageError(f"{self.models[name].config}: {name!r} is also the target of workflows/{dag}.yaml: rename one")

    def _model_configs(self) -> list[Path]:
        paths = sorted((self.root / "model_config").glob("*.yaml"))
        fused = {f"{name}{FUSED_SUFFIX}" for name in (p.stem for p in (self.root / "workflows").glob("*.yaml"))}
        return [p for p in paths if p.stem not in fused]

    @cached_property
    def targets(self) -> dict[str, Target]:
        """Image-taking models first, then the rest by name; then each DAG: its workflow, then its fused twin."""
        targets = {}
        for model in sorted(self.models.values(), key=lambda m: (m.takes != "image", m.name)):
            targets[model.name] = ModelTarget(model.name, (Node(model.name, model),), leaves=(model.name,))
        for dag in self.dags.values():
            order = parse_dag(dag.spec["dag"])
            nodes = tuple(Node(name, dag.nodes[name]) for name in order.order)
            targets[dag.name] = WorkflowTarget(dag.name, nodes, dag.name, tuple(order.leaves))
            fused = dag.name + FUSED_SUFFIX
            targets[fused] = FusedTarget(fused, nodes, dag.name, tuple(order.leaves))
        return targets

    @property
    def config_template(self) -> Path:
        """The project's TorchServe config.properties; segserve's own where the folder has none (a user who
        benchmarks only archives of their own, from their folder)."""
        own = self.root / "config.properties"
        if own.is_file():
            return own
        from segserve import ROOT

        return ROOT / "config.properties"

    def add_foreign(self, archives: list) -> None:
        """A suite's archive targets (segserve/archives/foreign.py: ForeignArchive), as targets of this catalog."""
        for archive in archives:
            if self.foreign.get(archive.name) == archive:  # the same suite read again
                continue
            if archive.name in self.targets:
                raise UsageError(f"targets: {archive.name!r} is a catalog target: give the archive target another name")
            self.targets[archive.name] = archive.target()
            self.foreign[archive.name] = archive

    def target(self, name: str, what: str = "target") -> Target:
        if name not in self.targets:
            raise UsageError(unknown(what, name, self.targets))
        return self.targets[name]

    def family(self, dag: str) -> list[str]:
        """A DAG's member models, its workflow and its fused twin: what `segserve serve` registers by default."""
        workflow = self.target(dag, "workflow")
        return [*workflow.members, workflow.name, workflow.name + FUSED_SUFFIX]


def unknown(what: str, name: str, choices) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1)
    hint = f" — did you mean {close[0]!r}?" if close else ""
    return f"unknown {what} {name!r}{hint} (known: {', '.join(choices)})"


def _read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise UsageError(f"{path}: not valid YAML: {str(error).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a mapping (got {type(data).__name__})")
    return data


def _handler_exists(root: Path, module: str) -> bool:
    return module.isidentifier() and (root / "handlers" / f"{module}.py").is_file()


def _node_model(path: Path) -> NodeModel:
    declared = _read_yaml(path).get("segserve")
    example = "segserve: {handler: segmentation, weights: true, takes: image, gives: class_map}"
    if not isinstance(declared, dict):
        raise UsageError(f"{path}: no `segserve:` mapping saying how to build it, e.g. `{example}`")
    extra = sorted(set(declared) - {"handler", "weights", "takes", "gives"})
    if extra:
        raise UsageError(f"{path}: segserve: unknown key(s) {extra} (known: handler, weights, takes, gives)")
    handler = declared.get("handler")
    if not isinstance(handler, str):
        raise UsageError(f"{path}: segserve.handler: give the module in handlers/, e.g. `handler: segmentation` (got {handler!r})")
    for key in ("takes", "gives"):
        if declared.get(key) not in BODY_KINDS:
            raise UsageError(f"{path}: segserve.{key} must be one of {', '.join(BODY_KINDS)} (got {declared.get(key)!r})")
    return NodeModel(path.stem, path, handler, bool(declared.get("weights", False)), declared["takes"], declared["gives"])


def _dag(root: Path, path: Path, models: dict[str, NodeModel]) -> Dag:
    spec = _read_yaml(path)
    if not isinstance(spec.get("models"), dict) or not isinstance(spec.get("dag"), dict):
        raise UsageError(f"{path}: a workflow spec has a `models:` mapping and a `dag:` mapping")
    entries = {name: entry for name, entry in spec["models"].items() if name not in WORKFLOW_MODEL_KEYS}
    nodes = {}
    for name, entry in entries.items():
        url = entry.get("url") if isinstance(entry, dict) else None
        if not isinstance(url, str) or not url.endswith(".mar"):
            raise UsageError(f"{path}: node {name!r}: needs `url: <model>.mar` (got {entry!r})")
        stem = Path(url).stem
        if stem not in models:
            raise UsageError(f"{path}: node {name!r}: no node config model_config/{stem}.yaml for {url}")
        if not _handler_exists(root, models[stem].handler):
            raise UsageError(
                f"{path}: node {name!r}: its handler {models[stem].handler!r} (model_config/{stem}.yaml) does not exist "
                f"(no handlers/{models[stem].handler}.py)"
            )
        nodes[name] = models[stem]
    try:
        order = parse_dag(spec["dag"])
    except ValueError as error:
        raise UsageError(f"{path}: dag: {error}") from None
    for name in order.order:
        if name not in nodes:
            raise UsageError(f"{path}: node {name!r} is in `dag:` but not in `models:`")
        for child in order.children.get(name, []):
            if child in nodes and nodes[child].takes != nodes[name].gives:
                raise UsageError(f"{path}: node {child!r} takes {nodes[child].takes} but its parent {name!r} gives {nodes[name].gives}")
    unused = sorted(set(nodes) - set(order.order))
    if unused:
        raise UsageError(f"{path}: node(s) {unused} are in `models:` but not in `dag:`")
    if len(order.leaves) > 1:
        not_json = [leaf for leaf in order.leaves if nodes[leaf].gives != "json"]
        if not_json:
            raise UsageError(
                f"{path}: node(s) {not_json}: a DAG with several leaves answers one JSON object of its leaves' JSON "
                "(TorchServe parses each leaf's answer as JSON): such leaves must give json"
            )
    return Dag(path.stem, path, spec, nodes)
