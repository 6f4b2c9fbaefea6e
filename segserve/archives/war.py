"""A user's workflow archive (.war) read once, as TorchServe 0.12 reads it: fuse, members, foreign targets, the
import checks, the autoscaler and the DAG requests all take what `read_war` gives.

- WAR-INF/MANIFEST.json (WorkflowArchive.java): `workflowName`, `specFile`, `handler` (the function file).
- The spec's `models:` (WorkFlow.java): six settings at its top level and per model node. A model node takes its own
  value of each, else the top-level value as read *so far* (a default written below a node does not reach it). A
  node of the dag without a `models:` entry is a function of the handler file, registered with 1 worker, batch size
  1, delay 0 and the workflow's *last* retry-attempts and timeout-ms: the only way to set a function node's timeout.
- The dag (Dag.java): exactly one start node ("DAG should have only one start node"), no self loop ("Self loop
  exception"), no edge listed twice ("loop exception"), no cycle ("Not a valid DAG"); a blank child is skipped.
- `order` is Kahn's order with ties in the spec's order (the order nodes are first named in the dag). TorchServe
  itself runs every node whose parents answered at once, in whatever order they finish: its order is a race, and a
  join's parents arrive in completion order. Ours is one fixed order of the many it may take.
- Function names as TorchServe's loader finds them (ts/model_loader.py: `hasattr(module, name)` on the imported
  file, whatever bound it): asked of the module in a probe process (handler_check.function_names), or, for a file that cannot
  import yet (its requirements not installed), read from its source, tuple targets included.
"""

import ast
import difflib
import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from segserve.archives.archive_urls import safe_relative_name
from segserve.errors import UsageError

WAR_MANIFEST = "WAR-INF/MANIFEST.json"
MAR_MANIFEST = "MAR-INF/MANIFEST.json"
# The spec's settings with WorkFlow.java's defaults, for every node or one model node.
DEFAULTS = {"min-workers": 1, "max-workers": 1, "batch-size": 1, "max-batch-delay": 50, "retry-attempts": 1, "timeout-ms": 10000}
FUNCTION_NODE = {"min-workers": 1, "max-workers": 1, "batch-size": 1, "max-batch-delay": 0}  # the rest: the workflow's


class NotAWorkflowArchive(UsageError):
    """Not a zip with a workflow manifest and a spec: for TorchServe to refuse where a suite registers it as it is."""


@dataclass(frozen=True)
class WarNode:
    name: str
    url: str | None  # a model node's .mar as the spec names it; None for a function of the handler file
    settings: dict  # the six settings (DEFAULTS' keys) as TorchServe registers the node

    @property
    def is_function(self) -> bool:
        return self.url is None


@dataclass(frozen=True)
class Dag:
    order: list[str]  # parents before children: Kahn's order, ties in the spec's order
    parents: dict[str, list[str]]  # node → its parents in `order`'s order
    children: dict[str, list[str]]  # node → its children in the spec's order


def read_dag(dag: dict, where: str) -> Dag:
    """A spec's `dag:` mapping checked as Dag.java checks it (a UsageError naming `where` and the node), ordered."""
    children = _children(where, dag)
    order = _order(where, children)
    return Dag(order, {node: [p for p in order if node in children[p]] for node in order}, children)


@dataclass(frozen=True)
class WarSpec:
    path: Path  # the .war
    name: str  # its workflowName (the file's stem when the manifest has none)
    spec_file: str
    spec: dict  # the spec as read (a copy is what an override writes: foreign.py)
    functions_file: str | None  # the manifest's handler, where function nodes live
    nodes: dict[str, WarNode]  # every node of the dag, in `order`
    parents: dict[str, list[str]]  # node → its parents in `order`'s order
    children: dict[str, list[str]]  # node → its children in the spec's order
    order: list[str]
    workflow_settings: dict  # the top-level values, as a function node gets them (the last of each)
    unused_models: dict[str, str]  # models: entries the dag never names → their url (sent nothing)

    @property
    def models(self) -> dict[str, str]:
        """Model node → the .mar its url names, in `order`."""
        return {name: node.url for name, node in self.nodes.items() if not node.is_function}

    @property
    def functions(self) -> list[str]:
        return [name for name, node in self.nodes.items() if node.is_function]

    @property
    def start(self) -> str:
        return self.order[0]

    @property
    def leaves(self) -> list[str]:
        return [node for node in self.order if not self.children[node]]

    def functions_source(self) -> bytes | None:
        if not self.functions_file:
            return None
        with zipfile.ZipFile(self.path) as war:
            return war.read(self.functions_file) if self.functions_file in war.namelist() else None


def read_war(path: Path, where: str | None = None) -> WarSpec:
    """The .war's manifest, spec and dag, checked as TorchServe checks them: a UsageError naming the file (`where`,
    by default its path) and the node for what it would refuse. Nothing is imported; function names are
    `check_functions`' business."""
    return war_of(*open_war(path, where), where)


def open_war(path: Path, where: str | None = None) -> tuple[Path, str, str, object, str | None]:
    """(path, workflowName, specFile, the spec as read, the manifest's handler) of a .war; NotAWorkflowArchive for a
    file that is not one (no zip, no manifest, no spec)."""
    where = where or str(path)
    if not path.is_file():
        raise NotAWorkflowArchive(f"{where}: no such file")
    try:
        with zipfile.ZipFile(path) as archive:
            manifest = json.loads(archive.read(WAR_MANIFEST))["workflow"]
            spec_file = manifest["specFile"]
            spec = yaml.safe_load(io.BytesIO(archive.read(spec_file)))
    except (zipfile.BadZipFile, KeyError, TypeError, ValueError, yaml.YAMLError) as error:
        raise NotAWorkflowArchive(f"{where}: not a workflow archive with a spec ({type(error).__name__}: {error})") from None
    handler = manifest.get("handler") if isinstance(manifest.get("handler"), str) and manifest.get("handler") else None
    return path, str(manifest.get("workflowName") or path.stem), spec_file, spec, handler


def war_of(path: Path, name: str, spec_file: str, spec, functions_file: str | None, where: str | None = None) -> WarSpec:
    """read_war's checks and reading of a spec already read from the .war at `path` (messages start with `where`)."""
    where = where or str(path)
    if not isinstance(spec, dict) or not isinstance(spec.get("dag"), dict) or not spec["dag"]:
        raise NotAWorkflowArchive(f"{where}: its spec {spec_file} has no dag: mapping")
    models = spec.get("models") or {}
    if not isinstance(models, dict):
        raise UsageError(f"{where}: its spec {spec_file}: models: is not a mapping")
    refuse_names_that_leave(spec, functions_file, where)  # first: whatever else is wrong
    entries, top = _settings(where, models)
    dag = read_dag(spec["dag"], where)
    nodes = {}
    for node in dag.order:
        if node in DEFAULTS:
            raise UsageError(f"{where}: node {node}: a node cannot be named as a setting of models:")
        if node in entries:
            url, settings = entries[node]
            nodes[node] = WarNode(node, url, settings)
        else:
            nodes[node] = WarNode(node, None, {**top, **FUNCTION_NODE})
    if any(n.is_function for n in nodes.values()) and functions_file is None:
        missing = next(n for n in dag.order if nodes[n].is_function)
        meant = _meant(missing, entries, dag.order)
        raise UsageError(
            f"{where}: node {missing} has no models: entry{meant} and the archive has no handler file for a function {missing}"
        )
    unused = {m: url for m, (url, _) in entries.items() if m not in nodes}
    return WarSpec(path, name, spec_file, spec, functions_file, nodes, dag.parents, dag.children, dag.order, top, unused)


def refuse_names_that_leave(spec, functions_file: str | None, where: str) -> None:
    """A node url that would leave the model store, or a handler file that would leave the .war: a UsageError naming
    it (each becomes a path whose code is imported and run; ModelArchive.java refuses `..` too)."""
    models = spec.get("models") if isinstance(spec, dict) else None
    for node, entry in models.items() if isinstance(models, dict) else ():
        if node not in DEFAULTS and isinstance(entry, dict) and isinstance(entry.get("url"), str):
            safe_relative_name(entry["url"], f"{where}: models.{node}.url")
    if functions_file is not None:
        safe_relative_name(functions_file, f"{where}: the manifest's handler")


def check_functions(war: WarSpec, names: set[str] | None, where: str | None = None) -> None:
    """Every function node of the dag a name the handler file binds (`names`: handler_check.function_names'); a misspelling is
    named with the name it meant (`dag: names detial; models: has detail`)."""
    entries = {m: None for m in war.unused_models}
    for node in war.functions:
        if names is not None and node in names:
            continue
        meant = _meant(node, entries, war.order) or _meant(node, dict.fromkeys(names or ()), war.order, "its handler file has")
        raise UsageError(
            f"{where or war.path}: node {node} of the dag is neither a model of models: nor a function of "
            f"{war.functions_file}{meant}: TorchServe could not run it"
        )


def _meant(node: str, candidates: dict, order: list[str], has: str = "models: has") -> str:
    close = difflib.get_close_matches(node, [c for c in candidates if c not in order], n=1, cutoff=0.75)
    return f" (dag: names {node}; {has} {close[0]})" if close else ""


def _settings(where: str, models: dict) -> tuple[dict[str, tuple[str, dict]], dict]:
    """model node → (its url, its settings), and the top-level values as the workflow ends with them."""
    top, entries = dict(DEFAULTS), {}
    for key, value in models.items():
        key = str(key)
        if key in DEFAULTS:
            top[key] = _count(where, f"models.{key}", value)
            continue
        if not isinstance(value, dict):
            raise UsageError(f"{where}: node {key}: its models: entry is not a mapping with a url")
        url = value.get("url")
        if not isinstance(url, str) or not url:
            raise UsageError(f"{where}: node {key}: models.{key}.url {url!r} is not a .mar name or URL")
        settings = {s: _count(where, f"models.{key}.{s}", value.get(s, top[s])) for s in DEFAULTS}
        entries[key] = (url, settings)
    return entries, top


def _count(where: str, field: str, value) -> int:
    # WorkFlow.java casts each value to int: anything else fails the registration with a ClassCastException
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise UsageError(f"{where}: {field}: a whole number of 0 or more (got {value!r})")
    return value


def _children(where: str, dag: dict) -> dict[str, list[str]]:
    """node → its children, every node a key, in the spec's order; with exactly one start node."""
    children: dict[str, list[str]] = {}
    for node, kids in dag.items():
        node = str(node)
        children.setdefault(node, [])
        if kids is not None and not isinstance(kids, list):
            raise UsageError(f"{where}: node {node}: its children are not a list (got {kids!r})")
        for kid in kids or []:
            if not isinstance(kid, str) or not kid.strip():
                continue  # WorkFlow.java skips blank names
            if kid == node:
                raise UsageError(f"{where}: node {node}: a self loop (TorchServe: Self loop exception)")
            if kid in children[node]:
                raise UsageError(f"{where}: node {node}: lists its child {kid} twice (TorchServe: loop exception)")
            children[node].append(kid)
            children.setdefault(kid, [])
    starts = [node for node in children if all(node not in kids for kids in children.values())]
    if len(starts) != 1:
        named = ", ".join(starts) or "none: a cycle"
        raise UsageError(f"{where}: the dag has {len(starts)} start nodes ({named}) (TorchServe: DAG should have only one start node)")
    return children


def _order(where: str, children: dict[str, list[str]]) -> list[str]:
    """Parents before children (Kahn's order), ties in the spec's order; what no order reaches is on or after a cycle."""
    spec_order = list(children)
    waiting = {node: sum(node in kids for kids in children.values()) for node in children}
    order, ready = [], [node for node in spec_order if waiting[node] == 0]
    while ready:
        node = ready.pop(0)
        order.append(node)
        for kid in children[node]:
            waiting[kid] -= 1
            if waiting[kid] == 0:
                ready.append(kid)
        ready.sort(key=spec_order.index)
    if len(order) < len(children):
        cycle = _a_cycle(children, [n for n in spec_order if n not in order])
        raise UsageError(f"{where}: node {cycle[0]}: a cycle ({' → '.join([*cycle, cycle[0]])}) (TorchServe: Not a valid DAG)")
    return order


def _a_cycle(children: dict[str, list[str]], unordered: list[str]) -> list[str]:
    """One cycle among the nodes Kahn's order could not reach (every one of them has a parent among them)."""
    parents = {n: [p for p in unordered if n in children[p]] for n in unordered}
    path, node = [], unordered[0]
    while node not in path:
        path.append(node)
        node = parents[node][0]
    cycle = path[path.index(node) :][::-1]  # walked child → parent: reversed, it reads along the edges
    first = min(cycle, key=unordered.index)
    return cycle[cycle.index(first) :] + cycle[: cycle.index(first)]


def source_names(source: bytes, filename: str = "<handler file>") -> set[str]:
    """The names a module's source binds at its top level, read, not imported: defs, classes, imports and assignment
    targets, tuple and starred targets included (`pre, post = make()`). A SyntaxError is the caller's to word."""
    names = set()
    for statement in ast.parse(source, filename).body:
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(statement.name)
        elif isinstance(statement, ast.Import | ast.ImportFrom):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in statement.names}
        elif isinstance(statement, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names
