"""A user's workflow archive read for fusing: its spec, its DAG checked, each node's archive found.

Everything wrong with it is found here, before anything is written: one `UsageError` line naming the file and the
node. TorchServe 0.12 itself refuses a DAG with more than one start node, a self loop or a cycle (Dag.java); fusing
also refuses a join (fan-in), which TorchServe runs by handing the child one parameter per parent.
"""

import ast
import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from segserve.archives.foreign import WAR_MANIFEST
from segserve.archives.registration import WORKFLOW_MODEL_KEYS  # a spec's `models:` keys that are not nodes
from segserve.errors import UsageError

MAR_MANIFEST = "MAR-INF/MANIFEST.json"


@dataclass(frozen=True)
class Workflow:
    path: Path  # the .war
    name: str  # its workflowName
    children: dict[str, list[str]]  # node → its children, every node a key
    order: list[str]  # parents before children, the spec's order otherwise
    archives: dict[str, Path]  # model node → its .mar in the model store
    functions_file: str | None  # the .war's handler file, when a function node needs it
    functions_source: bytes | None

    @property
    def leaves(self) -> list[str]:
        return [node for node in self.order if not self.children[node]]

    def plan(self, folders: dict[str, str], functions_file: str | None) -> dict:
        """fused_workflow.json: what the fused handler reads (folders: model node → its folder in the .mar)."""
        nodes = {n: {"kind": "model", "folder": folders[n]} if n in self.archives else {"kind": "function"} for n in self.order}
        return {
            "workflow": self.name,
            "order": self.order,
            "children": self.children,
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
    return Workflow(war, str(manifest.get("workflowName") or war.stem), children, order, archives, functions, functions_source)


def _children(where: str, dag: dict) -> dict[str, list[str]]:
    children: dict[str, list[str]] = {}
    for node, kids in dag.items():
        kids = [k for k in (kids or []) if isinstance(k, str) and k.strip()]  # WorkFlow.java skips blank names
        children.setdefault(str(node), [])
        for kid in kids:
            if kid == node:
                raise UsageError(f"{where}: node {node}: a self loop")
            children[str(node)].append(kid)
            children.setdefault(kid, [])
    parents: dict[str, list[str]] = {}
    for node, kids in children.items():
        for kid in kids:
            parents.setdefault(kid, []).append(node)
    for node, its_parents in parents.items():
        if len(its_parents) > 1:
            raise UsageError(
                f"{where}: node {node} joins {', '.join(its_parents)}: segserve fuse does not fuse a join (fan-in) yet; "
                "only DAGs where every node has one parent"
            )
    starts = [node for node in children if node not in parents]
    if len(starts) != 1:
        raise UsageError(f"{where}: the DAG has {len(starts)} start nodes ({', '.join(starts) or 'none: a cycle'}); TorchServe accepts one")
    return children


def _order(where: str, children: dict[str, list[str]]) -> list[str]:
    """Parents before children, from the one start node (with one parent each, a node not reached is on a cycle)."""
    start = next(n for n in children if all(n not in kids for kids in children.values()))
    order, waiting = [], [start]
    while waiting:
        node = waiting.pop(0)
        order.append(node)
        waiting += children[node]
    cycle = [node for node in children if node not in order]
    if cycle:
        raise UsageError(f"{where}: node {cycle[0]}: a cycle ({' → '.join([*cycle, cycle[0]])})")
    return order


def _check_function(where: str, node: str, handler: str | None, source: bytes | None) -> None:
    """A node without a models: entry is a function of the .war's handler file (WorkFlow.java)."""
    if source is None:
        raise UsageError(f"{where}: node {node} has no models: entry and the archive has no handler file for a function {node}")
    try:
        tree = ast.parse(source)
    except SyntaxError as error:
        raise UsageError(f"{where}: node {node}: its handler file {handler} does not parse: {error}") from None
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if node not in defined:
        raise UsageError(f"{where}: node {node} has no models: entry and its handler file {handler} defines no function {node}")


def _node_archive(where: str, node: str, url, model_store: Path) -> Path:
    if not isinstance(url, str) or "://" in url:
        raise UsageError(f"{where}: node {node}: url {url!r} is not a .mar file name in the model store")
    path = model_store / url
    if not path.is_file():
        raise UsageError(f"{where}: node {node}: no {url} in {model_store}")
    try:
        with zipfile.ZipFile(path) as archive:
            manifest = json.loads(archive.read(MAR_MANIFEST))
    except (zipfile.BadZipFile, KeyError, ValueError) as error:
        raise UsageError(f"{where}: node {node}: {path} is not a model archive ({type(error).__name__}: {error})") from None
    runtime = manifest.get("runtime", "python")
    if runtime not in ("python", "python3") or not (manifest.get("model") or {}).get("handler"):
        raise UsageError(f"{where}: node {node}: {path} is not a Python model archive with a handler (runtime {runtime})")
    return path
