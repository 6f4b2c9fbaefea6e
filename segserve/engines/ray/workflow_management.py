"""TorchServe 0.12's workflow management API (`/workflows`) as its frontend answers it, for the Ray engine's
management server: list, describe, register a .war of the model store, unregister. Pure, as management_api.py: the
workflows themselves are behind management_api.Models (the driver's registry.py).

Read from pytorch/serve's frontend at 0.12 (ef196c0f1; registration was disabled in a later commit):
workflow/api/http/WorkflowMgmtRequestHandler.java (routes: 2 to 4 segments, 405 for another method; paging as
getModelList's; describe's DescribeWorkflowResponse fields in their order; unregister's message),
workflow/messages/RegisterWorkflowRequest.java (url, workflow_name, response_timeout),
workflow/WorkflowManager.java (registerWorkflow: 409 for a name registered, each node registered as a model
<workflow>__<node>, a failed node rolls back the others and answers 500 WorkflowException "Workflow X has failed to
register. Failures: [...]"; 200 "Workflow X has been registered and scaled successfully."),
archive/workflow/WorkflowArchive.java (downloadWorkflow: which url is refused how, each a 404
WorkflowNotFoundException), ensemble/WorkFlow.java (getWorkflowDag: the spec's dag as Java's Map.toString; the
workflow's own min/max workers, batch size and delay: the top-level values, the last of each).
"""

from dataclasses import dataclass
from pathlib import Path

from segserve.engines.ray.model_spec import Registered
from segserve.engines.ray.torchserve_api import NOT_ALLOWED, NOT_FOUND, URL_SCHEME, Answer, error, json_answer, status_json
from segserve.engines.ray.workflow import WorkflowPlan, dag_text, node_specs, plan_of
from segserve.errors import UsageError


@dataclass(frozen=True)
class RegisteredWorkflow:
    """A workflow registered: its name, the url it was registered with, its plan (each node's model), the
    workflow's own settings (read_war's workflow_settings) and describe's workflowDag."""

    name: str
    url: str
    plan: WorkflowPlan
    settings: dict
    dag: str

    @property
    def models(self) -> list[str]:
        return [node.model for node in self.plan.nodes.values()]


def answer(call, models, store: Path | None, defaults) -> Answer:
    """The answer to a /workflows call (management_api.answer routes it here, its key checked)."""
    segments = call.segments
    if len(segments) > 4:
        return error(404, "ResourceNotFoundException", NOT_FOUND)
    if len(segments) < 3:
        if call.method == "GET":
            return list_workflows(call, models.workflows())
        if call.method == "POST":
            return register(call, models, store, defaults)
        return error(405, "MethodNotAllowedException", NOT_ALLOWED)
    name = segments[2]
    if call.method == "GET":
        return describe(name, models.workflows())
    if call.method == "DELETE":
        if name not in models.workflows():
            return not_found(name)
        models.unregister_workflow(name)
        return status_json(f'Workflow "{name}" unregistered')
    return error(405, "MethodNotAllowedException", NOT_ALLOWED)


def not_found(name: str) -> Answer:
    return error(404, "WorkflowNotFoundException", f"Workflow not found: {name}")


def list_workflows(call, workflows: dict[str, RegisteredWorkflow]) -> Answer:
    limit, start = call.integer("limit", 100), max(call.integer("next_page_token", 0), 0)
    limit = 100 if limit > 100 or limit < 0 else limit
    names = sorted(workflows)
    page: dict = {}
    if start + limit <= len(names):
        page["nextPageToken"] = str(start + limit)
    page["workflows"] = [{"workflowName": n, "workflowUrl": workflows[n].url} for n in names[start : start + limit]]
    return json_answer(page)


def describe(name: str, workflows: dict[str, RegisteredWorkflow]) -> Answer:
    if name not in workflows:
        return not_found(name)
    workflow = workflows[name]
    settings = workflow.settings
    described = {
        "workflowName": name,
        "workflowUrl": workflow.url,
        "minWorkers": settings["min-workers"],
        "maxWorkers": settings["max-workers"],
        "batchSize": settings["batch-size"],
        "maxBatchDelay": settings["max-batch-delay"],
        "workflowDag": workflow.dag,
    }
    return json_answer([described])


def register(call, models, store: Path | None, defaults) -> Answer:
    """POST /workflows?url=X.war[&workflow_name=N]: a .war of the model store (the workflow store is the model
    store, as our config.properties has it), its nodes registered as models, each node's replicas running."""
    from segserve.archives.war import read_war

    url = call.text("url")
    if url is None:
        return error(400, "BadRequestException", "Parameter url is required.")
    if store is None:
        return error(404, "WorkflowNotFoundException", "Workflow store has not been configured.")
    if URL_SCHEME.match(url):
        return error(404, "WorkflowNotFoundException", f"Given URL {url} does not match any allowed URL(s)")
    if ".." in url:
        return error(404, "WorkflowNotFoundException", f"Relative path is not allowed in url: {url}")
    path = store / Path(url).name
    if not path.is_file():
        return error(404, "WorkflowNotFoundException", f"Workflow not found in workflow store: {url}")
    try:
        war = read_war(path, url)
    except UsageError as refused:  # TorchServe: 400 "Invalid workflow specification" (InvalidDAGException), its own words
        return error(400, "InvalidDAGException", str(refused))
    name = call.text("workflow_name") or war.name
    if name in models.workflows():
        return error(409, "ConflictStatusException", f"Workflow {name} is already registered.")
    specs = node_specs(war, name, store, defaults.job_queue_size)
    failures = [f"Model not found in model store: {war.nodes[n].url}" for n, s in specs.items() if not Path(s.archive).is_file()]
    failures += [f"Model version 1.0 is already registered for model {s.name}" for s in specs.values() if s.name in models.registered()]
    if not failures:
        timeout_s = call.integer("response_timeout", 120)
        nodes = [Registered(spec, war.nodes[node].url or url, spec.version(), timeout_s) for node, spec in specs.items()]
        workflow = RegisteredWorkflow(name, url, plan_of(war, name), dict(war.workflow_settings), dag_text(war.spec["dag"]))
        failures = models.register_workflow(workflow, nodes)
    if failures:
        message = f"Workflow {name} has failed to register. Failures: [{', '.join(failures)}]"
        return error(500, "WorkflowException", message)
    return status_json(f"Workflow {name} has been registered and scaled successfully.")
