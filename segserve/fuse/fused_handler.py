"""The handler of a fused workflow (`segserve fuse`): a TorchServe workflow's DAG run inside one worker.

Shipped inside the fused .mar as its handler, so it imports nothing of segserve: only the standard library and what
TorchServe provides. The archive holds fused_workflow.json (the DAG, written by segserve fuse), each model node's
archive extracted under nodes/<node>/, and the .war (its function file) extracted under workflow/.

Each node is loaded as a TorchServe worker loads a model (ts/model_loader.py): its own Context, its handler module
imported from its own folder, a `handle` function or the module's one class. Between nodes each row's output is
encoded as a worker encodes a response (ts/protocol/otf_message_handler.py) and handed on as DagExecutor.java hands
it: a child of one parent gets {"body": bytearray}, a join one entry per parent named after it, each with the
request's headers. What a row is answered follows /wfpredict (WorkflowManager.java, RestJob.java): a node's status is
dropped between nodes, a batch a node fails is sent again, and a row that still fails is answered 500 "Error executing
<node>"; or, with row_errors "node", a row a node refuses or fails stops there with that node's answer. docs/fuse.md
has the facts and their sources. Nothing a node sets reaches the worker's answer unchecked (its nodes are a user's
code): the status line carries the status's fixed phrase, a content type goes on only if it is safe header text.
"""

import http
import importlib
import importlib.util
import io
import json
import logging
import os
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch
import ts
from ts.context import Context, RequestProcessor
from ts.utils.util import PredictionException, get_yaml_config, list_classes_from_module

logger = logging.getLogger(__name__)

PLAN_FILE = "fused_workflow.json"
FAILED_STATUS = 503  # what a TorchServe worker answers for a handler that raised ("Prediction failed")
MAX_HEADER_CHARS = 256
DEFAULT_CONTENT_TYPE = "application/octet-stream"  # for a row whose node set a content type that cannot be sent


# A reason phrase or header value with CR/LF is refused by netty, a lone surrogate or a non-str fails the worker's
# encoding after its handler's try block: either kills the worker. (handlers/base.py has the same two for segserve's
# handlers; this file imports nothing of segserve.)
def status_phrase(status: int) -> str:
    return next((known.phrase for known in http.HTTPStatus if known == status), "Unknown Status")


def safe_header_text(value) -> bool:
    return isinstance(value, str) and len(value) <= MAX_HEADER_CHARS and value.isascii() and value.isprintable()


@dataclass
class Answer:
    """One row's result from one node: its status and content type, as the worker would send them, and its body
    encoded as bytes; `failed` when the node failed the row's batch every time it was sent (the body then says why)."""

    status: int
    content_type: str | None
    body: bytes
    failed: bool = False

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300 and not self.failed


def error_answer(status: int, message: str, failed: bool = False, **fields) -> Answer:
    return Answer(status, "application/json", json.dumps({"error": message, **fields}).encode(), failed)


def workflow_error(message: str) -> Answer:
    """/wfpredict's 500: NettyUtils.sendError's ErrorResponse, Gson pretty with a final newline. For a node that failed
    a request every time the message is "Error executing <node>" (the last ':'-piece of DagExecutor.java's exception)."""
    error = {"code": JsonNumber("500"), "type": "InternalServerException", "message": message}
    return Answer(500, "application/json", (gson_pretty(error) + "\n").encode("utf-8"))


class BatchFailed(Exception):
    """A node's batch failed as a whole, as the worker fails it (not a list, wrong length, an output it cannot send)."""


@dataclass
class Node:
    name: str
    entry: object  # handle(data, context)
    context: Context
    one_row_at_a_time: bool  # a workflow function node: TorchServe registers it with batch size 1
    retry_attempts: int  # after a failed batch, how often each of its rows is sent again, alone

    def run(self, rows: list, headers: list[dict], request_ids: list) -> list[Answer]:
        """Each row's answer. A batch the node fails is sent again row by row, as the frontend sends each request of
        it again (DagExecutor.invokeModel); a row that fails its last try is answered failed."""
        size = 1 if self.one_row_at_a_time else len(rows)
        answers = []
        for start in range(0, len(rows), size):
            batch = slice(start, start + size)
            try:
                answers += self._call(rows[batch], headers[batch], request_ids[batch])
            except Exception as error:
                logger.warning("node %s failed a batch of %d", self.name, len(rows[batch]), exc_info=True)
                answers += [self._retried(rows[i], headers[i], request_ids[i], error) for i in range(start, start + len(rows[batch]))]
        return answers

    def _retried(self, row, headers: dict, request_id, error: Exception) -> Answer:
        for _ in range(self.retry_attempts):
            try:
                return self._call([row], [headers], [request_id])[0]
            except Exception as again:
                logger.warning("node %s failed a row sent again", self.name, exc_info=True)
                error = again
        if isinstance(error, PredictionException) and valid_status(error.error_code):
            # a handler's message for its client, as a worker of its own sends it (in the JSON body)
            return error_answer(error.error_code, f"node {self.name}: {error.message}", failed=True)
        if isinstance(error, BatchFailed):
            return error_answer(FAILED_STATUS, f"node {self.name} {error}", failed=True)
        # what broke is the node's code's business: the client gets an id, the worker's log the exception
        request_id = request_id or uuid.uuid4().hex
        logger.error("request %s: node %s failed it: %s: %s", request_id, self.name, type(error).__name__, error)
        message = f"node {self.name} failed (request id {request_id})"
        return error_answer(FAILED_STATUS, message, failed=True, request_id=request_id)

    def _call(self, rows: list, headers: list[dict], request_ids: list) -> list[Answer]:
        self.context.request_ids = dict(enumerate(request_ids))
        self.context.request_processor = [RequestProcessor(dict(h)) for h in headers]
        out = self.entry(rows, self.context)
        if not isinstance(out, list) or len(out) != len(rows):
            got = f"{len(out)} rows" if isinstance(out, list) else f"a {type(out).__name__}, not a list"
            raise BatchFailed(f"answered {got} for a batch of {len(rows)}")
        answers = []
        for idx, value in enumerate(out):
            status = self.context.get_response_status(idx)[0] or 200
            if not valid_status(status):  # a worker of its own could not send it: the frontend sends the batch again
                logger.warning("node %s set the status %.40r for a row", self.name, status)
                raise BatchFailed("set a status that is not an HTTP status (an int of 100 to 599) for a row")
            try:
                body = as_bytes(value)
            except TypeError:
                raise BatchFailed(f"unsupported output type {type(value).__name__}") from None
            answers.append(Answer(status, self._content_type(idx), body))
        return answers

    def _content_type(self, idx: int) -> str | None:
        """The content type the node set for a row; one that is no safe header text is logged and replaced."""
        content_type = self.context.get_response_content_type(idx)
        if content_type is None or safe_header_text(content_type):
            return content_type
        why = f"a {type(content_type).__name__}" if not isinstance(content_type, str) else f"{len(content_type)} chars"
        logger.warning(
            "node %s set a content type that cannot be sent (%s, %.60r: not a str of printable ASCII of at most %d chars); "
            "answered %s instead",
            self.name,
            why,
            content_type,
            MAX_HEADER_CHARS,
            DEFAULT_CONTENT_TYPE,
        )
        return DEFAULT_CONTENT_TYPE


def valid_status(status) -> bool:
    """A status a worker can send and netty can answer: an int of 100 to 599 (a str fails struct.pack)."""
    return isinstance(status, int) and not isinstance(status, bool) and 100 <= status <= 599


def as_bytes(value) -> bytes:
    """A node's output for one row as the worker sends it to the frontend (create_predict_response)."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, torch.Tensor):
        buffer = io.BytesIO()
        torch.save(value, buffer)
        return buffer.getvalue()
    return json.dumps(value, indent=2).encode("utf-8")


# Loading nodes -----------------------------------------------------------------------------------------------


class node_folder:
    """While a node's handler is imported and initialised: its folder first on sys.path and as the working
    directory, as for a worker of its own; afterwards its own modules leave sys.modules (its handler keeps them),
    so another node's module of the same file name is imported from that node's folder."""

    def __init__(self, folder: Path):
        self.folder = str(folder.resolve())

    def __enter__(self):
        self.modules_before, self.cwd = set(sys.modules), os.getcwd()
        sys.path.insert(0, self.folder)
        os.chdir(self.folder)

    def __exit__(self, *exc_info):
        os.chdir(self.cwd)
        sys.path.remove(self.folder)
        for name in set(sys.modules) - self.modules_before:
            path = getattr(sys.modules[name], "__file__", None) or ""
            if path.startswith(self.folder + os.sep) and not name.startswith("_fused_"):
                del sys.modules[name]


def import_file(path: Path, unique_name: str):
    spec = importlib.util.spec_from_file_location(unique_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[unique_name] = module
    spec.loader.exec_module(module)
    return module


def handler_module(node: str, folder: Path, handler: str):
    """The module a handler string names, resolved as ts/model_loader.py does: a file of the node's archive, else
    one of TorchServe's default handlers (image_classifier, ...), else an installed module."""
    stem = handler.split(":", 1)[0].split("/")[-1].removesuffix(".py")
    if (folder / f"{stem}.py").is_file():
        return import_file(folder / f"{stem}.py", f"_fused_{node}_{stem}")
    try:
        return importlib.import_module(f".{stem}", "ts.torch_handler")
    except ModuleNotFoundError as error:
        if error.name != f"ts.torch_handler.{stem}":
            raise  # the default handler exists but needs a package the worker lacks (captum)
    return importlib.import_module(stem)


def entry_points(module, function_name: str | None):
    """(handle, initialize) of a module, as ts/model_loader.py finds them."""
    function_name = function_name or "handle"
    if hasattr(module, function_name):
        entry = getattr(module, function_name)
        return entry, lambda context: entry(None, context)
    classes = list_classes_from_module(module)
    if len(classes) != 1:
        raise ValueError(f"expected one class or a function {function_name} in {module.__name__}, found {classes}")
    service = classes[0]()
    return service.handle, service.initialize


def node_context(name: str, folder: Path, manifest: dict | None, batch_size: int, fused: Context) -> Context:
    config_file = ((manifest or {}).get("model") or {}).get("configFile")
    properties = fused.system_properties
    return Context(
        name,
        str(folder),
        manifest,
        batch_size,
        properties.get("gpu_id"),
        ts.__version__,
        properties.get("limit_max_image_pixels", True),
        fused.metrics,
        get_yaml_config(str(folder / config_file)) if config_file else {},
    )


def load_model_node(workflow: str, node: str, folder: Path, fused: Context, retry_attempts: int) -> Node:
    manifest = json.loads((folder / "MAR-INF" / "MANIFEST.json").read_text())
    handler = manifest["model"]["handler"]
    context = node_context(f"{workflow}__{node}", folder, manifest, fused.system_properties.get("batch_size") or 1, fused)
    with node_folder(folder):
        module = handler_module(node, folder, handler)
        entry, initialize = entry_points(module, handler.split(":", 1)[1] if ":" in handler else None)
        initialize(context)
    return Node(node, entry, context, one_row_at_a_time=False, retry_attempts=retry_attempts)


def load_function_node(workflow: str, node: str, functions, folder: Path, fused: Context, retry_attempts: int) -> Node:
    context = node_context(f"{workflow}__{node}", folder, None, 1, fused)
    entry = getattr(functions, node)
    with node_folder(folder):
        entry(None, context)  # TorchServe's load-time call of a function entry point
    return Node(node, entry, context, one_row_at_a_time=True, retry_attempts=retry_attempts)


# The DAG ---------------------------------------------------------------------------------------------------


class FusedWorkflow:
    def __init__(self, context: Context):
        model_dir = Path(context.system_properties["model_dir"])
        plan = json.loads((model_dir / PLAN_FILE).read_text())
        self.workflow = plan["workflow"]
        self.stop_at_node = plan["row_errors"] == "node"
        self.order: list[str] = plan["order"]  # parents before children
        self.parents: dict[str, list[str]] = plan["parents"]  # in `order`'s order
        self.leaves: list[str] = plan["leaves"]
        functions = None
        if plan.get("functions_file"):
            path = model_dir / plan["functions_file"]
            with node_folder(path.parent):
                functions = import_file(path, f"_fused_functions_{path.stem}")
        self.nodes: dict[str, Node] = {}
        for name in self.order:
            node = plan["nodes"][name]
            # the node mode promises that a failed batch's other rows are served: each is sent again alone at least once
            retries = max(1, node["retry_attempts"]) if self.stop_at_node else node["retry_attempts"]
            try:
                if node["kind"] == "model":
                    self.nodes[name] = load_model_node(self.workflow, name, model_dir / node["folder"], context, retries)
                else:
                    folder = (model_dir / plan["functions_file"]).parent
                    self.nodes[name] = load_function_node(self.workflow, name, functions, folder, context, retries)
            except Exception as error:
                raise RuntimeError(
                    f"fused workflow {self.workflow}: node {name} failed to load: {type(error).__name__}: {error}"
                ) from error

    def handle(self, data: list, context: Context) -> list:
        rows = len(data)
        request_ids = [context.get_request_id(i) for i in range(rows)]
        root_headers = [dict(context.get_all_request_header(i)) for i in range(rows)]
        # the request's own headers, without its parameters' (each parameter's name maps to its content type)
        request_headers = [{k: v for k, v in root_headers[i].items() if k not in data[i]} for i in range(rows)]
        stopped: list[Answer | None] = [None] * rows
        outputs: dict[str, list[Answer | None]] = {}
        for name in self.order:
            alive = [i for i in range(rows) if stopped[i] is None]
            if not alive:
                break
            inputs, headers = self._inputs(name, alive, data, root_headers, request_headers, outputs)
            answers = self.nodes[name].run(inputs, headers, [request_ids[i] for i in alive])
            outputs[name] = [None] * rows
            for i, answer in zip(alive, answers, strict=True):
                outputs[name][i] = answer
                if answer.failed and not self.stop_at_node:
                    stopped[i] = workflow_error(f"Error executing {name}")
                elif not answer.ok and self.stop_at_node:
                    stopped[i] = answer
        return [self._respond(context, i, stopped[i] or self._combined(outputs, i)) for i in range(rows)]

    def _inputs(self, name: str, alive: list[int], data, root_headers, request_headers, outputs) -> tuple[list, list]:
        """What DagExecutor.java sends node `name` for each row: the start node the request's own parameters; a child
        of one parent {"body": its bytes}; a join child one parameter per parent, named after it (TorchServe: in the
        order the parents finished; here in DAG order). Each parameter has no content type; every node gets the
        request's headers."""
        parents = self.parents[name]
        if not parents:
            return [data[i] for i in alive], [root_headers[i] for i in alive]
        names = ["body"] if len(parents) == 1 else parents
        inputs = [{n: bytearray(outputs[p][i].body) for n, p in zip(names, parents, strict=True)} for i in alive]
        headers = [{**{n: {"content-type": ""} for n in names}, **request_headers[i]} for i in alive]
        return inputs, headers

    def _combined(self, outputs: dict[str, list], i: int) -> Answer:
        """One leaf: its bytes as application/json (whatever the leaf said). Several: {leaf: its JSON object} as
        WorkflowManager.java answers (Gson, pretty, a final newline)."""
        if len(self.leaves) == 1:
            return Answer(200, "application/json", outputs[self.leaves[0]][i].body)
        combined = {}
        for leaf in self.leaves:
            try:
                value = json.loads(outputs[leaf][i].body.decode("utf-8"), parse_float=JsonNumber, parse_int=JsonNumber)
            except ValueError:
                value = None
            if not isinstance(value, dict):  # /wfpredict: 500 with the message of Gson's parser (not matched here)
                return workflow_error(f"leaf {leaf} did not answer a JSON object: several leaves answer one object of them")
            combined[leaf] = value
        return Answer(200, "application/json", (gson_pretty(combined) + "\n").encode("utf-8"))

    @staticmethod
    def _respond(context: Context, i: int, answer: Answer) -> bytes:
        context.set_response_status(answer.status, status_phrase(answer.status), i)
        if answer.content_type:
            context.set_response_content_type(i, answer.content_type)
        return answer.body


class JsonNumber(str):
    """A JSON number kept as its text: Gson writes a parsed number back as it read it."""


def gson_pretty(value, indent: str = "") -> str:
    """JSON as Gson's pretty printer writes it (2 spaces, `"key": value`, HTML characters not escaped)."""
    inner = indent + "  "
    if isinstance(value, dict):
        items = [f"{inner}{gson_string(k)}: {gson_pretty(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}" if items else "{}"
    if isinstance(value, list):
        items = [inner + gson_pretty(v, inner) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + indent + "]" if items else "[]"
    if isinstance(value, JsonNumber):
        return str.__str__(value)
    if isinstance(value, str):
        return gson_string(value)
    return {True: "true", False: "false", None: "null"}[value]


def gson_string(text: str) -> str:
    # Python and Gson escape the same characters, except the line and paragraph separators Gson also escapes
    return json.dumps(text, ensure_ascii=False).replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


_workflow: FusedWorkflow | None = None


def handle(data, context):
    """TorchServe's entry point: called with None once when the worker loads the model."""
    global _workflow
    if data is None:
        _workflow = FusedWorkflow(context)
        return None
    return _workflow.handle(data, context)
