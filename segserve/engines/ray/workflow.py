"""A user's .war on the Ray engine, as TorchServe 0.12 runs it: each node a model `<workflow>__<node>` of its own (a
Serve application, registry.py), the DAG composed in the ingress with DeploymentHandles (app.py). Pure: the ingress
hands `answer` a coroutine that calls one node's deployment, the tests a stand-in.

What each node gets and what /wfpredict answers is DagExecutor.java's and WorkflowManager.java's (docs/fuse.md has
the facts and their sources; segserve/fuse/fused_handler.py runs the same DAG in one worker):
- the start node the request's own parameters (a form's fields and files, else one `body` with the request's type);
  a child of one parent `body`, its parent's bytes; a join one parameter per parent, named after it; none of these
  with a content type; every node the request's headers (not /predictions' url_path and explain);
- a node's answer is its bytes only: a row a handler refused (a status it set) goes on as its body;
- a call that fails (the worker failed the batch: the handler raised, answered another number of rows; or no answer
  within the node's timeout-ms) is sent again, retry-attempts times (invokeModel: attempts 0 to retry-attempts);
  still failing, the request is answered 500 "Error executing <node>" (the last ':'-piece of the executor's error);
- one leaf: its bytes as application/json; several: {leaf: its answer as a JSON object}, Gson pretty, a newline.
Nodes run as soon as their parents answered, as TorchServe runs them. Unlike TorchServe's DagExecutor (which loses an
answer that comes back before its promise is set, docs/torchserve_workflows.md), each call awaits its own result.

The leaves' combination and the 500 envelope are fused_handler.py's own functions, imported from its file by path as
the fused .mar imports it (it ships inside a .mar and imports nothing of segserve; segserve.fuse is a higher layer).
"""

import asyncio
import functools
import importlib.util
import sys
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import SimpleNamespace

from segserve.engines.ray.model_spec import ModelSpec
from segserve.engines.ray.torchserve_api import Answer

FUSED_HANDLER = Path(__file__).resolve().parents[2] / "fuse" / "fused_handler.py"


@dataclass(frozen=True)
class NodePlan:
    model: str  # the model (and Serve deployment) that runs the node: <workflow>__<node>
    retry_attempts: int
    timeout_ms: int


@dataclass(frozen=True)
class WorkflowPlan:
    """read_war's DAG of one registered workflow, as the ingress runs it (a plain dict in its user_config)."""

    name: str
    order: list[str]  # parents before children
    parents: dict[str, list[str]]  # in `order`'s order: a join's parameters in that order
    leaves: list[str]
    nodes: dict[str, NodePlan]

    def to_config(self) -> dict:
        return asdict(self)

    @classmethod
    def from_config(cls, config: dict) -> "WorkflowPlan":
        return cls(**{**config, "nodes": {n: NodePlan(**p) for n, p in config["nodes"].items()}})


def model_name(workflow: str, node: str) -> str:
    """The model TorchServe registers for a workflow's node (WorkFlow.java)."""
    return f"{workflow}__{node}"


def plan_of(war, name: str) -> WorkflowPlan:
    """The plan of a read_war WarSpec registered as `name`."""
    nodes = {
        node: NodePlan(model_name(name, node), spec.settings["retry-attempts"], spec.settings["timeout-ms"])
        for node, spec in war.nodes.items()
    }
    return WorkflowPlan(name, list(war.order), {n: list(war.parents[n]) for n in war.order}, list(war.leaves), nodes)


def node_specs(war, name: str, store: Path, job_queue_size: int) -> dict[str, ModelSpec]:
    """Each node's model as TorchServe registers it: a model node its .mar of the model store with the node's
    settings (min-workers the fixed replicas); a function node the .war itself with `<function file>:<node>` as its
    handler, one worker, batch size 1, delay 0 (read_war's settings for it)."""
    specs = {}
    for node, spec in war.nodes.items():
        settings = spec.settings
        specs[node] = ModelSpec(
            model_name(name, node),
            str(war.path) if spec.is_function else str(store / spec.url),
            batch_size=max(settings["batch-size"], 1),
            max_batch_delay_ms=settings["max-batch-delay"],
            workers=settings["min-workers"],
            job_queue_size=job_queue_size,
            handler=f"{war.functions_file}:{node}" if spec.is_function else None,
        )
    return specs


def dag_text(dag: dict) -> str:
    """The spec's dag as describe's workflowDag shows it: Java's LinkedHashMap.toString of what SnakeYAML read."""

    def java(value) -> str:
        if value is None:
            return "null"
        if isinstance(value, list):
            return "[" + ", ".join(java(v) for v in value) + "]"
        if isinstance(value, bool):
            return str(value).lower()
        return str(value)

    return "{" + ", ".join(f"{key}={java(value)}" for key, value in dag.items()) + "}"


class NodeFailed(Exception):
    """A node failed a request on every attempt: /wfpredict answers 500 "Error executing <node>"."""

    def __init__(self, node: str):
        super().__init__(node)
        self.node = node


NodeCall = Callable[[str, object], Awaitable[Answer]]  # (model, replica.Request) → the node's answer to it


def node_request(request, parents: list[str], answers: dict[str, bytes]):
    """What DagExecutor sends a node (a replica.Request): the start node the request itself, a child of one parent
    `body`, a join one parameter per parent named after it; each with a request id of its own and the request's
    headers."""
    fresh = replace(request, request_id=str(uuid.uuid4()))
    if not parents:
        return fresh
    names = ["body"] if len(parents) == 1 else parents
    parameters = tuple((name, "", answers[parent]) for name, parent in zip(names, parents, strict=True))
    return replace(fresh, body=b"", content_type="", parameters=parameters)


async def call_node(node: str, plan: NodePlan, request, call: NodeCall) -> bytes:
    """The node's bytes for the request, sent again retry_attempts times after a failed or timed-out call."""
    for _ in range(1 + plan.retry_attempts):
        try:
            answer = await asyncio.wait_for(call(plan.model, request), plan.timeout_ms / 1000)
        except Exception:  # noqa: BLE001 -- any failure is a failed attempt (TorchServe: ExecutionException, timeout)
            continue
        if not answer.failed:
            return answer.body
    raise NodeFailed(node)


async def answer(plan: WorkflowPlan, request, call: NodeCall) -> Answer:
    """/wfpredict's answer to one request (replica.Request of the HTTP request, headers as the client sent them)."""
    done: dict[str, asyncio.Task] = {}

    async def run(node: str) -> bytes:
        parents = plan.parents[node]
        answers = dict(zip(parents, await asyncio.gather(*(done[p] for p in parents)), strict=True))
        return await call_node(node, plan.nodes[node], node_request(request, parents, answers), call)

    for node in plan.order:  # parents first: each task finds its parents' tasks
        done[node] = asyncio.ensure_future(run(node))
    try:
        leaves = await asyncio.gather(*(done[leaf] for leaf in plan.leaves))
    except NodeFailed as failed:  # the first node to fail for good, as the executor's first failed future
        return converted(fused().workflow_error(f"Error executing {failed.node}"))
    finally:
        for task in done.values():
            task.cancel()
    if len(leaves) == 1:
        return Answer(200, {"content-type": "application/json"}, leaves[0])
    module = fused()
    outputs = {leaf: [module.Answer(200, None, body)] for leaf, body in zip(plan.leaves, leaves, strict=True)}
    return converted(module.FusedWorkflow._combined(SimpleNamespace(leaves=plan.leaves), outputs, 0))


def converted(fused_answer) -> Answer:
    return Answer(fused_answer.status, {"content-type": fused_answer.content_type}, fused_answer.body)


@functools.cache
def fused():
    """fused_handler.py imported from its file (it imports torch and ts: only where a workflow answers)."""
    name = "_segserve_ray_fused_handler"
    spec = importlib.util.spec_from_file_location(name, FUSED_HANDLER)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
