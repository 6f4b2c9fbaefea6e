"""`segserve fuse` without a server: a .war it refuses (one error line naming the file and the node, exit 2, nothing
written), the fused handler's JSON as Gson writes it, its encoding of node outputs, and handler resolution."""

import json
import sys
import types
import zipfile
from pathlib import Path

import pytest
import torch

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


def mar(folder: Path, name: str) -> None:
    with zipfile.ZipFile(folder / f"{name}.mar", "w") as archive:
        archive.writestr("MAR-INF/MANIFEST.json", json.dumps({"runtime": "python", "model": {"modelName": name, "handler": "h.py"}}))
        archive.writestr("h.py", "def handle(data, context):\n    return data\n")


@pytest.mark.parametrize(
    "spec, functions, message",
    [
        ("models: {}\n", "", "flow.war: its spec spec.yaml has no dag: mapping"),
        ("models:\n  a: {url: a.mar}\n  m: {url: missing.mar}\ndag:\n  a: [m]\n", "", "flow.war: node m: no missing.mar in "),
        (
            "models:\n  a: {url: a.mar}\n  b: {url: b.mar}\n  c: {url: a.mar}\ndag:\n  a: [b, c]\n  b: [d]\n  c: [d]\n",
            "def d(x, y): pass",
            "flow.war: node d joins b, c",
        ),
        (
            "models:\n  a: {url: a.mar}\n  b: {url: b.mar}\ndag:\n  a: [b]\n  b: [a]\n",
            "",
            "flow.war: the DAG has 0 start nodes (none: a cycle)",
        ),
        (
            "models:\n  a: {url: a.mar}\n  b: {url: b.mar}\ndag:\n  a: [b]\n  c: [d]\n  d: [c]\n",
            "def c(x, y): pass\ndef d(x, y): pass",
            "flow.war: node c: a cycle (c → d → c)",
        ),
        (
            "models:\n  a: {url: a.mar}\ndag:\n  a: [post]\n",
            "def pre(x, y): pass",
            "flow.war: node post has no models: entry and its handler file f.py defines no function post",
        ),
        (
            "models:\n  a: {url: a.mar}\n  b: {url: b.mar}\ndag:\n  a: []\n  b: []\n",
            "",
            "flow.war: the DAG has 2 start nodes (a, b); TorchServe accepts one",
        ),
    ],
)
def test_a_workflow_it_cannot_fuse_is_one_error_line_naming_the_file_and_node_and_nothing_is_written(
    tmp_path, capsys, spec, functions, message
):
    mar(tmp_path, "a")
    mar(tmp_path, "b")
    path = war(tmp_path, spec, functions)
    assert main(["fuse", str(path), "--model-store", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {path}: ") and message in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.mar", "b.mar", "flow.war"]


def test_a_file_that_is_not_a_workflow_archive_is_refused(tmp_path, capsys):
    (tmp_path / "x.war").write_bytes(b"not a zip")
    assert main(["fuse", str(tmp_path / "x.war"), "--model-store", str(tmp_path)]) == 2
    assert "x.war: not a workflow archive with a spec" in capsys.readouterr().err


def test_the_plan_lists_parents_before_children_and_the_leaves_in_the_specs_order(tmp_path):
    mar(tmp_path, "a")
    path = war(
        tmp_path,
        "models:\n  a: {url: a.mar}\ndag:\n  pre: [a]\n  a: [left, right]\n",
        "def pre(d, c): pass\ndef left(d, c): pass\ndef right(d, c): pass",
    )
    workflow = fuse.read_workflow(path, tmp_path)
    plan = workflow.plan({"a": "nodes/a"}, "workflow/f.py")
    assert plan["order"] == ["pre", "a", "left", "right"] and plan["leaves"] == ["left", "right"]
    assert plan["nodes"] == {
        "pre": {"kind": "function"},
        "a": {"kind": "model", "folder": "nodes/a"},
        "left": {"kind": "function"},
        "right": {"kind": "function"},
    }
    assert fuse.PLAN_FILE == fused_handler.PLAN_FILE


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
    with pytest.raises(ModuleNotFoundError, match="captum"):  # 0.12's vision handlers need captum, not installed
        fused_handler.handler_module("classifier", tmp_path, "image_classifier")
    captum = types.ModuleType("captum")
    captum.attr = types.SimpleNamespace(IntegratedGradients=object)
    monkeypatch.setitem(sys.modules, "captum", captum)
    monkeypatch.setitem(sys.modules, "captum.attr", captum.attr)
    monkeypatch.delitem(sys.modules, "ts.torch_handler.vision_handler", raising=False)
    monkeypatch.delitem(sys.modules, "ts.torch_handler.image_classifier", raising=False)
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
