"""What each node of a user's .war is sent inside its workflow, worked out from the workflow's inputs, so that each
model node's .mar can be measured alone on the very requests the workflow sends it (`members: true`).

TorchServe 0.12's DagExecutor (frontend/server/src/main/java/org/pytorch/serve/ensemble/DagExecutor.java) sends the
start node the workflow's request and every other node a request made of its parents' answers (their bytes only:
status and content type are dropped): a node with one parent gets a parameter `body`, a join one parameter per
parent, named after the parent. None has a content type, so the worker hands each to the handler as a bytearray
(ts/protocol/otf_message_handler.py). A join member gets the same row from TorchServe's gRPC API, one entry of the
request's input map per parent (inputs.named_inputs, grpc_load.request_bytes): over HTTP it would come from a
multipart/form-data body, which 0.12's frontend decodes at ten times the CPU the workflow spends on the row
(docs/benchmarking.md, members). A function node runs in a worker of its own, at batch size 1, with the
.war's folder as its model folder (ModelManager.registerModel); here it runs in a Python process of its own from the
.war's own function file, one row at a time, its answer encoded as a worker encodes it. A row a node refuses (a
status its handler set) goes on as its body, as the DagExecutor hands it on; a row a node fails (Failed: the worker
failed it) goes no further, so only that node's descendants are fed without it.
"""

import base64
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from segserve.archives.war import read_dag
from segserve.engines.worker_protocol import metrics_cache, read_predict_reply, worker_row
from segserve.errors import RuntimeFailure


@dataclass(frozen=True)
class Failed:
    """A row a node failed: TorchServe's own error for it (the worker failed the row's batch: its handler raised,
    answered another number of rows; a function node's exception), not an answer its handler gave, whatever status
    that set. Inside the workflow such a row goes no further (DagExecutor sends it again, then answers 500 "Error
    executing <node>"), so the node's descendants never get it; a row a handler refuses with a status goes on as
    its body (RestJob completes the promise with the body: docs/fuse.md). `node` and `name` (the workflow input's,
    failures.input_names) are set by node_requests."""

    reason: str  # "answered 503: Prediction failed (ValueError: ... ← handler.py:9)"
    node: str = ""
    name: str = ""

    def __str__(self) -> str:
        return f"{self.node} {self.reason}"


def node_requests(dag: dict, inputs: list[bytes], answer: Callable[[str, list[bytes]], list]) -> dict[str, list]:
    """What each node is sent for each of the workflow's inputs, in evaluation order, named after the input
    (Body.name): the start node the inputs, every other node its parents' answers (request_of), or, for a row a
    node above it failed, that Failed (the row never reaches it). `answer(node, bodies)` gives a node's answer to
    each body (bytes, or Failed); it is asked only of nodes with children, parents first, each once, for the rows
    that reach it. A node that fails as a whole (`answer` raises RuntimeFailure: its archive does not load) fails
    every row it is sent: only its descendants lose them, its siblings and ancestors are fed."""
    from segserve.bench.run.failures import input_names

    order, sent, answers, names = read_dag(dag, "dag"), {}, {}, input_names(inputs)
    for node in order.order:
        above = order.parents[node]
        rows = []
        for i, name in enumerate(names):
            failed = next((answers[p][i] for p in above if isinstance(answers[p][i], Failed)), None)
            row = failed or (inputs[i] if not above else request_of({p: answers[p][i] for p in above}))
            rows.append(row if failed else _named(row, name))
        sent[node] = rows
        if not dag.get(node):
            continue
        reached = [i for i, row in enumerate(rows) if not isinstance(row, Failed)]
        try:
            given = answer(node, [rows[i] for i in reached]) if reached else []
        except RuntimeFailure as failure:
            # its first line is the reason (management.py: a log tail follows), with the root cause first where known
            given = [Failed(f"failed: {(str(failure).splitlines() or [''])[0]}")] * len(reached)
        if len(given) != len(reached):
            raise RuntimeFailure(f"node {node} gave {len(given)} answers to {len(reached)} inputs")
        answers[node] = list(rows)  # a row that never reached it stays its ancestor's Failed
        for i, given_row in zip(reached, given, strict=True):
            answers[node][i] = Failed(given_row.reason, node, names[i]) if isinstance(given_row, Failed) else given_row
    return sent


def workflow_node_requests(archive, inputs: list[bytes], capture, env: dict[str, str] | None = None) -> dict[str, list]:
    """What each node of a user's .war (archive: a ForeignArchive) is sent for these inputs of the workflow: a model
    node's answers from `capture(member name, bodies)` (its .mar registered alone), a function node's from the
    .war's function file run in a process of its own with environment `env` (FunctionFile)."""
    with FunctionFile(archive.path, archive.name, archive.functions_file or "", env) as functions:

        def answer(node: str, bodies: list[bytes]) -> list:
            if node in archive.nodes:
                return list(capture(archive.member_name(node), tuple(bodies)))
            return functions.answers(node, bodies)

        return node_requests(archive.spec.get("dag") or {}, inputs, answer)


def left_out(rows: list) -> str | None:
    """The inputs a node's rows leave out, by reason: "07_gray.jpg, 12_x.jpg (cat_dog answered 503: ...)"."""
    by_reason: dict[str, list[str]] = {}
    for row in rows:
        if isinstance(row, Failed):
            by_reason.setdefault(str(row), []).append(row.name)
    return "; ".join(f"{', '.join(names)} ({reason})" for reason, names in by_reason.items()) or None


def _named(body: bytes, name: str) -> bytes:
    """The body under the workflow input's name, so that a member's failed requests name the input too."""
    from segserve.bench.run.load import Body

    return Body(bytes(body), content_type_of(body), name, getattr(body, "parts", None))


def request_of(parent_answers: dict[str, bytes]) -> bytes:
    """The body that gives a handler the row a workflow hands it: one parent's answer as the body itself, a join's
    answers as named inputs, one per parent (each a parameter without a content type, sent over gRPC)."""
    if len(parent_answers) == 1:
        return bytes(next(iter(parent_answers.values())))  # as octet-stream: the worker's bytearray, as in the DAG
    from segserve.bench.run.inputs import named_inputs

    return named_inputs({parent: bytes(answer) for parent, answer in parent_answers.items()})


class FunctionFile:
    """A .war's function file, run as TorchServe runs a function node: each node in a Python process of its own (as
    each gets a worker of its own; a crash or a stray exit stays there), from a copy of the .war's files that is its
    working directory and first on sys.path, as a worker's model folder is. There the file is imported under a name
    of its own, the node called once with None (the load) and then one row at a time with a Context like its
    worker's (_run_node). The child's environment is `env` (None: this process's). A context manager: the copy goes
    at its end."""

    def __init__(self, war: Path, workflow: str, functions_file: str, env: dict[str, str] | None = None):
        self.war, self.workflow, self.functions_file, self.env = war, workflow, functions_file, env
        self.folder: Path | None = None

    def __enter__(self) -> "FunctionFile":
        return self

    def __exit__(self, *exc_info) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)

    def answers(self, node: str, bodies: list[bytes]) -> list:
        """Function node `node`'s answer to each body, encoded as its worker sends it to the frontend, or Failed
        where its worker would fail the row (an exception, not one row back, an answer it cannot send)."""
        if self.folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix="segserve-war-functions-"))
            with zipfile.ZipFile(self.war) as archive:
                archive.extractall(self.folder / "war")  # zipfile drops absolute paths and '..' from member names
        where = f"{self.war.name}: function node {node!r}"
        request, reply = self.folder / f"{node}.request.json", self.folder / f"{node}.reply.json"
        sent = [[base64.b64encode(bytes(body)).decode(), content_type_of(body)] for body in bodies]
        names = {"folder": str(self.folder / "war"), "functions_file": self.functions_file, "workflow": self.workflow}
        request.write_text(json.dumps({**names, "war": self.war.name, "node": node, "bodies": sent}))
        reply.unlink(missing_ok=True)  # an earlier call's
        command = [sys.executable, "-m", "segserve.bench.run.dag_requests", str(request), str(reply)]
        try:  # a JSON reply, never a pickle: what the child writes is the user's code's to shape
            done = subprocess.run(command, capture_output=True, text=True, env=self.env, cwd=self.folder, timeout=FUNCTION_NODE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise RuntimeFailure(f"{where}: no answer to its {len(bodies)} input(s) in {FUNCTION_NODE_TIMEOUT_S} s") from None
        if not reply.is_file():
            said = (done.stderr.strip().splitlines() or ["nothing on stderr"])[-1]
            raise RuntimeFailure(f"{where}: its process ended with status {done.returncode} and no answer: {said}")
        answered = json.loads(reply.read_text())
        if "error" in answered:
            raise RuntimeFailure(answered["error"])
        return [Failed(answer["failed"]) if "failed" in answer else base64.b64decode(answer["answer"]) for answer in answered["answers"]]


FUNCTION_NODE_TIMEOUT_S = 900  # for all of a node's inputs, its load included


def content_type_of(body: bytes) -> str:
    """What a body is sent as: its own Content-Type, plain bytes as octet-stream."""
    return getattr(body, "content_type", None) or "application/octet-stream"


def _run_node(request: dict) -> list[dict]:
    """In the child: function node request["node"] of the .war's function file, on each body, as its worker runs it:
    for each row {"answer": base64} or {"failed": why its worker would fail it (ts/service.py's 503)}. A status the
    function sets for a row is dropped, as the workflow drops it: its answer goes on."""
    import ts
    from ts.context import Context, RequestProcessor

    folder, node = request["folder"], request["node"]
    where = f"{request['war']}: function node {node!r}"
    sys.path.insert(0, folder)
    os.chdir(folder)
    try:
        name = f"_segserve_war_{uuid.uuid4().hex}"  # never a module of segserve's or the environment's
        spec = importlib.util.spec_from_file_location(name, Path(folder) / request["functions_file"])
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        entry = getattr(module, node)
        # as ts/model_loader.py builds a function node's: no MANIFEST in the .war's folder, batch size 1
        context = Context(f"{request['workflow']}__{node}", folder, None, 1, None, ts.__version__, True, metrics_cache(), {})
        entry(None, context)  # TorchServe's load-time call
    except Exception as error:
        raise RuntimeFailure(f"{where} ({request['functions_file']}) does not load: {type(error).__name__}: {error}") from error
    answers = []
    for data, content_type in request["bodies"]:
        row, headers = worker_row(base64.b64decode(data), content_type)
        # what ts/service.py's predict sets before each call
        context.request_ids = {0: str(uuid.uuid4())}
        context.request_processor = [RequestProcessor(headers)]
        context.metrics.request_ids = context.request_ids
        try:
            out = entry([row], context)
        except Exception as error:
            answers.append({"failed": f"raised {type(error).__name__}: {error}"})
            continue
        if not isinstance(out, list) or len(out) != 1:  # the worker answers 503 for either
            answers.append({"failed": f"answered {f'{len(out)} rows' if isinstance(out, list) else type(out).__name__}, not 1 row"})
            continue
        try:
            answers.append({"answer": base64.b64encode(worker_bytes(out[0])).decode()})
        except TypeError as error:  # json.dumps of what a worker cannot send either
            answers.append({"failed": f"answered what its worker cannot send ({error})"})
    return answers


def worker_bytes(value) -> bytes:
    """A row's answer as its worker sends it. Where torch is loaded, TorchServe's own encoder writes it
    (otf_message_handler.create_predict_response: a tensor goes through torch.save) and the row's bytes are read
    back from its message; else the three kinds a function answers without torch, as that encoder writes them.
    torch is not imported for it, a second or more in each node's process: a function that answers a tensor has."""
    if "torch" in sys.modules:
        return _encoded_by_torchserve(value)
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    return json.dumps(value, indent=2).encode("utf-8")


def _encoded_by_torchserve(value) -> bytes:
    from ts.protocol.otf_message_handler import create_predict_response

    reply = read_predict_reply(bytes(create_predict_response([value], {0: "r"}, "", 200)))
    if reply.code != 200:  # "Unsupported model output data type."
        raise TypeError(f"a {type(value).__name__} is not an answer a worker can send")
    return reply.rows[0].body


def _child(request_path: str, reply_path: str) -> None:
    request = json.loads(Path(request_path).read_text())
    try:
        reply = {"answers": _run_node(request)}
    except RuntimeFailure as failure:
        reply = {"error": str(failure)}
    Path(reply_path).write_text(json.dumps(reply))


if __name__ == "__main__":
    _child(*sys.argv[1:3])
