"""A model as the Ray engine serves it (a registration's values), without Ray: the engine's client side and the
management API read it without importing Ray (replica.py runs it)."""

import json
import zipfile
from dataclasses import dataclass

import yaml


@dataclass(frozen=True)
class ModelSpec:
    """A model as TorchServe registers it: its name and archive, and the registration's batching, workers and job
    queue (TorchServe's defaults: batch 1, 100 ms, 1 worker, a queue of 100)."""

    name: str
    archive: str  # a .mar's path
    batch_size: int = 1
    max_batch_delay_ms: int = 100
    workers: int = 1
    job_queue_size: int = 100
    # a workflow's function node: `<function file>:<function>`, with `archive` its .war (no manifest: TorchServe
    # registers it as a model of that handler in the .war's folder, WorkFlow.java)
    handler: str | None = None

    def version(self) -> str:
        """The manifest's modelVersion, as TorchServe serves it (1.0 where the archiver was given none, and for a
        function node, which has no manifest)."""
        return "1.0" if self.handler else str(self._manifest().get("modelVersion") or "1.0")

    def manifest_name(self) -> str:
        """The manifest's modelName: the name TorchServe registers the archive under where none is given."""
        return str(self._manifest()["modelName"])

    def requirements_file(self) -> str | None:
        """The manifest's requirementsFile: what TorchServe pip-installs at registration with install_py_dep_per_model."""
        return None if self.handler else self._manifest().get("requirementsFile") or None

    def model_config(self) -> dict:
        """The archive's model-config.yaml (the manifest's configFile, `torch-model-archiver --config-file`) as a dict;
        {} without one. TorchServe reads its registration values from it (management_api.register)."""
        name = None if self.handler else self._manifest().get("configFile")
        if not name:
            return {}
        with zipfile.ZipFile(self.archive) as mar:
            config = yaml.safe_load(mar.read(name))
        return config if isinstance(config, dict) else {}

    def _manifest(self) -> dict:
        with zipfile.ZipFile(self.archive) as mar:
            return json.loads(mar.read("MAR-INF/MANIFEST.json"))["model"]


@dataclass(frozen=True)
class Registered:
    """A model registered: its spec (the archive's path in the model store), the url it was registered with, its
    manifest's version and its response timeout (s)."""

    spec: ModelSpec
    url: str
    version: str
    response_timeout_s: int
