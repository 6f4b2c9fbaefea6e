"""TorchServe 0.12's management API as its frontend answers it, for the Ray engine's management server
(management_server.py): which call a request is, its parameters as the frontend reads them, the key check (the
management key, or the token API's key for /token), and each answer's status and JSON. Pure: the models themselves
are behind `Models` (the driver's registry.py; the tests' own), so the tests call it without Ray.

Read from pytorch/serve's frontend (frontend/server/src/main/java/org/pytorch/serve/): ManagementRequestHandler
(routes, 405 for another method), ApiUtils (getModelList's paging, registerModel/handleRegister, updateModelWorkers'
messages, unregisterModel, createModelResponse: the describe fields in DescribeModelResponse's order),
RegisterModelRequest (the query's defaults), NettyUtils.getIntParameter (a value that is no integer: the default),
ModelArchive.downloadModel (which url is refused how), TokenAuthorizationHandler and TokenAuthorization (/token:
the API key, a new key and expiration for one type, an empty JSON answer). Each answer was checked against a real
TorchServe 0.12 (tests/unit/data/torchserve_management.json, tests/unit/test_ray_management.py).
"""

import zipfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol
from urllib.parse import parse_qs, urlsplit

import yaml

from segserve.engines.ray.model_spec import ModelSpec, Registered
from segserve.engines.ray.torchserve_api import (
    NOT_ALLOWED,
    NOT_FOUND,
    URL_SCHEME,
    Answer,
    error,
    json_answer,
    key_refused,
    status_json,
)

# TokenAuthorizationHandler's message for /token (Authentication, where every other check says Authorization)
TOKEN_API_FAILED = "Token Authentication failed. Token either incorrect, expired, or not provided correctly"


@dataclass(frozen=True)
class Worker:
    """One replica as describe shows a TorchServe worker."""

    id: str
    start_time_s: float
    ready: bool
    pid: int


@dataclass(frozen=True)
class Defaults:
    """config.properties' values that registration falls back to (TorchServe's ConfigManager)."""

    workers: int = 1  # default_workers_per_model (our config.properties: 1)
    response_timeout_s: int = 120  # default_response_timeout
    startup_timeout_s: int = 120  # default_startup_timeout
    job_queue_size: int = 100
    # install_py_dep_per_model: TorchServe pip-installs an archive's requirements file at registration; the Ray engine
    # refuses such an archive by name instead (its replicas run the engine's Python environment as it is)
    install_py_dep_per_model: bool = False


class Models(Protocol):
    """The models the Ray engine serves (registry.Registry in the driver)."""

    def registered(self) -> dict[str, Registered]: ...

    def register(self, model: Registered) -> None: ...  # replicas up when it returns; RuntimeError: they did not start

    def scale(self, name: str, workers: int, wait: bool) -> None: ...

    def unregister(self, name: str) -> None: ...

    def workers(self, name: str) -> list[Worker]: ...

    def renew_key(self, api: str) -> None: ...  # TorchServe's /token: a new key and expiration for that API

    def workflows(self) -> dict: ...  # name → workflow_management.RegisteredWorkflow

    # its nodes' models registered, replicas up, then the workflow; else none of them, and why each failed
    def register_workflow(self, workflow, nodes: list[Registered]) -> list[str]: ...

    def unregister_workflow(self, name: str) -> None: ...  # the workflow, then its nodes' models


@dataclass
class Call:
    """One management request: method, the path's segments as Java's split makes them, the query's parameters."""

    method: str
    segments: list[str]
    query: dict[str, list[str]] = field(default_factory=dict)

    def text(self, key: str, default: str | None = None) -> str | None:
        values = self.query.get(key)
        return values[0] if values else default

    def integer(self, key: str, default: int) -> int:
        """NettyUtils.getIntParameter: the default where the value is missing or no integer."""
        try:
            return int(self.text(key) or "")
        except ValueError:
            return default


def parse(method: str, target: str) -> Call:
    """A request line's target as the frontend reads it (Java's split drops trailing empty segments)."""
    parts = urlsplit(target)
    segments = parts.path.split("/")
    while segments and segments[-1] == "":
        segments.pop()
    return Call(method.upper(), segments, parse_qs(parts.query, keep_blank_values=True))


def answer(call: Call, authorization: str | None, keys: dict, models: Models, store: Path | None, defaults: Defaults) -> Answer:
    """The management API's answer to one call; `keys`: the key file's content as it is now."""
    if call.segments[1:2] == ["token"]:
        return token(call, authorization, keys, models)
    if refused := key_refused(authorization, keys["management"]["key"], keys["management"].get("expiration time")):
        return refused
    if not call.segments:
        return error(405, "MethodNotAllowedException", NOT_ALLOWED)  # `/`: the API description, not served here
    if call.segments[1] == "workflows":
        from segserve.engines.ray import workflow_management  # it imports this module

        return workflow_management.answer(call, models, store, defaults)
    if call.segments[1] != "models" or len(call.segments) > 5 or (len(call.segments) == 5 and call.segments[4] != "set-default"):
        return error(404, "ResourceNotFoundException", NOT_FOUND)
    if len(call.segments) < 3:
        if call.method == "GET":
            return list_models(call, models.registered())
        if call.method == "POST":
            return register(call, models, store, defaults)
        return error(405, "MethodNotAllowedException", NOT_ALLOWED)
    name, version = call.segments[2], call.segments[3] if len(call.segments) >= 4 else None
    if call.method == "GET":
        return describe(name, version, models)
    if call.method == "PUT" and len(call.segments) == 5:
        return set_default(name, version, models.registered())
    if call.method == "PUT":
        return scale(call, name, version, models)
    if call.method == "DELETE":
        return unregister(name, version, models)
    return error(405, "MethodNotAllowedException", NOT_ALLOWED)


def token(call: Call, authorization: str | None, keys: dict, models: Models) -> Answer:
    """/token?type=management|inference with the token API's key: a new key for that API; its answer is empty."""
    kind = call.text("type")
    if key_refused(authorization, keys["API"]["key"]) or kind not in ("management", "inference"):
        return error(400, "InvalidKeyException", TOKEN_API_FAILED)
    models.renew_key(kind)
    return Answer(200, {"content-type": "application/json"}, b"\n")


def missing(name: str, version: str | None, registered: dict[str, Registered]) -> Answer | None:
    """ModelManager.getModel's refusal ("all": every version, the one there is)."""
    if name not in registered:
        return error(404, "ModelNotFoundException", f"Model not found: {name}")
    if version not in (None, "all", registered[name].version):
        return error(404, "ModelVersionNotFoundException", f"Model version: {version} does not exist for model: {name}")
    return None


def list_models(call: Call, registered: dict[str, Registered]) -> Answer:
    """ApiUtils.getModelList: sorted by name, `limit` (0-100, else 100) from `next_page_token`."""
    limit, start = call.integer("limit", 100), max(call.integer("next_page_token", 0), 0)
    limit = 100 if limit > 100 or limit < 0 else limit
    # a workflow's function nodes are models TorchServe does not list (measured: dogbreed's pre_processing)
    names = sorted(name for name, model in registered.items() if not model.spec.handler)
    page: dict = {}
    if start + limit <= len(names):
        page["nextPageToken"] = str(start + limit)
    page["models"] = [{"modelName": n, "modelUrl": registered[n].url} for n in names[start : start + limit]]
    return json_answer(page)


def register(call: Call, models: Models, store: Path | None, defaults: Defaults) -> Answer:
    """POST /models?url=: an archive of the model store (allowed_urls matches no URL: our config.properties), by its
    file name; batch_size, max_batch_delay, initial_workers, response_timeout as RegisterModelRequest reads them."""
    url = call.text("url")
    if url is None:
        return error(400, "BadRequestException", "Parameter url is required.")
    if store is None:
        return error(404, "ModelNotFoundException", "Model store has not been configured.")
    if ".." in url:
        return error(404, "ModelNotFoundException", f"Relative path is not allowed in url: {url}")
    if URL_SCHEME.match(url):
        return error(404, "ModelNotFoundException", f"Given URL {url} does not match any allowed URL(s)")
    if url.endswith(".war"):  # TorchServe fails it as a .mar without a manifest; our words name the right call
        return error(400, "InvalidModelException", f"{url} is a workflow archive: register it with POST /workflows?url={url}")
    archive = store / Path(url).name
    if not archive.is_file():
        return error(404, "ModelNotFoundException", f"Model not found at: {url}")
    probe = ModelSpec("", str(archive))
    try:
        version, manifest_name = probe.version(), probe.manifest_name()
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as failed:
        return error(400, "InvalidModelException", f"Failed to load the archive {url}: {failed}")
    name = call.text("model_name") or manifest_name
    if defaults.install_py_dep_per_model and (requirements := probe.requirements_file()):
        return error(400, "InvalidModelException", requirements_refusal(url, requirements))
    if name in models.registered():
        return error(409, "ConflictStatusException", f"Model version {version} is already registered for model {name}")
    try:
        config = probe.model_config()
    except (OSError, KeyError, ValueError, yaml.YAMLError) as failed:
        return error(400, "InvalidModelException", f"Failed to load the archive {url}'s model config: {failed}")
    # The archive's model-config.yaml, as TorchServe 0.12 applies it (measured on its frontend: tests/unit/
    # test_ray_management.py): batch_size and max_batch_delay of the request win over the yaml's batchSize and
    # maxBatchDelay; the yaml's minWorkers and responseTimeout win over initial_workers and response_timeout.
    workers = _config_int(config, "minWorkers", call.integer("initial_workers", defaults.workers))
    batch_size = call.integer("batch_size", -1)
    batch_size = batch_size if batch_size > 0 else _config_int(config, "batchSize", 1)
    delay_ms = call.integer("max_batch_delay", -100)
    delay_ms = delay_ms if delay_ms >= 0 else _config_int(config, "maxBatchDelay", 100)
    timeout_s = call.integer("response_timeout", -1)
    timeout_s = _config_int(config, "responseTimeout", timeout_s if timeout_s > 0 else defaults.response_timeout_s)
    spec = ModelSpec(
        name,
        str(archive),
        batch_size=max(batch_size, 1),
        max_batch_delay_ms=max(delay_ms, 0),
        workers=max(workers, 0),
        job_queue_size=defaults.job_queue_size,
    )
    model = Registered(spec, url, version, timeout_s)
    try:
        models.register(model)
    except RuntimeError as failed:
        return error(500, "InternalServerException", f"Failed to start workers for model {name} version: {version}: {failed}")
    if spec.workers == 0:
        added = "Use scale workers API to add workers for the model."
        return status_json(f'Model "{name}" Version: {version} registered with 0 initial workers. {added}')
    return status_json(f'Model "{name}" Version: {version} registered with {spec.workers} initial workers')


def _config_int(config: dict, key: str, otherwise: int) -> int:
    """A whole number of the archive's model-config.yaml, else `otherwise`."""
    value = config.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else otherwise


def requirements_refusal(url: str, requirements: str) -> str:
    """Why the Ray engine does not register an archive whose requirements TorchServe would install."""
    return (
        f"{url} brings {requirements} and install_py_dep_per_model is true: TorchServe pip-installs it per model, the Ray "
        "engine does not (its replicas run the engine's Python environment): install it there and register again, or set "
        "install_py_dep_per_model=false (docs/ray.md)"
    )


def scale(call: Call, name: str, version: str | None, models: Models) -> Answer:
    """PUT /models/{m}?min_worker=N: Ray's replicas set to N (fixed replicas: max_worker only checked);
    synchronous=true answers once they run."""
    low = call.integer("min_worker", 1)
    high = call.integer("max_worker", low)
    version = version or call.text("model_version")
    if high < low:
        return error(400, "BadRequestException", "max_worker cannot be less than min_worker.")
    if refused := missing(name, version, models.registered()):
        return refused
    synchronous = (call.text("synchronous") or "").lower() == "true"
    try:
        models.scale(name, low, synchronous)
    except RuntimeError as failed:
        return error(500, "InternalServerException", f"Failed to start workers for model {name} version: {version}: {failed}")
    if not synchronous:
        return status_json("Processing worker updates...", 202)
    return status_json(f"Workers scaled to {low} for model: {name}" + (f", version: {version}" if version is not None else ""))


def unregister(name: str, version: str | None, models: Models) -> Answer:
    if refused := missing(name, version, models.registered()):
        return refused
    models.unregister(name)
    return status_json(f'Model "{name}" unregistered')


def set_default(name: str, version: str | None, registered: dict[str, Registered]) -> Answer:
    """PUT /models/{m}/{v}/set-default: one version a model here, so only its own is the default."""
    if refused := missing(name, version, registered):
        return refused
    return status_json(f'Default version successfully updated for model "{name}" to "{version}"')


def describe(name: str, version: str | None, models: Models) -> Answer:
    """GET /models/{m}[/{v}]: ApiUtils.createModelResponse's fields for the registered model, a worker each replica."""
    registered = models.registered()
    if refused := missing(name, version, registered):
        return refused
    model = registered[name]
    spec = model.spec
    workers = models.workers(name)
    return json_answer(
        [
            {
                "modelName": name,
                "modelVersion": model.version,
                "modelUrl": model.url,
                "runtime": "python",
                "minWorkers": spec.workers,
                "maxWorkers": spec.workers,
                "batchSize": spec.batch_size,
                "maxBatchDelay": spec.max_batch_delay_ms,
                "responseTimeout": model.response_timeout_s,
                "startupTimeout": Defaults.startup_timeout_s,
                "maxRetryTimeoutInSec": 300,
                "clientTimeoutInMills": 0,
                "parallelType": "",
                "parallelLevel": 0,
                "deviceType": "cpu",
                "continuousBatching": False,
                "useJobTicket": False,
                "useVenv": False,
                "stateful": False,
                "sequenceMaxIdleMSec": 0,
                "sequenceTimeoutMSec": 0,
                "maxNumSequence": 0,
                "maxSequenceJobQueueSize": 0,
                "loadedAtStartup": False,
                "workers": [
                    {
                        "id": w.id,
                        "startTime": gson_time(w.start_time_s),
                        "status": "READY" if w.ready else "UNLOADING",  # DescribeModelResponse.addWorker's two
                        "memoryUsage": 0,
                        "pid": w.pid,
                        "gpu": False,
                        "gpuUsage": "N/A",
                    }
                    for w in workers
                ],
                # Ray keeps no count of a deployment's queue that we read: the whole queue, as an idle TorchServe's
                "jobQueueStatus": {"remainingCapacity": spec.job_queue_size, "pendingRequests": 0},
            }
        ]
    )


def gson_time(seconds: float) -> str:
    """JsonUtils' date format, yyyy-MM-dd'T'HH:mm:ss.SSS'Z'."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
