"""The .war read once (segserve/archives/war.py): `segserve fuse` and `members: true` accept and refuse the same
archives, order the same DAG the same way, find function names as TorchServe's loader finds them, and read each
node's settings as WorkFlow.java does."""

import json
import os
import tempfile
import zipfile
from pathlib import Path

import pytest

from segserve import fuse
from segserve.archives.foreign import read_archive
from segserve.archives.war import read_war
from segserve.cli import main
from segserve.errors import UsageError
from tests.system import workflow_shapes


def war(folder: Path, spec: str, functions: str = "", name: str = "flow", handler: str | None = "f.py") -> Path:
    path = folder / f"{name}.war"
    manifest = {"workflowName": name, "specFile": "spec.yaml", **({"handler": handler} if handler else {})}
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("WAR-INF/MANIFEST.json", json.dumps({"workflow": manifest}))
        archive.writestr("spec.yaml", spec)
        if handler:
            archive.writestr(handler, functions)
    return path


def mar(folder: Path, name: str) -> None:
    with zipfile.ZipFile(folder / f"{name}.mar", "w") as archive:
        archive.writestr("MAR-INF/MANIFEST.json", json.dumps({"runtime": "python", "model": {"modelName": name, "handler": "h.py"}}))
        archive.writestr("h.py", "def handle(data, context):\n    return data\n")


def fuse_says(path: Path, store: Path) -> str | None:
    """None when `segserve fuse` accepts the .war (all its checks but the archiver's run: not in the unit tier),
    else its refusal."""
    try:
        workflow = fuse.read_workflow(path, store)
        with tempfile.TemporaryDirectory() as folder:
            fuse.write_contents(workflow, Path(folder), "workflow")
            fuse.check_imports(workflow, Path(folder), dict(os.environ))
    except UsageError as error:
        return str(error)
    return None


def members_say(path: Path, store: Path) -> str | None:
    """None when `members: true` accepts the .war (its members listed), else its refusal."""
    try:
        archive = read_archive("flow", str(path), str(store))
        archive.members()
        archive.check_function_names(dict(os.environ))
    except UsageError as error:
        return str(error)
    return None


SHAPES = {
    "dog-breed (function first, a join)": (workflow_shapes.DOGBREED_SPEC, workflow_shapes.DOGBREED_FUNCTIONS),
    "aggregate (fan-out, function nodes in the middle and last)": (workflow_shapes.AGGREGATE_SPEC, workflow_shapes.AGGREGATE_FUNCTIONS),
    "tuple-bound functions": (
        "models:\n  a: {url: a.mar}\ndag:\n  pre: [a]\n  a: [post]\n",
        "def make():\n    f = lambda data, context: data\n    return f, f\n\npre, post = make()\n",
    ),
    "bound by globals()": (
        "models:\n  a: {url: a.mar}\ndag:\n  pre: [a]\n",
        "globals()['pre'] = lambda data, context: data\n",
    ),
    "leaf-first dag": (
        "models:\n  a: {url: a.mar}\n  b: {url: b.mar}\ndag:\n  b: [d]\n  a: [c, b]\n  c: [d]\n",
        "def c(d, x): pass\nd = c\n",
    ),
    "an edge listed twice": ("models:\n  a: {url: a.mar}\n  b: {url: b.mar}\ndag:\n  a: [b, b]\n", ""),
    "a misspelled node": ("models:\n  detail: {url: a.mar}\ndag:\n  pre: [detial]\n", "def pre(d, c): pass\n"),
    "two start nodes": ("models:\n  a: {url: a.mar}\n  b: {url: b.mar}\ndag:\n  a: []\n  b: []\n", ""),
    "a cycle": ("models:\n  a: {url: a.mar}\n  b: {url: b.mar}\ndag:\n  a: [b]\n  b: [c]\n  c: [b]\n", "def c(d, x): pass\n"),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_fuse_and_members_accept_and_refuse_the_same_wars(tmp_path, shape):
    for name in ("a", "b", "animal", "breed", "left", "right"):
        mar(tmp_path, name)
    spec, functions = SHAPES[shape]
    path = war(tmp_path, spec, functions)
    by_fuse, by_members = fuse_says(path, tmp_path), members_say(path, tmp_path)
    assert (by_fuse is None) == (by_members is None), (by_fuse, by_members)
    if by_fuse is not None:  # the same refusal, worded once
        reason = by_members.split(": ", 2)[-1]
        assert reason in by_fuse, (by_fuse, by_members)


def test_a_leaf_first_dag_is_ordered_the_same_for_fuse_and_members_ties_in_the_order_first_named(tmp_path):
    mar(tmp_path, "a")
    mar(tmp_path, "b")
    path = war(
        tmp_path, "models:\n  a: {url: a.mar}\n  b: {url: b.mar}\ndag:\n  b: [d]\n  a: [c, b]\n  c: [d]\n", "def c(d, x): pass\nd = c\n"
    )
    assert read_war(path).order == ["a", "b", "c", "d"]  # b and c ready together: b is named first
    assert fuse.read_workflow(path, tmp_path).order == ["a", "b", "c", "d"]
    assert list(read_archive("flow", str(path), str(tmp_path)).target().scaled_nodes) == ["a", "b"]  # its model nodes, in that order


def test_a_misspelled_node_is_named_with_the_name_it_meant(tmp_path, capsys):
    mar(tmp_path, "a")
    path = war(tmp_path, "models:\n  detail: {url: a.mar}\ndag:\n  pre: [detial]\n", "def pre(d, c): pass\n")
    assert main(["fuse", str(path), "--model-store", str(tmp_path)]) == 2  # refused before the archiver runs
    assert "(dag: names detial; models: has detail)" in capsys.readouterr().err
    assert "(dag: names detial; models: has detail)" in members_say(path, tmp_path)
    path = war(tmp_path, "models:\n  a: {url: a.mar}\ndag:\n  pre_processing: [a]\n", "def pre_procesing(d, c): pass\n")
    assert "(dag: names pre_processing; its handler file has pre_procesing)" in members_say(path, tmp_path)


def test_each_nodes_settings_are_read_as_workflow_java_reads_them(tmp_path):
    spec = (
        "models:\n  batch-size: 4\n  a: {url: a.mar}\n  retry-attempts: 3\n"
        "  b: {url: b.mar, batch-size: 8}\n  timeout-ms: 5000\ndag:\n  pre: [a]\n  a: [b]\n"
    )
    spec_read = read_war(war(tmp_path, spec, "def pre(d, c): pass\n"))
    a, b, pre = (spec_read.nodes[n].settings for n in ("a", "b", "pre"))
    # a model node: its own value, else the top level as read so far (what is written below it does not reach it)
    assert a == {"min-workers": 1, "max-workers": 1, "batch-size": 4, "max-batch-delay": 50, "retry-attempts": 1, "timeout-ms": 10000}
    assert b["batch-size"] == 8 and b["timeout-ms"] == 10000 and b["retry-attempts"] == 3
    # a function node: one worker, batch 1, no delay, and the workflow's last timeout-ms and retry-attempts
    assert pre == {"min-workers": 1, "max-workers": 1, "batch-size": 1, "max-batch-delay": 0, "retry-attempts": 3, "timeout-ms": 5000}
    assert spec_read.functions == ["pre"] and spec_read.models == {"a": "a.mar", "b": "b.mar"} and spec_read.leaves == ["b"]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("models:\n  a: {url: ../a.mar}\ndag:\n  a: []\n", "models.a.url: '../a.mar' is not a relative name inside its folder"),
        ("models:\n  a: {url: a.mar}\ndag:\n  a: [a]\n", "node a: a self loop (TorchServe: Self loop exception)"),
        ("models:\n  a: {url: a.mar, batch-size: x}\ndag:\n  a: []\n", "models.a.batch-size: a whole number of 0 or more (got 'x')"),
    ],
)
def test_what_torchserve_refuses_is_refused_by_the_reader_naming_the_node(tmp_path, spec, message):
    with pytest.raises(UsageError, match="flow.war: ") as refused:
        read_war(war(tmp_path, spec))
    assert message in str(refused.value)


def test_loading_a_suite_runs_no_code_of_a_war_and_bench_asks_its_functions_only_after_saying_so(tmp_path, monkeypatch, capsys):
    """A .war's function file imported when a suite is loaded would run a user's (or a shared study's) code in
    `bench collect`, `replay` and `--dry-run`: it is read there, and imported only by `segserve bench` after its note."""
    from segserve.archives.catalog import Catalog
    from segserve.bench.suite.spec import check_member_functions, load_suite
    from tests.conftest import ROOT

    mar(tmp_path, "a")
    marker = tmp_path / "imported"
    functions = f"open({str(marker)!r}, 'w').close()\nglobals()['pre'] = lambda data, context: data\n"
    war(tmp_path, "models:\n  a: {url: a.mar}\ndag:\n  pre: [a]\n", functions)
    (tmp_path / "in.bin").write_bytes(b"x")
    suite = tmp_path / "s.yaml"
    suite.write_text("targets: [{name: flow, archive: flow.war, members: true}]\ninputs: [{files: [in.bin]}]\n")
    monkeypatch.chdir(tmp_path)
    catalog = Catalog(ROOT)
    loaded = load_suite(suite, catalog)
    assert not marker.exists() and "flow-a" in loaded.target_names  # read: its members listed, nothing imported
    check_member_functions(loaded, catalog)  # `pre` is bound only by globals(): found because the file is imported
    assert marker.exists()
    marker.unlink()
    assert main(["bench", str(suite), "--dry-run"]) == 0 and "note: an archive runs its own Python" in capsys.readouterr().out
    assert not marker.exists()  # a dry run imports nothing of it
