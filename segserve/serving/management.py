"""TorchServe's management API, as a running server's client: its tokens, registering and scaling models and
workflows, describing them, and a failed call's reason, root cause first. TorchServe (server.py) is one: the client
needs only the server's run folder (key file, config, logs), its addresses and its log tail; its model store and
Python, where it has them, to import a handler that does not load as the worker would."""

import json
import re
import sys
import time
from pathlib import Path

from segserve.archives import registration
from segserve.archives.handler_check import archive_import_failures
from segserve.errors import RuntimeFailure
from segserve.serving.http import Response, request
from segserve.serving.ts_config import read_properties
from segserve.serving.worker_log import first_exception

PYTHON_ERROR = re.compile(r"\b((?:[A-Z]\w*)?(?:Error|Exception): .*)$")  # `ModuleNotFoundError: No module named 'x'`
# The 500s TorchServe 0.12's frontend answers a scale with when it races its own workers (ManagementClient.scale)
SCALE_RACES = ("ConcurrentModificationException", "NullPointerException")


class ManagementClient:
    """The management API of the server at self.url(api), with the keys in self.run_dir/key_file.json."""

    run_dir: Path
    # where a client has them (TorchServe's own fields): where registered archives are, and the Python environment
    # the server and its workers run from (None: segserve's)
    model_store: Path | None
    venv: Path | None

    def url(self, api: str) -> str:
        raise NotImplementedError

    def log_tail(self, lines: int = 40) -> str:
        raise NotImplementedError

    def code_environment(self) -> dict[str, str] | None:
        """The environment a user's archive's code gets beside this server; None: this process's whole one."""
        return None

    @property
    def key_file(self) -> Path:
        return self.run_dir / "key_file.json"

    def token(self, api: str) -> str:
        """The key TorchServe generated for `inference` or `management`."""
        try:
            keys = json.loads(self.key_file.read_text())
        except (OSError, ValueError) as error:
            raise RuntimeFailure(f"no TorchServe key file at {self.key_file}: is the server running? ({error})") from None
        return keys[api]["key"]

    def call(self, api: str, method: str, path: str, body: bytes | None = None, timeout_s: float = 300) -> Response:
        return request(self.url(api), method, path, token=self.token(api), body=body, timeout_s=timeout_s)

    def register_model(
        self,
        archive: str,
        name: str,
        workers: int = 1,
        batch_size: int | None = None,
        max_batch_delay_ms: int | None = None,
        response_timeout: int | None = None,
        log=print,
    ) -> None:
        """POST /models; batching and timeout (s) from the archive's model-config unless given."""
        values = {"batch_size": batch_size, "max_batch_delay_ms": max_batch_delay_ms, "response_timeout": response_timeout}
        path = "/models?" + registration.register_query(archive, name, workers, values)
        since = self.model_log_size()
        self._expect_ok(self.call("management", "POST", path), f"registering {archive} as {name}", since, archive)
        started = len(self.describe(name).get("workers", []))
        if started != workers:  # TorchServe 0.12: the archive's own workers count wins over the registration's
            self.scale(name, workers)
        log(f"registered model {name} ({archive}, {workers} worker(s))")

    def register_workflow(self, archive: str, name: str, log=print) -> None:
        since = self.model_log_size()
        response = self.call("management", "POST", f"/workflows?url={archive}&workflow_name={name}")
        self._expect_ok(response, f"registering workflow {archive}", since, archive)
        log(f"registered workflow {name} ({archive})")

    def scale(self, model: str, workers: int, attempts: int = 6) -> Response:
        """PUT min/max workers, synchronously. TorchServe 0.12 can answer a scale under load with a 500 from a
        race in its frontend: ConcurrentModificationException (its worker map changed while it iterated it; once
        in 7 rescale-under-load runs), or a NullPointerException in BatchAggregator.sendError while it shut down a
        worker between two batches (seen once, after the worker had gone). The call sets absolute counts, so
        sending it again is safe; other errors (a worker that fails to start) are final."""
        path = f"/models/{model}?{registration.scale_query(workers)}"
        since = self.model_log_size()
        for attempt in range(attempts):
            response = self.call("management", "PUT", path)
            race = response.status == 500 and any(name in response.text() for name in SCALE_RACES)
            if not race or attempt == attempts - 1:
                break
            time.sleep(0.2 * 2**attempt)
        return self._expect_ok(response, f"scaling {model} to {workers} worker(s)", since)

    def unregister(self, kind: str, name: str) -> None:
        """DELETE a model or workflow (kind "models" or "workflows"); a missing one is not an error."""
        response = self.call("management", "DELETE", f"/{kind}/{name}")
        if response.status not in (200, 404):
            self._expect_ok(response, f"unregistering {kind[:-1]} {name}")

    def models(self) -> list[str]:
        """Every model TorchServe has registered (workflow nodes too), from GET /models."""
        models = self._expect_ok(self.call("management", "GET", "/models?limit=1000"), "listing models").json()["models"]
        return sorted(m["modelName"] for m in models)

    def workflow_nodes(self) -> list[str]:
        """The models TorchServe registered for workflow nodes (<workflow>__<node>), from GET /workflows."""
        workflows = self._expect_ok(self.call("management", "GET", "/workflows"), "listing workflows").json()["workflows"]
        prefixes = tuple(f"{w['workflowName']}__" for w in workflows)
        return [m for m in self.models() if prefixes and m.startswith(prefixes)]

    def describe(self, model: str) -> dict:
        return self._expect_ok(self.call("management", "GET", f"/models/{model}"), f"describing {model}").json()[0]

    def wait_ready(self, model: str, timeout_s: float = 120) -> None:
        """Wait until every worker of `model` is READY."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            workers = self.describe(model).get("workers", [])
            if workers and all(w.get("status") == "READY" and int(w.get("pid") or -1) > 0 for w in workers):
                return
            time.sleep(0.5)
        raise RuntimeFailure(f"workers of {model} are not READY after {timeout_s:.0f}s:\n{self.log_tail()}")

    def _expect_ok(self, response: Response, what: str, since: int | None = None, archive: str | None = None) -> Response:
        """The response, or a failure whose first line has the root cause first (a caller may keep only that line),
        then TorchServe's answer. For a call that starts workers (`since`: the workers' log size before it), the
        cause is the archive's handlers imported as the worker imports them (TorchServe's loader logs its
        fallback's error, not the handler's own), else the first exception the workers logged since, with its
        chain. The failure carries it as `cause`, and the import failures as `import_failures`."""
        if response.status < 300:
            return response
        text = response.text()
        try:
            message = json.loads(text).get("message") or text
        except (ValueError, AttributeError):
            message = text
        reason = f"{what} failed: HTTP {response.status}: {' '.join(str(message).split())[:300]}"
        imports = self.import_failures(archive) if since is not None and archive else []
        cause = "; ".join(f.line() for f in imports) or (self.worker_exception(since) if since is not None else None)
        failure = RuntimeFailure(f"{cause}; {reason}\n{self.log_tail(20)}" if cause else f"{reason}\n{self.log_tail(20)}")
        failure.cause, failure.import_failures = cause, imports
        raise failure

    def import_failures(self, archive: str) -> list:
        """What of `archive` (a file in the model store) does not import as TorchServe's worker imports it
        (handler_check.py); nothing where the server installs an archive's requirements first
        (install_py_dep_per_model: the worker's folder has what a fresh import lacks)."""
        store, venv = getattr(self, "model_store", None), getattr(self, "venv", None)
        path = Path(store) / archive if store is not None else None
        if path is None or not path.is_file() or self.installs_requirements():
            return []
        python = str((Path(venv) / "bin" / "python").absolute()) if venv else sys.executable
        return archive_import_failures(path, Path(store), python, self.code_environment())

    def installs_requirements(self) -> bool:
        """TorchServe pip-installs each archive's requirements file when it registers it (install_py_dep_per_model)."""
        config = self.run_dir / "config.properties"
        return config.is_file() and read_properties(config).get("install_py_dep_per_model", "").strip().lower() == "true"

    def model_log_size(self) -> int:
        path = self.run_dir / "logs" / "model_log.log"
        return path.stat().st_size if path.exists() else 0

    def model_log_since(self, since: int) -> str:
        """What the workers logged after byte `since` (a rotated log: its whole current file)."""
        path = self.run_dir / "logs" / "model_log.log"
        data = path.read_bytes() if path.exists() else b""
        return data[since if since <= len(data) else 0 :].decode(errors="replace")

    def worker_exception(self, since: int, wait_s: float = 5.0) -> str | None:
        """The first exception the workers logged after byte `since`, with its chain (worker_log.py), or else the
        last Python error line (one logged without a traceback). The frontend answers a failed registration
        before its log writer has written the worker's last lines (seen on a busy machine): looked for again
        until `wait_s` has passed."""
        deadline = time.monotonic() + wait_s
        while True:
            text = self.model_log_since(since)
            lines = [m.group(1)[:300] for m in map(PYTHON_ERROR.search, text.splitlines()) if m]
            found = first_exception(text) or (lines[-1] if lines else None)
            if found or time.monotonic() >= deadline:
                return found
            time.sleep(0.2)
