"""A workflow's DAG as TorchServe 0.12 reads it from a .war's spec: each node's parents, the order it runs its nodes
in (Dag.validate refuses a DAG without exactly one start node, or with a cycle), and the names its function file
defines (WorkFlow.java: a node that is not a model of `models:` is a function of that file)."""

import ast
import zipfile
from pathlib import Path

from segserve.archives.archive_urls import safe_relative_name
from segserve.archives.registration import WORKFLOW_MODEL_KEYS
from segserve.errors import UsageError


def node_urls(spec, where: str) -> dict[str, str]:
    """A .war spec's model nodes (its `models:` entries but the workflow-wide keys) → the .mar file each names (its
    `url`), in the spec's order. A url that is absolute or climbs out with `..` is a UsageError naming `where` and
    the node: it becomes a path in the model store, and the handler of the .mar found there is imported and run."""
    models = spec.get("models") if isinstance(spec, dict) else None
    entries = models.items() if isinstance(models, dict) else ()
    urls = {node: entry.get("url") for node, entry in entries if node not in WORKFLOW_MODEL_KEYS and isinstance(entry, dict)}
    return {node: safe_relative_name(url, f"{where}: models.{node}.url") for node, url in urls.items() if isinstance(url, str)}


def parents_of(dag: dict) -> dict[str, list[str]]:
    """Each node of the DAG → its parents, in the spec's order ([] for the start node)."""
    parents: dict[str, list[str]] = {}
    for node, children in dag.items():
        parents.setdefault(node, [])
        for child in children or []:
            parents.setdefault(child, []).append(node)
    return parents


def evaluation_order(dag: dict, where: str) -> list[str]:
    """The DAG's nodes, parents before children (the spec's order among nodes ready together). A DAG TorchServe
    refuses (Dag.validate: one start node, no cycle) is a UsageError naming its nodes."""
    parents = parents_of(dag)
    starts = [node for node, above in parents.items() if not above]
    if len(starts) != 1:
        named = ", ".join(starts) or "none (every node has a parent)"
        raise UsageError(f"{where}: the dag's start nodes are {named}: TorchServe runs a dag with exactly one")
    order, waiting = [], {node: len(above) for node, above in parents.items()}
    ready = list(starts)
    while ready:
        node = ready.pop(0)
        order.append(node)
        for child in dag.get(node) or []:
            waiting[child] -= 1
            if waiting[child] == 0:
                ready.append(child)
    if len(order) != len(parents):
        looped = ", ".join(node for node in parents if node not in order)
        raise UsageError(f"{where}: nodes {looped} form a cycle: TorchServe runs a dag without one")
    return order


def function_names(war: Path, functions_file: str) -> set[str]:
    """The names the .war's function file defines at its top level (read, not imported), where TorchServe finds
    a function node's entry point."""
    with zipfile.ZipFile(war) as archive:
        tree = ast.parse(archive.read(functions_file), functions_file)
    names = set()
    for statement in tree.body:
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(statement.name)
        elif isinstance(statement, ast.Import | ast.ImportFrom):
            names |= {alias.asname or alias.name.split(".")[0] for alias in statement.names}
        elif isinstance(statement, ast.Assign | ast.AnnAssign):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            names |= {target.id for target in targets if isinstance(target, ast.Name)}
    return names
