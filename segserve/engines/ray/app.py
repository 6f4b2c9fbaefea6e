"""The Ray Serve applications: each model an application of its own at the route `/predictions/<model>`, one
deployment (replica.MarReplica: its workers as fixed replicas, its job queue as max_queued_requests) that answers
its own requests (one hop: Serve's proxy or HAProxy sends them straight to a replica), and one ingress application
at `/` for the rest of TorchServe's inference API on Serve's one HTTP port: /ping, /wfpredict (the nodes called
through DeploymentHandles), and the 404s of unknown paths and models (Serve takes the longest route prefix).

The ingress and each model's replica check the inference key of TorchServe's key_file.json on every request, before
any route, as TorchServe's TokenAuthorizationHandler does: the key is checked in the deployment itself, so a
replica's own HTTP port (direct ingress, HAProxy mode) asks for it too. The file is read again when it changes (the
management API's /token renews a key). Then `GET /ping` and `POST /predictions/{model}[/{version}]`
(torchserve_api.route), and `POST /wfpredict/{workflow}`: a registered .war's DAG composed here, each node's
deployment called through its handle (workflow.answer); anything else is TorchServe's 404.

Which models there are (and their versions) and which workflows (their DAGs) reach the ingress as its user_config:
registering, scaling and unregistering a model (registry.py) redeploy only that model's application and the
ingress's user_config. Every
deployment carries a fixed version, so that Serve updates a running one in place (num_replicas: replicas added or
removed, the others untouched; user_config: reconfigure() on the running ingress) instead of replacing its replicas,
which Serve does for a deployment without one (serve.run gives it a random version each time). Setting it takes
Serve's internal flag of Deployment.options (Ray 2.60 removed `version` from the public options).
"""

import uuid

from ray import serve
from ray.serve.exceptions import BackPressureError
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from segserve.engines.ray import torchserve_api as api
from segserve.engines.ray import workflow
from segserve.engines.ray.replica import MarReplica, ModelSpec, Request, to_http

# Ray's default is 5 requests in a replica at once: a batch could never fill past it. TorchServe hands a worker a
# batch while the next one queues in the frontend: room for two batches.
BATCHES_IN_A_REPLICA = 2
INGRESS_MAX_ONGOING = 4096  # the ingress only routes: what TorchServe's netty threads would hold open


INGRESS_APP = "torchserve"
VERSION = "segserve"  # the fixed version of every deployment (see above)


def model_route(model: str) -> str:
    """A model's own route prefix (TorchServe's model names are letters, digits, '_', '-' and '.': no escaping)."""
    return f"/predictions/{model}"


def model_app_name(model: str) -> str:
    """A model's Serve application (TorchServe's model names cannot hold ':', so no model's is the ingress's)."""
    return f"model:{model}"


class Ingress:
    """TorchServe's inference API in front of the models' deployments (handles, by model name)."""

    def __init__(self, key_file: str):
        self.key = api.InferenceKey(key_file)
        self.versions: dict[str, str] = {}
        self.workflows: dict[str, workflow.WorkflowPlan] = {}
        self.handles: dict = {}

    def reconfigure(self, config: dict) -> None:
        """The served models and their versions, the workflows and their DAGs (user_config: set again on the running
        replica, never restarted)."""
        self.versions = dict(config["versions"])
        self.workflows = {name: workflow.WorkflowPlan.from_config(plan) for name, plan in config.get("workflows", {}).items()}
        self.handles = {name: handle for name, handle in self.handles.items() if name in self.versions}

    def handle(self, model: str):
        if model not in self.handles:
            self.handles[model] = serve.get_deployment_handle(model, app_name=model_app_name(model), _check_exists=False)
        return self.handles[model]

    async def __call__(self, http: HttpRequest) -> Response:
        request_id = str(uuid.uuid4())
        return to_http(await self.answer(http, request_id), request_id)

    async def answer(self, http: HttpRequest, request_id: str) -> api.Answer:
        if refused := self.key.refused(http.headers.get("authorization")):
            return refused
        route = api.route(http.url.path)
        if route is None:
            return api.error(404, "ResourceNotFoundException", api.NOT_FOUND)
        if route.kind == "ping":
            return api.status_json("Healthy")  # every registered model's replicas were up when it was registered
        if route.kind == "wfpredict":
            return await self.workflow_answer(http, request_id, route.model)
        # a model's own route answers its requests (replica.MarReplica); here only a name no application serves,
        # or one registered an instant ago whose route Serve's proxy has not learnt yet
        if missing := api.model_missing(route.model, route.version, self.versions):
            return missing
        headers = api.request_headers(http.headers.raw, route.url_path)
        sent = Request(request_id, headers, await http.body(), http.headers.get("content-type", ""))
        try:
            return await self.handle(route.model).batch.remote(sent)
        except BackPressureError:
            return api.queue_full(route.model, route.version)

    async def workflow_answer(self, http: HttpRequest, request_id: str, name: str) -> api.Answer:
        """/wfpredict/{name}: its DAG with the request's own headers (no url_path, explain: TorchServe adds none)."""
        if name not in self.workflows:
            return api.error(404, "WorkflowNotFoundException", f"Workflow not found: {name}")
        sent = Request(request_id, list(http.headers.raw), await http.body(), http.headers.get("content-type", ""))
        return await workflow.answer(self.workflows[name], sent, self.call_node)

    async def call_node(self, model: str, sent: Request) -> api.Answer:
        return await self.handle(model).batch.remote(sent)

    async def batch_sizes(self, model: str) -> list[int]:
        """Every batch size the model's replicas ran, in order per replica (the tests check batching with it)."""
        return await self.handle(model).seen_batch_sizes.remote()


def model_app(spec: ModelSpec, folder: str, key_file: str):
    """One model's application: its deployment, `spec.workers` fixed replicas (serve.run it at model_route)."""
    options = {
        "name": spec.name,
        "num_replicas": spec.workers,
        "max_ongoing_requests": BATCHES_IN_A_REPLICA * spec.batch_size,
        "max_queued_requests": spec.job_queue_size,
        # logical CPUs only place replicas: TorchServe's workers reserve no cores either
        "ray_actor_options": {"num_cpus": 0},
    }
    return serve.deployment(MarReplica).options(**options, version=VERSION, _internal=True).bind(spec, folder, key_file)


def ingress_app(key_file: str, versions: dict[str, str], workflows: dict[str, dict] | None = None):
    """The ingress application; `versions`: each served model's version (its manifest's modelVersion); `workflows`:
    each registered workflow's plan (workflow.WorkflowPlan.to_config)."""
    ingress = serve.deployment(Ingress).options(
        name="ingress",
        num_replicas=1,
        max_ongoing_requests=INGRESS_MAX_ONGOING,
        ray_actor_options={"num_cpus": 0},
        user_config={"versions": versions, "workflows": workflows or {}},
        version=VERSION,
        _internal=True,
    )
    return ingress.bind(key_file)
