"""The Ray Serve application: one deployment per model (replica.MarReplica: its workers as fixed replicas, its job
queue as max_queued_requests) behind one ingress that answers TorchServe's inference API on Serve's one HTTP port.

The ingress checks the inference key of TorchServe's key_file.json on every request, before any route, as
TorchServe's TokenAuthorizationHandler does: the key is checked in the ingress deployment itself, so an ingress
replica's own HTTP port (direct ingress, HAProxy mode) asks for it too. Then `GET /ping` and
`POST /predictions/{model}[/{version}]` (torchserve_api.route); anything else is TorchServe's 404.
"""

import json
import uuid
from pathlib import Path

from ray import serve
from ray.serve.exceptions import BackPressureError
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from segserve.engines.ray import torchserve_api as api
from segserve.engines.ray.replica import MarReplica, ModelSpec, Request

# Ray's default is 5 requests in a replica at once: a batch could never fill past it. TorchServe hands a worker a
# batch while the next one queues in the frontend: room for two batches.
BATCHES_IN_A_REPLICA = 2
INGRESS_MAX_ONGOING = 4096  # the ingress only routes: what TorchServe's netty threads would hold open


class Ingress:
    """TorchServe's inference API in front of the models' deployments (handles, by model name)."""

    def __init__(self, models: dict, versions: dict[str, str], key_file: str):
        self.models, self.versions = models, versions
        self.key = json.loads(Path(key_file).read_text())["inference"]["key"]

    async def __call__(self, http: HttpRequest) -> Response:
        request_id = str(uuid.uuid4())
        answer = await self.answer(http, request_id)
        headers = {**answer.headers, "x-request-id": request_id, **api.NO_CACHE}
        return Response(answer.body, status_code=answer.status, headers=headers)

    async def answer(self, http: HttpRequest, request_id: str) -> api.Answer:
        if refused := api.key_refused(http.headers.get("authorization"), self.key):
            return refused
        route = api.route(http.url.path)
        if route is None:
            return api.error(404, "ResourceNotFoundException", api.NOT_FOUND)
        if route.kind == "ping":
            return api.status_json("Healthy")  # serve.run returned: every model's replicas are up
        if missing := api.model_missing(route.model, route.version, self.versions):
            return missing
        headers = api.request_headers(http.headers.raw, route.url_path)
        sent = Request(request_id, headers, await http.body(), http.headers.get("content-type", ""))
        try:
            return await self.models[route.model].batch.remote(sent)
        except BackPressureError:
            return api.queue_full(route.model, route.version)

    async def batch_sizes(self, model: str) -> list[int]:
        """Every batch size the model's replicas ran, in order per replica (the tests check batching with it)."""
        return await self.models[model].seen_batch_sizes.remote()


def build_app(specs: list[ModelSpec], key_file: str, folder: str):
    """The application: each model's deployment, bound into the ingress."""
    models, versions = {}, {}
    for spec in specs:
        options = {
            "name": spec.name,
            "num_replicas": spec.workers,
            "max_ongoing_requests": BATCHES_IN_A_REPLICA * spec.batch_size,
            "max_queued_requests": spec.job_queue_size,
            # logical CPUs only place replicas: TorchServe's workers reserve no cores either
            "ray_actor_options": {"num_cpus": 0},
        }
        models[spec.name] = serve.deployment(MarReplica).options(**options).bind(spec, folder)
        versions[spec.name] = spec.version()
    ingress = serve.deployment(Ingress).options(
        name="ingress", num_replicas=1, max_ongoing_requests=INGRESS_MAX_ONGOING, ray_actor_options={"num_cpus": 0}
    )
    return ingress.bind(models, versions, key_file)
