"""`segserve fuse` without a server: a .war it refuses (one error line naming the file and the node, exit 2, nothing
written), the fused handler's JSON as Gson writes it, its encoding of node outputs, and handler resolution."""

import json
import sys
import types
import zipfile
from pathlib import Path

import pytest
import torch
import ts
from ts.context import Context, RequestProcessor

from segserve import fuse
from segserve.cli import main
from segserve.fuse import fused_handler


def war(folder: Path, spec: str, functions: str = "", name: str = "flow") -> Path:
    path = folder / f"{name}.war"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(
            "WAR-INF/MANIFEST.json", json.dumps({"workflow": {"workflowName": name, "specFile": "spec.yaml", "handler": "f.py"}})
        )
        archive.writestr("spec.yaml", spec)
        archive.writestr("f.py", functions)
    return path


def mar(folder: Path, name: str, handler: str = "def handle(data, context):\n    return data\n") -> None:
    with zipfile.ZipFile(folder / f"{name}.mar", "w") as archive:
        archive.writestr("MAR-INF/MANIFEST.json", json.dumps({"runtime": "python", "model": {"modelName": name, "handler": "h.py"}}))
        archive.writestr("h.py", handler)


@pytest.mark.parametrize(
    "spec, functions, message",
    [
        ("models: {}\n", "", "flow.war: its spec spec.yaml has no dag: mapping"),
        ("models:\n  a: {url: a.mar}\n  m: {url: missing.mar}\ndag:\n  a: [m]\n", "", "flow.war: node m: no missing.mar in "),
        (
            "models:\n  a: {url: a.mar}\n  b: {url: b.mar}\ndag:\n  a: [b]\n  b: [a]\n",
            "",
            "flow.war: the dag has 0 start nodes (none: a cycle) (TorchServe: DAG should have only one start node)",
        ),
        (
            "models:\n  a: {url: a.mar}\n  b: {url: b.mar}\ndag:\n  a: [b]\n  b: [c]\n  c: [d]\n  d: [c]\n",
            "def c(x, y): pass\ndef d(x, y): pass",
            "flow.war: node c: a cycle (c → d → c)",
        ),
        (
            "models:\n  a: {url: a.mar}\ndag:\n  a: [post]\n",
            "def pre(x, y): pass",
            "flow.war: node post of the dag is neither a model of models: nor a function of f.py: TorchServe could not run it",
        ),
        (
            "models:\n  a: {url: a.mar}\n  b: {url: b.mar}\ndag:\n  a: []\n  b: []\n",
            "",
            "flow.war: the dag has 2 start nodes (a, b) (TorchServe: DAG should have only one start node)",
        ),
        (
            "models:\n  a: {url: a.mar}\n  b: {url: b.mar}\ndag:\n  a: [b, b]\n",
            "",
            "flow.war: node a: lists its child b twice (TorchServe: loop exception)",
        ),
        ("models:\n  a: {url: a.mar}\ndag:\n  a: [a]\n", "", "flow.war: node a: a self loop"),
        (
            "models:\n  a: {url: ../a.mar}\ndag:\n  a: []\n",
            "",
            "flow.war: models.a.url: '../a.mar' is not a relative name inside its folder",
        ),
        (
            "models:\n  a: {url: /etc/a.mar}\ndag:\n  a: []\n",
            "",
            "flow.war: models.a.url: '/etc/a.mar' is not a relative name inside its folder",
        ),
        (
            "models:\n  a: {url: 'https://example.com/a.mar'}\ndag:\n  a: []\n",
            "",
            "flow.war: node a: url 'https://example.com/a.mar' is not a .mar file name in the model store",
        ),
        (
            "models:\n  retry-attempts: two\n  a: {url: a.mar}\ndag:\n  a: []\n",
            "",
            "flow.war: models.retry-attempts: a whole number of 0 or more (got 'two')",
        ),
    ],
)
def test_a_workflow_it_cannot_fuse_is_one_error_line_naming_the_file_and_node_and_nothing_is_written(
    tmp_path, capsys, spec, functions, message
):
    mar(tmp_path, "a")
    mar(tmp_path, "b")
    path = war(tmp_path, spec, functions)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert main(["fuse", str(path), "--model-store", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {path}: ") and message in err, err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # the store as it was, byte for byte


def test_a_file_that_is_not_a_workflow_archive_is_refused(tmp_path, capsys):
    (tmp_path / "x.war").write_bytes(b"not a zip")
    assert main(["fuse", str(tmp_path / "x.war"), "--model-store", str(tmp_path)]) == 2
    assert "x.war: not a workflow archive with a spec" in capsys.readouterr().err


def test_out_may_not_be_one_of_the_workflows_own_archives_nor_row_errors_another_word(tmp_path, capsys):
    mar(tmp_path, "a")
    path = war(tmp_path, "models:\n  a: {url: a.mar}\ndag:\n  a: []\n")
    assert main(["fuse", str(path), "--model-store", str(tmp_path), "--out", str(tmp_path / "a.mar")]) == 2
    assert "a.mar: is an archive of the workflow itself" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse's choices: exit 2
        main(["fuse", str(path), "--model-store", str(tmp_path), "--row-errors", "rows"])
    assert "invalid choice: 'rows'" in capsys.readouterr().err


def test_the_plan_lists_parents_before_children_and_the_leaves_in_the_specs_order(tmp_path):
    mar(tmp_path, "a")
    path = war(
        tmp_path,
        "models:\n  a: {url: a.mar}\ndag:\n  pre: [a]\n  a: [left, right]\n",
        "def pre(d, c): pass\ndef left(d, c): pass\nfrom os import path as right\n",  # any top-level name is a function
    )
    workflow = fuse.read_workflow(path, tmp_path)
    plan = workflow.plan({"a": "nodes/a"}, "workflow/f.py")
    assert plan["order"] == ["pre", "a", "left", "right"] and plan["leaves"] == ["left", "right"]
    assert plan["parents"] == {"pre": [], "a": ["pre"], "left": ["a"], "right": ["a"]} and plan["row_errors"] == "workflow"
    assert plan["nodes"] == {
        "pre": {"kind": "function", "retry_attempts": 1},
        "a": {"kind": "model", "folder": "nodes/a", "retry_attempts": 1},
        "left": {"kind": "function", "retry_attempts": 1},
        "right": {"kind": "function", "retry_attempts": 1},
    }
    assert fuse.PLAN_FILE == fused_handler.PLAN_FILE


def test_a_join_lists_its_parents_in_dag_order_whatever_order_the_spec_names_them(tmp_path):
    """The dog-breed shape (a join of a function node and a model node) and a diamond written bottom-up: each
    node's parents in the order the plan runs them (TorchServe hands a join's parameters in the order its parents
    finished, which a parent's own parent always precedes)."""
    for name in ("a", "b"):
        mar(tmp_path, name)
    dog = war(tmp_path, "models:\n  a: {url: a.mar}\n  b: {url: b.mar}\ndag:\n  pre: [b, a]\n  a: [b]\n", "def pre(d, c): pass")
    workflow = fuse.read_workflow(dog, tmp_path)
    assert workflow.order == ["pre", "a", "b"] and workflow.parents["b"] == ["pre", "a"] and workflow.leaves == ["b"]
    spec = "models:\n  a: {url: a.mar}\n  b: {url: b.mar}\ndag:\n  c: [d]\n  b: [d]\n  top: [c, b]\n"
    diamond = fuse.read_workflow(war(tmp_path, spec, "def top(d, c): pass\ndef c(d, x): pass\nd = c\n", "diamond"), tmp_path)
    assert diamond.order == ["top", "c", "b", "d"] and diamond.parents["d"] == ["c", "b"] and diamond.leaves == ["d"]


def test_retry_attempts_are_read_as_torchserve_reads_them_a_default_below_a_node_does_not_reach_it(tmp_path):
    for name in ("a", "b", "c"):
        mar(tmp_path, name)
    spec = (
        "models:\n  a: {url: a.mar}\n  retry-attempts: 3\n  b: {url: b.mar}\n  c: {url: c.mar, retry-attempts: 0}\n"
        "dag:\n  a: [b, f]\n  b: [c]\n"
    )
    workflow = fuse.read_workflow(war(tmp_path, spec, "def f(d, c): pass"), tmp_path)
    assert workflow.retry_attempts == {"a": 1, "b": 3, "f": 3, "c": 0}


def test_leaves_are_combined_as_gson_pretty_prints_them():
    text = '{"n": 1.0, "big": 1e5, "i": -3, "s": "é\\u2028\\"<>", "e": {}, "l": [], "nest": [{"t": true, "f": false, "z": null}]}'
    value = json.loads(text, parse_float=fused_handler.JsonNumber, parse_int=fused_handler.JsonNumber)
    assert fused_handler.gson_pretty({"leaf": value}) == (
        '{\n  "leaf": {\n    "n": 1.0,\n    "big": 1e5,\n    "i": -3,\n    "s": "é\\u2028\\"<>",\n    "e": {},\n    "l": [],\n'
        '    "nest": [\n      {\n        "t": true,\n        "f": false,\n        "z": null\n      }\n    ]\n  }\n}'
    )


def test_a_nodes_output_is_encoded_as_a_torchserve_worker_sends_it():
    assert fused_handler.as_bytes(b"x") == b"x" and fused_handler.as_bytes(bytearray(b"y")) == b"y"
    assert fused_handler.as_bytes("é") == "é".encode()
    assert fused_handler.as_bytes({"a": [1, 2]}) == b'{\n  "a": [\n    1,\n    2\n  ]\n}'
    assert torch.equal(torch.load(__import__("io").BytesIO(fused_handler.as_bytes(torch.arange(3)))), torch.arange(3))
    with pytest.raises(TypeError):
        fused_handler.as_bytes(object())


def test_a_default_handler_name_resolves_to_torchserves_own_and_a_missing_package_names_itself(tmp_path, monkeypatch):
    for name in ("ts.torch_handler.vision_handler", "ts.torch_handler.image_classifier"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setitem(sys.modules, "captum", None)  # as where captum is not installed: TorchServe does not need it
    with pytest.raises(ModuleNotFoundError, match="captum"):  # 0.12's vision handlers import it
        fused_handler.handler_module("classifier", tmp_path, "image_classifier")
    captum = types.ModuleType("captum")
    captum.attr = types.SimpleNamespace(IntegratedGradients=object)
    monkeypatch.setitem(sys.modules, "captum", captum)
    monkeypatch.setitem(sys.modules, "captum.attr", captum.attr)
    module = fused_handler.handler_module("classifier", tmp_path, "image_classifier")
    handle, _ = fused_handler.entry_points(module, None)
    assert module.__name__ == "ts.torch_handler.image_classifier" and type(handle.__self__).__name__ == "ImageClassifier"


def test_two_nodes_handler_files_of_one_name_import_their_own_helpers(tmp_path):
    for node in ("left", "right"):
        folder = tmp_path / node
        folder.mkdir()
        (folder / "handler.py").write_text("from helper import NAME\n\ndef handle(data, context):\n    return [NAME for _ in data]\n")
        (folder / "helper.py").write_text(f"NAME = {node!r}\n")
    found = []
    for node in ("left", "right"):
        with fused_handler.node_folder(tmp_path / node):
            found.append(fused_handler.handler_module(node, tmp_path / node, "handler.py:handle").handle([None], None))
    assert found == [["left"], ["right"]] and "helper" not in sys.modules


# The fused handler in process, on a dog-breed-shaped DAG: a function node first, a model node that refuses or
# raises on some rows, and a join node keeping per-batch state on self that answers text for some rows, JSON for others.
PRE = "def pre(data, context):\n    if data is None:\n        return None\n    return [bytes(row['body']).strip() for row in data]\n"
CLASSIFY = """
TRIES = []


def handle(data, context):
    if data is None:
        return None
    TRIES.append([bytes(row["body"]) for row in data])
    if b"raise" in TRIES[-1]:
        raise ValueError("cannot classify this")
    answers = []
    for i, text in enumerate(TRIES[-1]):
        if text == b"refuse":
            context.set_response_status(400, "Bad Request", i)
            answers.append({"error": "refused"})
        else:
            answers.append("dog" if text.startswith(b"d") else "cat")
    return answers
"""
BREED = """
class Breed:
    def initialize(self, context):
        pass

    def handle(self, data, context):
        self.is_dogs = [bytes(row["classify"]) == b"dog" for row in data]
        self.rows = data
        return self.postprocess(context)

    def postprocess(self, context):
        answers = []
        for i, row in enumerate(self.rows):
            if self.is_dogs[i]:
                headers = {key: context.get_request_header(i, key) for key in ("pre", "classify", "x-row")}
                answers.append({"keys": list(row), "text": bytes(row["pre"]).decode(), "headers": headers})
            else:
                answers.append("It's a " + bytes(row["classify"]).decode() + "!")
        return answers
"""


def fused_model(tmp_path: Path, row_errors: str, retry_attempts: int = 2):
    """The fused handler loaded as a worker loads it, on what `segserve fuse` puts beside it (no archiver)."""
    mar(tmp_path, "classify", CLASSIFY)
    mar(tmp_path, "breed", BREED)
    spec = f"models:\n  retry-attempts: {retry_attempts}\n  classify: {{url: classify.mar}}\n  breed: {{url: breed.mar}}\n"
    spec += "dag:\n  pre: [classify, breed]\n  classify: [breed]\n"
    workflow = fuse.read_workflow(war(tmp_path, spec, PRE), tmp_path)
    fuse.write_contents(workflow, tmp_path / "fused", row_errors)
    context = Context("fused_flow", str(tmp_path / "fused"), None, 8, None, ts.__version__)
    fused_handler.handle(None, context)
    return context, sys.modules["_fused_classify_h"]


def answer(context, bodies: list[bytes]) -> list[tuple[int, str | None, bytes]]:
    context.request_ids = {i: f"request-{i}" for i in range(len(bodies))}
    context.request_processor = [RequestProcessor({"body": {"content-type": ""}, "x-row": str(i)}) for i in range(len(bodies))]
    out = fused_handler.handle([{"body": bytearray(b)} for b in bodies], context)
    return [(context.get_response_status(i)[0], context.get_response_content_type(i), out[i]) for i in range(len(bodies))]


def test_a_join_gets_one_parameter_per_parent_and_the_requests_headers_and_a_refused_row_is_handed_on(tmp_path):
    context, classify = fused_model(tmp_path, "workflow")
    answers = answer(context, [b" dingo ", b"cat", b"refuse"])
    dog = {
        "keys": ["pre", "classify"],
        "text": "dingo",
        "headers": {"pre": {"content-type": ""}, "classify": {"content-type": ""}, "x-row": "0"},
    }
    assert answers[0] == (200, "application/json", json.dumps(dog, indent=2).encode())
    assert answers[1] == (200, "application/json", b"It's a cat!")
    # the workflow drops the 400 between nodes: the join gets the refusal's body as classify's answer
    assert answers[2] == (200, "application/json", b'It\'s a {\n  "error": "refused"\n}!')
    assert classify.TRIES == [[b"dingo", b"cat", b"refuse"]]  # one batch


def test_a_row_a_node_fails_is_sent_again_alone_and_then_answered_as_the_workflow_answers_it(tmp_path):
    context, classify = fused_model(tmp_path, "workflow")
    answers = answer(context, [b"raise", b"cat"])
    error = b'{\n  "code": 500,\n  "type": "InternalServerException",\n  "message": "Error executing classify"\n}\n'
    assert answers == [(500, "application/json", error), (200, "application/json", b"It's a cat!")]
    # the batch, then each row alone: the failing one retry-attempts (2) times, as the frontend sends it again
    assert classify.TRIES == [[b"raise", b"cat"], [b"raise"], [b"raise"], [b"cat"]]


def test_with_no_retry_attempts_a_failed_batch_fails_every_row_of_it_as_stocks_does(tmp_path):
    context, classify = fused_model(tmp_path, "workflow", retry_attempts=0)
    assert [status for status, _, _ in answer(context, [b"raise", b"cat"])] == [500, 500]
    assert classify.TRIES == [[b"raise", b"cat"]]


def test_row_errors_node_stops_a_refused_or_failed_row_at_its_node_and_serves_its_batch_mates(tmp_path):
    context, _ = fused_model(tmp_path, "node")
    answers = answer(context, [b"refuse", b"raise", b"cat"])
    assert answers[0] == (400, None, b'{\n  "error": "refused"\n}')
    failed = {"error": "node classify failed (request id request-1)", "request_id": "request-1"}  # the exception: in the log
    assert answers[1] == (503, "application/json", json.dumps(failed).encode())
    assert answers[2] == (200, "application/json", b"It's a cat!")


@pytest.mark.parametrize(
    "handler, functions, message",
    [
        ("import segserve_test_absent_module\n", "", "node a: its handler does not import: ModuleNotFoundError: No module named"),
        (
            "def handle(d, c):\n    return d\n",
            "import segserve_test_absent_module\ndef f(d, c): pass\n",
            "node f: its handler does not import",
        ),
    ],
)
def test_a_handler_that_does_not_import_is_refused_naming_its_node_before_anything_is_built(tmp_path, capsys, handler, functions, message):
    mar(tmp_path, "a", handler)
    path = war(tmp_path, "models:\n  a: {url: a.mar}\ndag:\n  a: [f]\n", functions or "def f(d, c): pass\n")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert main(["fuse", str(path), "--model-store", str(tmp_path)]) == 2  # before the archiver (a unit test may not run it)
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: {message}") and "segserve_test_absent_module" in err and err.count("\n") == 1, err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_node_url_with_a_folder_is_its_file_name_in_the_model_store_as_torchserve_reads_it(tmp_path):
    mar(tmp_path, "a")
    workflow = fuse.read_workflow(war(tmp_path, "models:\n  a: {url: some/folder/a.mar}\ndag:\n  a: []\n"), tmp_path)
    assert workflow.archives == {"a": tmp_path / "a.mar"}
