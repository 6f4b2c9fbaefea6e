"""A .war on the Ray engine, its pure parts (segserve/engines/ray/workflow.py, workflow_management.py): the DAG
composed with stand-in node calls in place of DeploymentHandles (what each node is sent, joins, a refused row handed
on, a failed or timed-out call sent again then TorchServe's 500, leaves combined as /wfpredict combines them, each
request its own answer), the plan and node models read from a .war, and the /workflows management API with the
workflows kept in memory. No Ray started (tests/integration/test_ray_workflow.py does, beside a real TorchServe)."""

import asyncio
import json
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from segserve.archives.war import read_war
from segserve.engines.ray import management_api as api
from segserve.engines.ray import workflow
from segserve.engines.ray.replica import Request
from segserve.engines.ray.torchserve_api import Answer, error, new_keys
from tests.system import workflow_shapes as shapes
from tests.unit.test_ray_management import InMemory

ERROR_EXECUTING = b'{\n  "code": 500,\n  "type": "InternalServerException",\n  "message": "Error executing %s"\n}\n'
HEADERS = [(b"Content-Length", b"7"), (b"animal", b"in a header")]


def war_file(folder: Path, name: str, spec: str, functions: str = "") -> Path:
    """A .war as torch-workflow-archiver writes one (its manifest, the spec, the function file)."""
    manifest = {"workflow": {"workflowName": name, "specFile": f"{name}.yaml", "handler": f"{name}_functions.py"}}
    with zipfile.ZipFile(folder / f"{name}.war", "w") as war:
        war.writestr("WAR-INF/MANIFEST.json", json.dumps(manifest))
        war.writestr(f"{name}.yaml", spec)
        war.writestr(f"{name}_functions.py", functions)
    return folder / f"{name}.war"


def mar_file(folder: Path, name: str) -> None:
    with zipfile.ZipFile(folder / f"{name}.mar", "w") as mar:
        mar.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": {"modelName": name, "modelVersion": "1.0", "handler": f"{name}.py"}}))


@pytest.fixture
def store(tmp_path) -> Path:
    for name in ("animal", "breed"):
        mar_file(tmp_path, name)
    war_file(tmp_path, "dogbreed", shapes.DOGBREED_SPEC, shapes.DOGBREED_FUNCTIONS)
    war_file(tmp_path, "fanout", "models:\n  a: {url: animal.mar}\ndag:\n  split: [a, b]\n", "def split(d, c):\n    return d\n")
    return tmp_path


def plan(store: Path, name: str = "dogbreed") -> workflow.WorkflowPlan:
    return workflow.plan_of(read_war(store / f"{name}.war"), name)


def ok(body: bytes, status: int = 200) -> Answer:
    return Answer(status, {"content-type": "text/plain"}, body)


def run(plan_, call, body: bytes = b"dog-rex", content_type: str = "text/plain") -> Answer:
    return asyncio.run(workflow.answer(plan_, Request("r1", HEADERS, body, content_type), call))


def test_each_node_is_sent_what_torchserves_dag_executor_sends_it(store):
    """The start node the request's own parameter with its type; a child of one parent `body`; a join one parameter
    per parent, named after it, in DAG order; none with a content type; every node the request's headers."""
    sent = {}

    async def call(model, request):
        sent[model] = request
        return ok(model.encode())

    answer = run(plan(store), call)
    assert (answer.status, answer.headers, answer.body) == (200, {"content-type": "application/json"}, b"dogbreed__breed")
    start, animal, breed = (sent[f"dogbreed__{n}"] for n in ("pre_processing", "animal", "breed"))
    assert (start.body, start.content_type, start.parameters) == (b"dog-rex", "text/plain", None)
    assert animal.parameters == (("body", "", b"dogbreed__pre_processing"),)
    assert breed.parameters == (("pre_processing", "", b"dogbreed__pre_processing"), ("animal", "", b"dogbreed__animal"))
    assert all(r.headers == HEADERS for r in sent.values())  # no url_path or explain: /wfpredict adds none
    assert len({r.request_id for r in sent.values()} | {"r1"}) == 4  # a request id of its own for each node
    worker = breed.worker_request()["parameters"]  # as the worker decodes them: bytearrays without a content type
    assert worker == [
        {"name": "pre_processing", "contentType": "", "value": bytearray(b"dogbreed__pre_processing")},
        {"name": "animal", "contentType": "", "value": bytearray(b"dogbreed__animal")},
    ]


def test_a_refused_row_is_handed_on_as_its_body_and_the_workflow_answers_200(store):
    async def call(model, request):
        if model == "dogbreed__animal":
            return Answer(400, {"content-type": "application/json"}, b'{"error": "not an animal"}')
        return ok(b"leaf got " + bytes(request.parameters[-1][2]) if request.parameters else b"start")

    answer = run(plan(store), call)
    assert (answer.status, answer.body) == (200, b'leaf got {"error": "not an animal"}')


def test_a_failed_node_is_sent_again_retry_attempts_times_then_answered_torchserves_500(store):
    calls = []

    async def call(model, request):
        calls.append(model)
        if model == "dogbreed__animal":
            return replace(error(503, "InternalServerException", "Prediction failed"), failed=True)  # the batch failed
        return ok(b"x")

    answer = run(plan(store), call)
    assert (answer.status, answer.headers, answer.body) == (500, {"content-type": "application/json"}, ERROR_EXECUTING % b"animal")
    assert calls.count("dogbreed__animal") == 1 + 2  # the spec's retry-attempts: 2
    assert "dogbreed__breed" not in calls  # its other branches are dropped


def test_a_handler_status_of_503_is_a_refusal_not_a_failure_and_a_raising_call_is_a_failure(store):
    async def refusing(model, request):
        return ok(b"busy", 503)  # the handler set it: handed on

    assert run(plan(store), refusing).status == 200

    async def raising(model, request):
        raise RuntimeError("the replica died")

    assert run(plan(store), raising).body == ERROR_EXECUTING % b"pre_processing"


def test_a_call_past_the_nodes_timeout_ms_is_sent_again(store):
    tries = []

    async def slow_once(model, request):
        tries.append(model)
        if model == "dogbreed__animal" and tries.count(model) == 1:
            await asyncio.sleep(1)
        return ok(b"x")

    dogbreed = plan(store)
    fast = replace(dogbreed, nodes={**dogbreed.nodes, "animal": replace(dogbreed.nodes["animal"], timeout_ms=200)})
    answer = run(fast, slow_once)
    assert answer.status == 200 and tries.count("dogbreed__animal") == 2


def test_several_leaves_are_combined_as_workflow_manager_combines_them(store):
    fanout = plan(store, "fanout")
    assert fanout.leaves == ["a", "b"]

    async def call(model, request):
        return ok({"fanout__a": b'{"n": 1.50, "s": "<\\u00e9>"}', "fanout__b": b'{"k": [1, true]}'}.get(model, b"start"))

    answer = run(fanout, call)
    assert (answer.status, answer.headers) == (200, {"content-type": "application/json"})
    # Gson, pretty: numbers as written, HTML not escaped, a final newline
    assert (
        answer.body
        == '{\n  "a": {\n    "n": 1.50,\n    "s": "<é>"\n  },\n  "b": {\n    "k": [\n      1,\n      true\n    ]\n  }\n}\n'.encode()
    )

    async def text_leaf(model, request):
        return ok(b"not json" if model == "fanout__b" else b"{}")

    refused = run(fanout, text_leaf)
    assert refused.status == 500 and json.loads(refused.body)["type"] == "InternalServerException"


def test_each_of_many_concurrent_requests_gets_its_own_answer(store):
    """The answers come back out of order; each request still gets its own (TorchServe's DagExecutor can lose one)."""

    async def call(model, request):
        await asyncio.sleep(0.001 * (hash(request.request_id) % 7))
        return ok(bytes(request.body or request.parameters[-1][2]))

    async def many():
        return await asyncio.gather(
            *(workflow.answer(plan(store), Request(f"r{i}", [], f"row {i}".encode(), "text/plain"), call) for i in range(64))
        )

    assert [a.body for a in asyncio.run(many())] == [f"row {i}".encode() for i in range(64)]


def test_the_nodes_are_registered_as_torchserve_registers_a_workflows_models(store):
    war = read_war(store / "dogbreed.war")
    specs = workflow.node_specs(war, "dogs", store, job_queue_size=7)
    start, animal = specs["pre_processing"], specs["animal"]
    assert (start.name, start.archive, start.handler, start.batch_size, start.max_batch_delay_ms, start.workers) == (
        "dogs__pre_processing",
        str(store / "dogbreed.war"),
        "dogbreed_functions.py:pre_processing",
        1,
        0,
        1,
    )
    assert (animal.archive, animal.handler, animal.batch_size, animal.max_batch_delay_ms, animal.job_queue_size) == (
        str(store / "animal.mar"),
        None,
        4,
        100,
        7,
    )
    the_plan = workflow.plan_of(war, "dogs")
    assert the_plan.nodes["breed"] == workflow.NodePlan("dogs__breed", 2, 2000)
    assert workflow.WorkflowPlan.from_config(json.loads(json.dumps(the_plan.to_config()))) == the_plan
    assert workflow.dag_text(war.spec["dag"]) == "{pre_processing=[animal, breed], animal=[breed]}"
    assert workflow.dag_text({"seg": None, "x": []}) == "{seg=null, x=[]}"


class WithWorkflows(InMemory):
    def __init__(self, fail: str | None = None):
        super().__init__()
        self.workflow_set, self.fail = {}, fail

    def workflows(self):
        return dict(self.workflow_set)

    def register_workflow(self, registered, nodes):
        if self.fail:
            return [self.fail]
        for node in nodes:
            self.register(node)
        self.workflow_set[registered.name] = registered
        return []

    def unregister_workflow(self, name):
        for model in self.workflow_set.pop(name).models:
            self.unregister(model)


def test_the_workflow_management_api_answers_as_torchserve(store):
    keys, models = new_keys(), WithWorkflows()

    def call(method: str, target: str, on=models):
        answer = api.answer(api.parse(method, target), f"Bearer {keys['management']['key']}", keys, on, store, api.Defaults())
        return answer.status, json.loads(answer.body)

    assert call("POST", "/workflows?url=dogbreed.war&workflow_name=dogs") == (
        200,
        {"status": "Workflow dogs has been registered and scaled successfully."},
    )
    assert sorted(models.registered()) == ["dogs__animal", "dogs__breed", "dogs__pre_processing"]
    listed = api.answer(api.parse("GET", "/models"), f"Bearer {keys['management']['key']}", keys, models, store, api.Defaults())
    assert [m["modelName"] for m in json.loads(listed.body)["models"]] == ["dogs__animal", "dogs__breed"]  # as TorchServe lists them
    assert call("POST", "/workflows?url=dogbreed.war&workflow_name=dogs") == (
        409,
        {"code": 409, "type": "ConflictStatusException", "message": "Workflow dogs is already registered."},
    )
    assert call("GET", "/workflows") == (200, {"workflows": [{"workflowName": "dogs", "workflowUrl": "dogbreed.war"}]})
    assert call("GET", "/workflows/dogs") == (
        200,
        [
            {
                "workflowName": "dogs",
                "workflowUrl": "dogbreed.war",
                "minWorkers": 1,
                "maxWorkers": 1,
                "batchSize": 4,
                "maxBatchDelay": 100,
                "workflowDag": "{pre_processing=[animal, breed], animal=[breed]}",
            }
        ],
    )
    assert call("DELETE", "/workflows/dogs") == (200, {"status": 'Workflow "dogs" unregistered'})
    assert models.registered() == {} and models.workflows() == {}
    gone = {"code": 404, "type": "WorkflowNotFoundException", "message": "Workflow not found: dogs"}
    assert call("GET", "/workflows/dogs") == (404, gone) and call("DELETE", "/workflows/dogs") == (404, gone)
    assert call("PUT", "/workflows/dogs")[0] == 405 and call("PUT", "/workflows")[0] == 405
    assert call("POST", "/workflows")[1]["message"] == "Parameter url is required."
    assert call("POST", "/workflows?url=nowhere.war")[1] == {
        "code": 404,
        "type": "WorkflowNotFoundException",
        "message": "Workflow not found in workflow store: nowhere.war",
    }
    assert call("POST", "/workflows?url=../dogbreed.war")[1]["message"] == "Relative path is not allowed in url: ../dogbreed.war"
    assert call("POST", "/workflows?url=https://x/dogbreed.war")[0] == 404
    why = "Failed to start workers for model dogbreed__animal version: 1.0: boom"
    failing = WithWorkflows(fail=why)
    assert call("POST", "/workflows?url=dogbreed.war", on=failing) == (
        500,
        {
            "code": 500,
            "type": "WorkflowException",
            "message": f"Workflow dogbreed has failed to register. Failures: [{why}]",
        },
    )
    (store / "breed.mar").unlink()
    assert "Model not found in model store: breed.mar" in call("POST", "/workflows?url=dogbreed.war")[1]["message"]
