"""One .mar, loaded and run as TorchServe 0.12's Python worker runs it, in a Ray Serve replica: TorchServe's own
Python side (the installed torchserve package: ts.model_loader, ts.service) does the work, no Java.

The load is model_service_worker.load_model's: the archive extracted into a folder of its own, that folder first on
sys.path and the working directory (the frontend starts a worker there, WorkerLifeCycle), the manifest's handler and
envelope, gpu_id 0 where this replica has a GPU (Ray's CUDA_VISIBLE_DEVICES shows it as device 0) and None on the
CPU, the batch size, limit_max_image_pixels, and a metrics cache from TorchServe's metrics.yaml. Each batch goes to
Service.predict as the worker reads it from the frontend (worker_protocol.worker_request), and its reply is read
back as the frontend reads it (worker_protocol.read_predict_reply, torchserve_api.answers).

Each model's application has its own route, `/predictions/<model>` (app.model_app): Serve's proxy, or HAProxy,
sends such a request straight to a replica of the model, which checks the inference key and the route itself and
runs the batch (one hop; through the ingress it was two deployments, each paying Ray's cost per call). The ingress
(app.Ingress) still calls the same batch through a handle for a workflow's nodes.

A workflow's function node is loaded the same way, as TorchServe registers it: its .war extracted as the folder (no
manifest), `<function file>:<function>` as the handler (ts.model_loader finds the function), batch size 1.

Service.predict hands the context the worker's socket (context.cl_socket) only for streamed answers
(send_intermediate_predict_response): here there is none, so a handler that streams fails its batch.
"""

import json
import os
import sys
import tempfile
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ray import serve
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from segserve.engines.ray import torchserve_api as api
from segserve.engines.ray.model_spec import ModelSpec
from segserve.engines.ray.torchserve_api import Answer, answers
from segserve.engines.worker_protocol import metrics_cache, parameters_request, read_predict_reply, worker_request


@dataclass(frozen=True)
class Request:
    """What the ingress hands a replica for one HTTP request."""

    request_id: str
    headers: list[tuple[bytes, bytes]]  # as the handler sees them (torchserve_api.request_headers)
    body: bytes
    content_type: str
    # a workflow node below the start: its parents' answers, (name, content type, bytes) each, instead of the body
    parameters: tuple | None = None

    def worker_request(self) -> dict:
        if self.parameters is not None:
            return parameters_request(self.request_id, self.headers, self.parameters)
        return worker_request(self.request_id, self.headers, self.body, self.content_type)


def extract(archive: str, parent: Path) -> Path:
    """The .mar unpacked into a new folder under `parent` (zipfile drops absolute paths and '..' from names)."""
    folder = Path(tempfile.mkdtemp(prefix=f"{Path(archive).stem}-", dir=parent))
    with zipfile.ZipFile(archive) as mar:
        mar.extractall(folder)
    return folder


def threads_as_a_workers(environ=os.environ, started: Path = Path("/proc/self/environ")) -> None:
    """Undo the OMP_NUM_THREADS that Ray sets in a replica whose environment has none (1 for an actor that reserves
    no CPU: ray._private.utils.set_omp_num_threads_if_unset), before torch is imported: a TorchServe worker runs
    torch's default (every core it may use), and one thread gives other floating-point sums (the image_segmenter's
    probabilities differed in their last digits: tests/system/test_ray_same_bytes.py). The process's environment as
    it was started (`started`) tells Ray's value from the user's, which is kept."""
    try:
        initial = started.read_bytes().split(b"\0")
    except OSError:  # no /proc: left as Ray set it
        return
    if "OMP_NUM_THREADS" in environ and not any(entry.startswith(b"OMP_NUM_THREADS=") for entry in initial):
        del environ["OMP_NUM_THREADS"]


def load_service(spec: ModelSpec, model_dir: Path, gpu_id: int | None):
    """ts.model_loader's load of the archive extracted in `model_dir`, from there, as the worker loads it."""
    from ts.model_loader import ModelLoaderFactory

    manifest_file = model_dir / "MAR-INF" / "MANIFEST.json"  # a function node's .war has none
    manifest = json.loads(manifest_file.read_text())["model"] if manifest_file.is_file() else {}
    sys.path.insert(0, str(model_dir))
    os.chdir(model_dir)
    loader = ModelLoaderFactory.get_model_loader()
    service = loader.load(
        spec.name,
        str(model_dir),
        spec.handler or manifest.get("handler"),
        gpu_id,
        spec.batch_size,
        manifest.get("envelope") or None,
        True,  # limit_max_image_pixels: config.properties' default
        metrics_cache(spec.name),
    )
    service.set_cl_socket(None)  # predict copies it into the context: only a streamed answer writes to it
    return service


def predict(service, requests: list[Request]) -> list[Answer]:
    """One batch through Service.predict, each request's answer as the frontend makes it of the reply."""
    batch = [r.worker_request() for r in requests]
    return answers(read_predict_reply(bytes(service.predict(batch))), len(requests))


def gpu_of_replica() -> int | None:
    """0 where Ray gave this replica a GPU (it sees only its own, as device 0), None on the CPU (TorchServe's)."""
    import torch

    return 0 if torch.cuda.is_available() and os.environ.get("CUDA_VISIBLE_DEVICES", "") not in ("", "-1") else None


def to_http(answer: Answer, request_id: str) -> Response:
    """An answer as TorchServe sends it: its headers, x-request-id and the no-cache headers."""
    return Response(answer.body, status_code=answer.status, headers={**answer.headers, "x-request-id": request_id, **api.NO_CACHE})


class MarReplica:
    """The replica's class (app.py makes it a deployment): the archive loaded at construction, then batches of at
    most spec.batch_size requests, each batch waiting at most max_batch_delay_ms to fill, one batch at a time;
    `/predictions/<model>[/<version>][/<url_path>]` answered here (the key file's inference key checked first)."""

    def __init__(self, spec: ModelSpec, folder: str, key_file: str):
        self.spec = spec
        self.key = api.InferenceKey(key_file)
        self.versions = {spec.name: spec.version()}
        threads_as_a_workers()
        self.model_dir = extract(spec.archive, Path(folder))
        self.service = load_service(spec, self.model_dir, gpu_of_replica())
        self.batch.set_max_batch_size(spec.batch_size)
        self.batch.set_batch_wait_timeout_s(spec.max_batch_delay_ms / 1000)
        self.batch_sizes: list[int] = []  # every batch's size, in order (the tests read it)

    async def __call__(self, http: HttpRequest) -> Response:
        request_id = str(uuid.uuid4())
        return to_http(await self.answer(http, request_id), request_id)

    async def answer(self, http: HttpRequest, request_id: str) -> Answer:
        """TorchServe's answer to a request of this model's route, as the ingress gives it (app.Ingress.answer)."""
        if refused := self.key.refused(http.headers.get("authorization")):
            return refused
        route = api.route(http.url.path)
        if route is None or route.kind != "predictions":
            return api.error(404, "ResourceNotFoundException", api.NOT_FOUND)
        # a longer name under this prefix (`/predictions/<model>x`) that no application took: not served
        if missing := api.model_missing(route.model, route.version, self.versions):
            return missing
        headers = api.request_headers(http.headers.raw, route.url_path)
        sent = Request(request_id, headers, await http.body(), http.headers.get("content-type", ""))
        return await self.batch(sent)

    @serve.batch  # its size and wait set per model in __init__
    async def batch(self, requests: list[Request]) -> list[Answer]:
        self.batch_sizes.append(len(requests))
        # On the event loop, as TorchServe's worker runs a batch: one Python thread at a time. In a thread of its own
        # the batch fought the loop's HTTP work for the GIL: the seed's fused pipeline, 16 connections, 3 rounds
        # (bench ab, AMD EPYC Zen 4, 2 cores): 94-99 req/s at 18.4-19.7 CPU-ms a request against 100-112 at 16.8-18.6
        # here. The requests that arrive meanwhile wait in the sockets and form the next batch at once.
        return predict(self.service, requests)

    def seen_batch_sizes(self) -> list[int]:
        return list(self.batch_sizes)
