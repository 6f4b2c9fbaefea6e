"""Why an archive's handler does not load: its import, done as TorchServe's worker does it, in a separate process.

TorchServe 0.12's loader (ts/model_loader.py) imports a handler file of the archive and, on any ImportError,
tries ts.torch_handler.<handler> instead, so its answer and the worker's last logged line have only the fallback's
"No module named 'ts.torch_handler.<name>'", not the file's own error (a module the environment lacks). Importing
it again here, the way the worker does, gives that error back with the files it came through.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from segserve.archives.war import NotAWorkflowArchive, WarSpec, read_war, source_names
from segserve.errors import UsageError

MISSING_MODULE = re.compile(r"^ModuleNotFoundError: No module named '([\w.]+)'")
PROBE = Path(__file__).with_name("handler_probe.py")  # run with -c: its own folder must not land on sys.path


def handler_import_failure(
    model_dir: Path, handler: str, python: str = sys.executable, timeout_s: float = 60, env: dict[str, str] | None = None
) -> str | None:
    """probe_handler's failure: the exception chain, one line, innermost cause first ("ModuleNotFoundError: No module named 'captum' ←
    ts/torch_handler/vision_handler.py:11 ← ts/torch_handler/image_classifier.py:11 ← breed_handler.py:1"), of
    importing `handler` (the manifest's handler string: "my_handler.py", "image_classifier", "file.py:fn") from the
    extracted archive `model_dir` with `python`; None when it imports. The worker's environment as TorchServe's
    frontend makes it (EnvironmentUtils.getEnvString) from `env` (default: this process's): the archive folder as
    the working directory and on PYTHONPATH, after a "dir/file.py:fn" handler's dir and env's PYTHONPATH."""
    return probe_handler(model_dir, handler, python, timeout_s, env)["failure"]


def probe_handler(
    model_dir: Path, handler: str, python: str = sys.executable, timeout_s: float = 60, env: dict[str, str] | None = None
) -> dict:
    """handler_probe.py's answer for `handler` imported as handler_import_failure says: {"failure": chain or None,
    "names": the module's attributes for a `file.py:function` handler that imported, else None}."""
    model_dir, env = Path(model_dir).resolve(), dict(os.environ if env is None else env)
    paths = [handler.split(":")[0].rpartition("/")[0]] if ":" in handler and "/" in handler.split(":")[0] else []
    paths += [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []
    env["PYTHONPATH"] = os.pathsep.join([*paths, str(model_dir)])
    try:
        done = subprocess.run(
            [python, "-c", PROBE.read_text(), handler],
            cwd=model_dir,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return {"failure": f"importing handler {handler} did not finish in {timeout_s:g} s", "names": None}
    except OSError as error:
        return {"failure": f"cannot run {python} to import handler {handler}: {error}", "names": None}
    lines = done.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1])
        return {"failure": answer["failure"], "names": answer.get("names")}
    except (IndexError, ValueError, KeyError, TypeError):
        said = (done.stderr.strip().splitlines() or ["nothing"])[-1]
        return {"failure": f"importing handler {handler} ended with exit code {done.returncode}: {said}", "names": None}


@dataclass(frozen=True)
class ImportFailure:
    where: str  # "" for a .mar; "node <name>" or "function file <file>" in a .war
    chain: str  # handler_import_failure's line
    requirements_file: str | None = None  # the failing .mar's own, when the chain is a module it lacks
    listed: str | None = None  # the requirements file's entry that names that module

    def line(self) -> str:
        text = f"{self.where}: {self.chain}" if self.where else self.chain
        if self.listed:
            return f"{text}; the archive lists it in its {self.requirements_file} ({self.listed})"
        if self.requirements_file:
            return f"{text}; the archive brings a {self.requirements_file}"
        return text


def archive_import_failures(
    archive: Path, model_store: Path, python: str = sys.executable, env: dict[str, str] | None = None
) -> list[ImportFailure]:
    """Each handler of `archive` that does not import as TorchServe would import it: a .mar's handler; a .war's
    nodes' .mar handlers (from `model_store`, as the spec names them) and its function file, which TorchServe loads
    as `<file>:<node>` from the extracted .war; in `env` (handler_import_failure). Nothing for an archive that is
    not a readable zip: registering it says why."""
    try:
        if archive.suffix == ".war":
            return _workflow_failures(archive, model_store, python, env)
        failure = _model_failure(archive, python, env)
        return [failure] if failure else []
    except (OSError, zipfile.BadZipFile, KeyError, ValueError, yaml.YAMLError):
        return []


def _model_failure(mar: Path, python: str, env: dict | None, where: str = "") -> ImportFailure | None:
    with tempfile.TemporaryDirectory(prefix="segserve-handler-") as folder:
        try:
            manifest = _extract(mar, Path(folder), "MAR-INF/MANIFEST.json")["model"]
        except (OSError, zipfile.BadZipFile, KeyError, ValueError):  # not there, or not a .mar: registering says why
            return None
        chain = handler_import_failure(Path(folder), manifest["handler"], python, env=env)
        if chain is None:
            return None
        missing = MISSING_MODULE.match(chain)
        requirements = manifest.get("requirementsFile") if missing else None
        listed = _listing(Path(folder) / requirements, missing.group(1)) if requirements else None
        return ImportFailure(where, chain, requirements, listed)


def _workflow_failures(war: Path, model_store: Path, python: str, env: dict | None) -> list[ImportFailure]:
    try:  # nothing imported from outside the model store or the .war: the one reader refuses what would leave them
        spec = read_war(war, war.name)
    except NotAWorkflowArchive:  # registering says why
        return []
    except UsageError as error:
        return [ImportFailure("", str(error))]
    failures = [_model_failure(model_store / url, python, env, f"node {node}") for node, url in spec.models.items()]
    if spec.functions:  # a function node runs from the .war's handler file
        with tempfile.TemporaryDirectory(prefix="segserve-handler-") as folder:
            with zipfile.ZipFile(war) as archive:
                archive.extractall(folder)  # zipfile keeps every member inside the folder
            chain = handler_import_failure(Path(folder), spec.functions_file, python, env=env)
        failures.append(ImportFailure(f"function file {spec.functions_file}", chain) if chain else None)
    return [f for f in failures if f is not None]


def _extract(archive: Path, folder: Path, manifest: str) -> dict:
    """The archive's files into `folder` (all but its serialized weights, which a handler reads only when it
    initializes), and its manifest."""
    with zipfile.ZipFile(archive) as zipped:
        meta = json.loads(zipped.read(manifest))
        weights = (meta.get("model") or {}).get("serializedFile")
        zipped.extractall(folder, [name for name in zipped.namelist() if name != weights])
    return meta


def _listing(requirements: Path, module: str) -> str | None:
    """The entry of a requirements file that names `module`'s top-level package (a distribution name, a wheel's
    or a folder's), compared as pip compares names (case, '-', '_' and '.' alike)."""
    wanted = _normal(module.split(".")[0])
    for line in requirements.read_text().splitlines() if requirements.is_file() else []:
        entry = line.split("#", 1)[0].strip()
        if not entry or entry.startswith("-"):
            continue
        name = Path(entry).name.split("-")[0] if entry.endswith(".whl") else re.split(r"[\s<>=!~;\[@]", Path(entry).name)[0]
        if _normal(name) == wanted:
            return entry
    return None


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def function_names(war: WarSpec, python: str = sys.executable, env: dict[str, str] | None = None) -> set[str] | None:
    """The names a function node may take from the .war's handler file, as TorchServe's loader finds them: the
    attributes of the module imported from the extracted .war (in a probe process, environment `env`); where it does
    not import (its requirements not installed yet), the names its source binds. None without a handler file."""
    source = war.functions_source()
    if source is None:
        return None
    if war.functions:
        with tempfile.TemporaryDirectory(prefix="segserve-war-") as folder:
            with zipfile.ZipFile(war.path) as archive:
                archive.extractall(folder)  # zipfile keeps every member inside the folder
            answer = probe_handler(Path(folder), f"{war.functions_file}:{war.functions[0]}", python, env=env)
        if answer.get("names") is not None:
            return set(answer["names"])
    try:
        return source_names(source, war.functions_file)
    except SyntaxError as error:
        raise UsageError(f"{war.path}: its handler file {war.functions_file} does not parse: {error}") from None
