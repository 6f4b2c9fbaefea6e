"""A user's workflow archive read for fusing: its spec, its DAG checked and ordered, each node's archive found.

Everything wrong with it is found here, before anything is written: one `UsageError` line naming the file and the
node. What TorchServe 0.12 itself refuses is refused here too (Dag.java: more than one start node, a self loop, an
edge listed twice, a cycle; ModelArchive.java: a url with `..`); so is what would reach outside the model store.
"""

import ast
import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import yaml

from segserve.archives.archive_urls import safe_relative_name
from segserve.archives.foreign import WAR_MANIFEST
from segserve.archives.registration import WORKFLOW_MODEL_KEYS  # a spec's `models:` keys that are not nodes
from segserve.errors import UsageError

MAR_MANIFEST = "MAR-INF/MANIFEST.json"
RETRY_ATTEMPTS = 1  # WorkFlow.java's default retry-attempts
ROW_ERRORS = ("workflow", "node")  # what a row refused or failed by a node is answered (docs/fuse.md)


@dataclass(frozen=True)
class Workflow:
    path: Path  # the .war
    name: str  # its workflowName
    parents: dict[str, list[str]]  # node → its parents in `order`'s order, every node a key
    order: list[str]  # parents before children, the spec's order otherwise
    archives: dict[str, Path]  # model node → its .mar in the model store
    retry_attempts: dict[str, int]  # node → how often TorchServe sends a request again after a failed batch
    functions_file: str | None  # the .war's handler file, when a function node needs it
    functions_source: bytes | None

    @property
    def leaves(self) -> list[str]:
        has_children = {p for ps in self.parents.values() for p in ps}
        return [node for node in self.order if node not in has_children]

    def plan(self, folders: dict[str, str], functions_file: str | None, row_errors: str = "workflow") -> dict:
        """fused_workflow.json: what the fused handler reads (folders: model node → its folder in the .mar)."""
        nodes = {}
        for n in self.order:
            nodes[n] = {"kind": "model", "folder": folders[n]} if n in self.archives else {"kind": "function"}
            nodes[n]["retry_attempts"] = self.retry_attempts[n]
        return {
            "workflow": self.name,
            "row_errors": row_errors,
            "order": self.order,
            "parents": self.parents,
            "leaves": self.leaves,
            "nodes": nodes,
            "functions_file": functions_file,
        }


def read_workflow(war: Path, model_store: Path) -> Workflow:
    where = str(war)
    if not war.is_file():
        raise UsageError(f"{where}: no such file")
    try:
        with zipfile.ZipFile(war) as archive:
            manifest = json.loads(archive.read(WAR_MANIFEST))["workflow"]
            spec = yaml.safe_load(io.BytesIO(archive.read(manifest["specFile"])))
            handler = manifest.get("handler")
            functions_source = archive.read(handler) if handler and handler in archive.namelist() else None
    except (zipfile.BadZipFile, KeyError, TypeError, ValueError, yaml.YAMLError) as error:
        raise UsageError(f"{where}: not a workflow archive with a spec ({type(error).__name__}: {error})") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("dag"), dict) or not spec["dag"]:
        raise UsageError(f"{where}: its spec {manifest['specFile']} has no dag: mapping")
    models = spec.get("models") or {}
    children = _children(where, spec["dag"])
    order = _order(where, children)
    parents = {node: [p for p in order if node in children[p]] for node in order}
    archives = {}
    for node in order:
        entry = models.get(node)
        if node in WORKFLOW_MODEL_KEYS or (entry is not None and not isinstance(entry, dict)):
            raise UsageError(f"{where}: node {node}: its models: entry is not a mapping with a url")
        if entry is None:
            _check_function(where, node, handler, functions_source)
            continue
        archives[node] = _node_archive(where, node, entry.get("url"), model_store)
    functions = handler if len(archives) < len(order) else None
    if functions:
        safe_relative_name(functions, f"{where}: its handler file")  # it becomes a path in the fused .mar
    name = str(manifest.get("workflowName") or war.stem)
    retries = _retry_attempts(where, models, order)
    return Workflow(war, name, parents, order, archives, retries, functions, functions_source)


def _children(where: str, dag: dict) -> dict[str, list[str]]:
    """node → its children, every node a key, in the spec's order; with exactly one start node."""
    children: dict[str, list[str]] = {}
    for node, kids in dag.items():
        node = str(node)
        children.setdefault(node, [])
        for kid in kids or []:
            if not isinstance(kid, str) or not kid.strip():
                continue  # WorkFlow.java skips blank names
            if kid == node:
                raise UsageError(f"{where}: node {node}: a self loop")
            if kid in children[node]:  # Dag.addEdge refuses it ("loop exception")
                raise UsageError(f"{where}: node {node}: lists its child {kid} twice; TorchServe refuses that")
            children[node].append(kid)
            children.setdefault(kid, [])
    starts = [node for node in children if all(node not in kids for kids in children.values())]
    if len(starts) != 1:
        raise UsageError(f"{where}: the DAG has {len(starts)} start nodes ({', '.join(starts) or 'none: a cycle'}); TorchServe accepts one")
    return children


def _order(where: str, children: dict[str, list[str]]) -> list[str]:
    """Parents before children (Kahn's order), ties in the spec's order; what no order reaches is on or after a cycle."""
    waiting_parents = {node: sum(node in kids for kids in children.values()) for node in children}
    order = []
    ready = [node for node, count in waiting_parents.items() if count == 0]
    while ready:
        node = ready.pop(0)
        order.append(node)
        for kid in children[node]:
            waiting_parents[kid] -= 1
            if waiting_parents[kid] == 0:
                ready.append(kid)
        ready.sort(key=list(children).index)
    if len(order) < len(children):
        cycle = _a_cycle(children, [n for n in children if n not in order])
        raise UsageError(f"{where}: node {cycle[0]}: a cycle ({' → '.join([*cycle, cycle[0]])})")
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


def _retry_attempts(where: str, models: dict, order: list[str]) -> dict[str, int]:
    """Each node's retry-attempts as WorkFlow.java reads them: a model node's own, else the workflow's value as read
    *so far* in the models: mapping (a default written below a node does not reach it); a function node, the
    workflow's last value."""
    default, retries = RETRY_ATTEMPTS, {}
    for key, value in models.items():
        if key == "retry-attempts":
            default = _count(where, "models.retry-attempts", value)
        elif isinstance(value, dict):
            retries[key] = _count(where, f"models.{key}.retry-attempts", value.get("retry-attempts", default))
    return {node: retries.get(node, default) for node in order}


def _count(where: str, field: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise UsageError(f"{where}: {field}: a whole number of 0 or more (got {value!r})")
    return value


def _check_function(where: str, node: str, handler: str | None, source: bytes | None) -> None:
    """A node without a models: entry is a function of the .war's handler file (WorkFlow.java): a name the file binds
    at its top level (a def, an assignment or an import: ts/model_loader.py looks it up with hasattr)."""
    if source is None:
        raise UsageError(f"{where}: node {node} has no models: entry and the archive has no handler file for a function {node}")
    try:
        tree = ast.parse(source)
    except SyntaxError as error:
        raise UsageError(f"{where}: node {node}: its handler file {handler} does not parse: {error}") from None
    if node not in _top_level_names(tree):
        raise UsageError(f"{where}: node {node} has no models: entry and its handler file {handler} defines no function {node}")


def _top_level_names(tree: ast.Module) -> set[str]:
    names = set()
    for statement in tree.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(statement.name)
        elif isinstance(statement, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in statement.names}
        elif isinstance(statement, (ast.Assign, ast.AnnAssign)):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def _node_archive(where: str, node: str, url, model_store: Path) -> Path:
    if not isinstance(url, str) or "://" in url:
        raise UsageError(f"{where}: node {node}: url {url!r} is not a .mar file name in the model store")
    safe_relative_name(url, f"{where}: node {node}: url")  # TorchServe refuses `..` too (ModelArchive.java)
    path = model_store / PurePosixPath(url).name  # TorchServe looks for the url's file name in its store
    if not path.is_file():
        raise UsageError(f"{where}: node {node}: no {path.name} in {model_store}")
    try:
        with zipfile.ZipFile(path) as archive:
            manifest = json.loads(archive.read(MAR_MANIFEST))
    except (zipfile.BadZipFile, KeyError, ValueError) as error:
        raise UsageError(f"{where}: node {node}: {path} is not a model archive ({type(error).__name__}: {error})") from None
    runtime = manifest.get("runtime", "python")
    if runtime not in ("python", "python3") or not (manifest.get("model") or {}).get("handler"):
        raise UsageError(f"{where}: node {node}: {path} is not a Python model archive with a handler (runtime {runtime})")
    return path
