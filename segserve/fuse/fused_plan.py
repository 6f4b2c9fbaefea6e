"""What `segserve fuse` makes of a user's workflow archive: the .war as the one reader reads it
(segserve/archives/war.py), each model node's archive found in the model store, and the plan the fused handler runs.

Everything wrong with it is found before anything is written: one `UsageError` line naming the file and the node.
What TorchServe 0.12 itself refuses is refused by the reader; here also a node url that is a URL (the fused .mar is
made from files in the model store) and an archive that is not a Python model archive with a handler.
"""

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from segserve.archives.war import MAR_MANIFEST, WarSpec, read_war
from segserve.errors import UsageError

ROW_ERRORS = ("workflow", "node")  # what a row refused or failed by a node is answered (docs/fuse.md)


@dataclass(frozen=True)
class Workflow:
    war: WarSpec
    archives: dict[str, Path]  # model node → its .mar in the model store

    @property
    def path(self) -> Path:
        return self.war.path

    @property
    def name(self) -> str:
        return self.war.name

    @property
    def order(self) -> list[str]:
        return self.war.order

    @property
    def parents(self) -> dict[str, list[str]]:
        return self.war.parents

    @property
    def leaves(self) -> list[str]:
        return self.war.leaves

    @property
    def functions_file(self) -> str | None:
        return self.war.functions_file if self.war.functions else None

    @property
    def retry_attempts(self) -> dict[str, int]:
        return {node: self.war.nodes[node].settings["retry-attempts"] for node in self.order}

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
    """The .war read and checked, each model node's .mar found in `model_store` (its function nodes' names are
    checked where its handler file is imported: fuse's check_imports)."""
    spec = read_war(war)
    archives = {node: _node_archive(str(war), node, url, model_store) for node, url in spec.models.items()}
    return Workflow(spec, archives)


def _node_archive(where: str, node: str, url: str, model_store: Path) -> Path:
    if "://" in url:
        raise UsageError(f"{where}: node {node}: url {url!r} is not a .mar file name in the model store")
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
