"""Archives segserve never built (a user's .mar or .war) as targets of a suite, registered as they are.

The user's files are never changed and their handlers never imported here (a .war's function nodes run for
`members: true` in a process of their own, with its workers' environment: bench/run/dag_requests.py). A .mar is copied into
the bench's model store and registered with the point's batch size, delay, timeout and workers (management API
parameters). A .war is copied with its spec's `models:` rewritten for the point (TorchServe reads a workflow's
batching and workers from there only; a function node its timeout and retries from the top level only), beside
copies of the .mar files its nodes name, taken from the target's model_store. What is wrong with an archive (not a
zip, no MANIFEST, a handler that does not load) is for TorchServe to say when the point registers it: that point
fails with its reason and the suite goes on. A .war node url that
would leave the model store is refused.
"""

import functools
import json
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from segserve.archives.archive_urls import (
    DownloadRules,
    cache_folder,
    fetch,
    folder_of,
    is_remote,
    joined,
    local_path,
)
from segserve.archives.catalog import ModelTarget, Node, NodeModel, Target, WorkflowTarget
from segserve.archives.handler_check import function_names
from segserve.archives.registration import write_models
from segserve.archives.war import NotAWorkflowArchive, WarSpec, check_functions, open_war, refuse_names_that_leave, war_of
from segserve.errors import RuntimeFailure, UsageError

FOREIGN = "<foreign>"  # the handler and body kind of a foreign node: no segserve handler setting applies to it


@dataclass(frozen=True)
class ForeignArchive:
    name: str  # what it is registered as
    path: Path  # the user's file
    model_store: Path  # where a .war's node .mar files are
    spec: dict | None = None  # a .war's workflow spec, as read from it (None: a .mar, or a .war that cannot be read)
    spec_file: str | None = None  # its name inside the .war
    node: str | None = None  # a .war's member: the node whose .mar it is (its one node is named so)
    workflow: str | None = None  # a member below the start node: the .war target whose DAG gives what it is sent
    functions_file: str | None = None  # a .war's function file (its manifest's handler), where function nodes live
    source: str | None = None  # the URL `path` is fetched from (segserve/archives/remote.py)
    store_source: str | None = None  # the URL prefix `model_store` is fetched from
    rules: DownloadRules = DownloadRules()  # what fetching it may do: its target's size cap, pins, plain http

    @property
    def war(self) -> WarSpec | None:
        """The .war as the one reader reads it (archives/war.py); None for a .mar or a spec it refuses (`refusal`)."""
        return self._read_spec[0]

    @property
    def refusal(self) -> str | None:
        """Why the reader refused the .war's spec (TorchServe refuses it too, when a point registers it)."""
        return self._read_spec[1]

    @functools.cached_property
    def _read_spec(self) -> tuple[WarSpec | None, str | None]:
        if self.spec is None:
            return None, None
        try:
            return war_of(self.path, self.name, self.spec_file or "", self.spec, self.functions_file, self.path.name), None
        except NotAWorkflowArchive as error:  # registered as it is, for TorchServe's reason
            return None, str(error)
        except UsageError as error:  # a DAG TorchServe refuses: so do members
            return None, str(error)

    @property
    def is_workflow(self) -> bool:
        return self.path.suffix == ".war"

    @property
    def kind(self) -> str:
        """Its label, in records and messages (its target: self.target(), a ModelTarget or a WorkflowTarget)."""
        return "workflow" if self.is_workflow else "model"

    @property
    def nodes(self) -> dict[str, str]:
        """A .war's model nodes in DAG order (the start node first; then models: entries the dag never names, which
        TorchServe registers too) → the .mar each names; function nodes have none."""
        war = self.war
        return {**war.models, **war.unused_models} if war else {}

    def target(self) -> Target:
        if not self.is_workflow:
            node = self.node or self.name
            return ModelTarget(self.name, (Node(node, _model(self.name, self.path)),), leaves=(node,))
        # each node's model is named as its member target (members=True): the efficiency table's members
        nodes = tuple(Node(node, _model(self.member_name(node), self.model_store / url)) for node, url in self.nodes.items())
        return WorkflowTarget(self.name, nodes, leaves=tuple(self._leaves()))

    def member_name(self, node: str) -> str:
        return f"{self.name}-{node}"

    def members(self) -> list["ForeignArchive"]:
        """Each model node's .mar as a target of its own, measured alone on what the workflow sends it: the start
        node this .war's inputs, every other node what its DAG makes of them (bench/run/dag_requests.py). Function nodes are
        not members: TorchServe runs them at batch size 1 in a worker of their own, measured only inside the DAG. Read,
        never imported: its function names are check_function_names', which runs the .war's code."""
        where = f"targets.{self.name}.members"
        if self.spec is None:
            raise UsageError(f"{where}: {self.path.name} has no workflow spec segserve can read")
        war = self.war
        if war is None:  # a DAG TorchServe would refuse: refused here too
            raise UsageError(f"{where}: {self.refusal}")
        parents = war.parents
        members = []
        for node, url in self.nodes.items():
            workflow = self.name if parents.get(node) else None  # the start node is sent the .war's own inputs
            path, source = self.model_store / url, joined(self.store_source, url) if self.store_source else None
            remote = {"source": source, "store_source": self.store_source, "rules": self.rules}
            members.append(ForeignArchive(self.member_name(node), path, self.model_store, node=node, workflow=workflow, **remote))
        return members

    def check_function_names(self, env: dict[str, str] | None) -> None:
        """Each function node of the .war a name its handler file binds, as TorchServe's loader finds it: asked of the
        file imported in a process of its own with environment `env` (it runs the archive's code: only once the user
        has been told so), its source read where it does not import; segserve fuse checks the same way."""
        war = self.war
        if war is not None and war.functions:
            check_functions(war, function_names(war, env=env), f"targets.{self.name}.members: {self.path.name}")

    def _leaves(self) -> list[str]:
        war = self.war
        return war.leaves if war else list(self.nodes)

    def files(self) -> list[Path]:
        """What a measurement of it depends on (for its run ids): the archive and a .war's node archives."""
        return [self.path, *(self.model_store / url for url in self.nodes.values())]

    def install(self, store: Path, spec_models: dict | None = None) -> str:
        """Put it into `store` for registration: a .mar copied (once); a .war written anew with its spec's `models:`
        updated by `spec_models` (node → its registration keys, a top-level key → its value: spec_with), beside its
        node .mar files; the user's file is only read. Returns the file name to register."""
        self.fetch_missing()
        if not self.is_workflow:
            copy = store / f"{self.name}.mar"
            if self.node is not None and not self.path.is_file():  # a member: the .war names a .mar that is not there
                raise RuntimeFailure(f"{self.path}: no such file (the .mar node {self.node!r} names)")
            if not copy.exists():
                shutil.copyfile(self.path, copy)
            return copy.name
        for url in self.nodes.values():
            source, copy = self.model_store / url, store / url
            if source.is_file() and not copy.exists():  # a missing one: TorchServe names it when registering
                shutil.copyfile(source, copy)
        copy = store / f"{self.name}.war"
        if self.spec is None:  # unreadable: registered as it is, for TorchServe's reason
            shutil.copyfile(self.path, copy)
            return copy.name
        spec = self.spec_with(spec_models or {})
        with zipfile.ZipFile(self.path) as original, zipfile.ZipFile(copy, "w", zipfile.ZIP_DEFLATED) as written:
            for item in original.infolist():
                data = original.read(item.filename)
                if item.filename == self.spec_file:
                    data = yaml.safe_dump(spec, sort_keys=False).encode()
                written.writestr(item, data)
        return copy.name

    def fetch_missing(self, node_archives_only: bool = False) -> None:
        """What is remote and not in the local cache yet (read_archive fetched it unless its URL did not answer
        then): fetched now, or a RuntimeFailure that names the URL with its credentials masked."""
        if self.source and not node_archives_only and not self.path.is_file():
            fetch(self.source, self.path.parent, self.rules)
        if self.store_source and self.is_workflow:
            for url in self.nodes.values():
                if not (self.model_store / url).is_file():
                    fetch(joined(self.store_source, url), self.model_store, self.rules)

    def spec_with(self, values: dict) -> dict:
        """The .war's spec (a copy) with these values written into its `models:` (registration.write_models: a node's
        name → its keys; a setting's key → the top-level value, the one function nodes take)."""
        spec = json.loads(json.dumps(self.spec))
        spec["models"] = write_models(spec["models"], values)
        return spec


def _model(name: str, path: Path) -> NodeModel:
    return NodeModel(name, path, FOREIGN, False, FOREIGN, FOREIGN)


def read_archive(name: str, archive: str, model_store: str | None, rules: DownloadRules = DownloadRules()) -> ForeignArchive:
    """The archive target's archive; a .war's spec read from it (one it cannot read fails at registration). An
    archive or model store at a URL is fetched into the local cache first; one whose URL does not answer now
    fails its points with the reason (its spec unknown till then)."""
    remote: dict = {"rules": rules}
    if is_remote(archive):
        path = local_path(archive, cache_folder(folder_of(archive)))
        remote["source"] = archive
        model_store = model_store or folder_of(archive)
    else:
        path = Path(archive)
        if not path.is_file():
            raise UsageError(f"targets.{name}.archive: no such file {archive!r}")
    if model_store and is_remote(model_store):
        store, remote["store_source"] = cache_folder(model_store), model_store
    else:
        store = Path(model_store) if model_store else path.parent
        if model_store and not store.is_dir():
            raise UsageError(f"targets.{name}.model_store: no such folder {model_store!r}")
    if "source" in remote:
        try:
            fetch(archive, path.parent, rules)
        except RuntimeFailure:  # the points say so, with the URL masked: the suite is not refused for it
            path.unlink(missing_ok=True)  # nor is an older copy measured in its place
            return ForeignArchive(name, path, store, **remote)
    found = _read(name, path.resolve(), store.resolve(), remote)
    try:
        found.fetch_missing(node_archives_only=True)
    except RuntimeFailure:
        pass  # a node archive whose URL does not answer: fetched again, or named, when the point registers it
    return found


def _read(name: str, path: Path, store: Path, remote: dict) -> ForeignArchive:
    if path.suffix == ".mar":
        return ForeignArchive(name, path, store, **remote)
    where = f"targets.{name}: {path.name}"
    try:
        _, _, spec_file, spec, functions_file = open_war(path, where)
    except NotAWorkflowArchive:
        return ForeignArchive(name, path, store, **remote)  # unreadable: registered as it is, for TorchServe's reason
    if not isinstance(spec, dict) or not isinstance(spec.get("models"), dict):
        return ForeignArchive(name, path, store, **remote)
    refuse_names_that_leave(spec, functions_file, where)  # a node url or handler file that would leave: refused now
    return ForeignArchive(name, path, store, spec, spec_file, functions_file=functions_file, **remote)
