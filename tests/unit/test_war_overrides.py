"""A .war's timeouts and retries as axes (#65): `response_timeout` and `retry_attempts` reach every node of a point's
copy of the .war, function nodes included (their only way in is the spec's top level, WorkFlow.java), the user's
file is left as it was, and the record (`archive_overrides`) and report.md say which values a point changed."""

import json
import zipfile

import pytest
import yaml

from segserve.archives import build
from segserve.archives.catalog import Catalog
from segserve.archives.foreign import read_archive
from segserve.archives.registration import spec_overrides
from segserve.archives.war import read_war, war_of
from segserve.bench.results.analysis import analyse
from segserve.bench.results.report import write_report
from segserve.bench.run.deploy import Deployment
from segserve.bench.run.targets.best import ArchiveFiles
from segserve.bench.run.targets.torchserve_targets import catalog_war
from segserve.bench.suite import plan as planning
from segserve.bench.suite.columns import BASE_COLUMNS, EXTRA_COLUMNS
from segserve.bench.suite.spec import load_suite
from segserve.errors import UsageError
from tests.conftest import ROOT

# TorchServe's dog-breed shape: a function node first, a join below it, timeout-ms 300000 and retries written at the
# top level after the nodes (a model node does not see them: it takes the top level as read so far)
DOG_BREED = {
    "models": {
        "min-workers": 1,
        "batch-size": 1,
        "model_a": {"url": "model_a.mar"},
        "join_b": {"url": "join_b.mar", "max-batch-delay": 100},
        "timeout-ms": 300000,
        "retry-attempts": 5,
    },
    "dag": {"pre_processing": ["model_a", "join_b"], "model_a": ["join_b"]},
}


def write_war(path, spec: dict) -> None:
    manifest = {"workflow": {"workflowName": path.stem, "specFile": "spec.yaml", "handler": "handler.py"}}
    with zipfile.ZipFile(path, "w") as war:
        war.writestr("WAR-INF/MANIFEST.json", json.dumps(manifest))
        war.writestr("spec.yaml", yaml.safe_dump(spec, sort_keys=False))
        war.writestr("handler.py", "def pre_processing(data, context):\n    return data\n")


def suite_of(folder, targets: str, archive: str):
    path = folder / "suite.yaml"
    path.write_text(f"targets: {targets}\ninputs: [{{files: [blob.bin]}}]\ngrid:\n  archive: {archive}\n")
    return load_suite(path, catalog := Catalog(ROOT)), catalog


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_war(tmp_path / "dog.war", DOG_BREED)
    for node in ("model_a", "join_b"):
        (tmp_path / f"{node}.mar").write_bytes(node.encode())
    (tmp_path / "mine.mar").write_bytes(b"not opened by segserve")
    (tmp_path / "blob.bin").write_bytes(b"\x00")
    return tmp_path


class Server:
    """What a registration asks of the bench's TorchServe: register, wait for the workers, describe them, unregister."""

    venv = None  # segserve's own Python

    def register_workflow(self, archive, name, log):
        self.registered = archive

    def wait_ready(self, model, timeout_s):
        pass

    def unregister(self, kind, name):
        self.registered = None

    def describe(self, model):
        return {"workers": [{}]}


def test_a_points_timeout_and_retries_reach_every_node_of_its_copy_function_nodes_included(folder):
    suite, catalog = suite_of(folder, "[{name: dog, archive: dog.war}]", "{response_timeout: [5, 300], retry_attempts: [1]}")
    original = (folder / "dog.war").read_bytes()
    before = read_war(folder / "dog.war")
    assert before.nodes["pre_processing"].settings["timeout-ms"] == 300000  # the top level's last value
    assert before.nodes["model_a"].settings["timeout-ms"] == 10000  # written below it: TorchServe's default
    points = [p for p in planning.expand(suite, catalog) if p.target == "dog"]
    assert sorted((p.params["response_timeout"], p.params["retry_attempts"]) for p in points) == [(5, 1), (300, 1)]
    deployment = Deployment(suite, catalog, folder / "none.pt", log=lambda _: None)
    targets = deployment.torchserve
    try:
        targets.server, deployment.active = Server(), targets
        for point in points:
            targets.ensure_registered(point, catalog.targets["dog"])
            copy = targets.store / targets.server.registered
            timeout_ms = point.params["response_timeout"] * 1000
            war = read_war(copy)  # as TorchServe reads the copy: every node, the function node too, takes the point's
            assert {name: (n.settings["timeout-ms"], n.settings["retry-attempts"]) for name, n in war.nodes.items()} == {
                "pre_processing": (timeout_ms, 1),
                "model_a": (timeout_ms, 1),
                "join_b": (timeout_ms, 1),
            }
            assert war.nodes["join_b"].settings["max-batch-delay"] == 5  # the suite's default batching, as before
            assert deployment.archive_overrides == spec_overrides(before, war)
            # what differs from the spec as TorchServe reads it: the top level's retries 5 → 1 (and its 300000 where the
            # point has another), the model nodes' timeout from the default 10000 (their retries were the default 1)
            changed = {key: value for key, value in deployment.archive_overrides.items() if "workers" not in key and "batch" not in key}
            top = {"models.timeout-ms": timeout_ms} if timeout_ms != 300000 else {}
            assert changed == {
                "models.retry-attempts": 1,
                **top,
                "models.model_a.timeout-ms": timeout_ms,
                "models.join_b.timeout-ms": timeout_ms,
            }
            assert deployment.archive_overrides["models.model_a.batch-size"] == 8  # spec 1, the suite's 8: said too
            assert (folder / "dog.war").read_bytes() == original  # the user's file, byte for byte
    finally:
        targets.server = None  # no TorchServe was started: nothing to stop
        deployment.close()


def test_best_spec_of_a_war_has_the_values_the_point_measured_function_nodes_included(folder):
    foreign = read_archive("dog", str(folder / "dog.war"), None)
    chosen = {"run_id": "dog-1", "target": "dog", "workers": 2, "batch_size": 4, "response_timeout": 5, "retry_attempts": 1}
    ArchiveFiles(foreign.target(), foreign, chosen, "# Best on: here.").register_script(folder)
    spec = yaml.safe_load((folder / "dog.yaml").read_text())  # best/dog.yaml, to archive again with the handler file
    war = war_of(folder / "dog.war", "dog", "spec.yaml", spec, "handler.py")
    assert {name: (n.settings["timeout-ms"], n.settings["retry-attempts"]) for name, n in war.nodes.items()} == {
        "pre_processing": (5000, 1),
        "model_a": (5000, 1),
        "join_b": (5000, 1),
    }


def test_a_catalog_workflows_spec_takes_them_by_the_same_code_path(folder, monkeypatch):
    def archive_workflow(name, spec, handler, model_store, log):  # the archiver's zip, without running it (unit tier)
        write_war(model_store / f"{name}.war", spec)
        return model_store / f"{name}.war"

    monkeypatch.setattr(build, "archive_workflow", archive_workflow)
    suite, catalog = suite_of(folder, "[seg_jpeg]", "{response_timeout: [7], retry_attempts: [0], nodes: {jpeg: {retry_attempts: [2]}}}")
    (point,) = planning.expand(suite, catalog)
    target, dag = catalog.targets["seg_jpeg"], catalog.dags["seg_jpeg"]
    _, _, registration = planning.settings_for(point, target)
    values = planning.spec_values(point, target, registration)
    urls = {node.name: f"{node.model.name}.mar" for node in target.nodes}
    deployment = Deployment(suite, catalog, folder / "none.pt", log=lambda _: None)
    try:
        war = read_war(deployment.torchserve.recipe.workflow_archive(dag, "seg_jpeg", urls, values))
    finally:
        deployment.close()
    assert war.workflow_settings["timeout-ms"] == 7000 and war.workflow_settings["retry-attempts"] == 0
    assert {name: (n.settings["timeout-ms"], n.settings["retry-attempts"]) for name, n in war.nodes.items()} == {
        "seg": (7000, 0),
        "jpeg": (7000, 2),  # a node's own value over the DAG-wide one
    }
    overrides = spec_overrides(catalog_war(dag), war)
    assert {k: v for k, v in overrides.items() if "timeout" in k or "retry" in k} == {
        "models.timeout-ms": 7000,
        "models.retry-attempts": 0,
        "models.seg.timeout-ms": 7000,
        "models.seg.retry-attempts": 0,
        "models.jpeg.timeout-ms": 7000,
        "models.jpeg.retry-attempts": 2,
    }


def test_retry_attempts_is_a_workflows_a_negative_count_and_one_asked_of_models_alone_are_refused(folder):
    with pytest.raises(UsageError) as refused:
        suite_of(folder, "[{name: dog, archive: dog.war}]", "{retry_attempts: [-1]}")
    assert "grid.archive.retry_attempts.0: Input should be greater than or equal to 0" in str(refused.value)
    assert len(str(refused.value).splitlines()) == 1, str(refused.value)
    with pytest.raises(UsageError, match=r"grid.archive.retry_attempts: applies to no target here \(a workflow's"):
        suite_of(folder, "[{name: mine, archive: mine.mar}, seg_jpeg_fused]", "{retry_attempts: [1]}")
    # beside a workflow, a model's points leave it out (TorchServe registers a model with no retries)
    suite, catalog = suite_of(folder, "[{name: mine, archive: mine.mar}, {name: dog, archive: dog.war}]", "{retry_attempts: [1, 2]}")
    points = planning.expand(suite, catalog)
    assert sorted(p.params.get("retry_attempts") for p in points if p.target == "dog") == [1, 2]
    assert [p.params.get("retry_attempts") for p in points if p.target == "mine"] == [None]


def test_the_report_says_which_values_each_point_changed(tmp_path):
    def record(run_id: str, overrides: dict | None) -> dict:
        row = dict.fromkeys(BASE_COLUMNS + EXTRA_COLUMNS)
        row.update(run_id=run_id, target="dog", requests_ok=10, requests_failed=0, throughput_rps=5.0, latency_p99_ms=9.0)
        return {**row, "duration_s": 2.0, "stable": True, "archive_overrides": overrides}

    changed = {"models.timeout-ms": 5000, "models.model_a.timeout-ms": 5000, "models.retry-attempts": 1}
    records = [record("dog-a", changed), record("dog-b", changed), record("dog-c", {"models.timeout-ms": 300000}), record("m", None)]
    analysis = analyse(records, {}, "throughput_rps", [], {})
    text = write_report(tmp_path, "s", records, [], {}, "throughput_rps", analysis, {}).read_text()
    assert "Spec values the points changed in their copy of the .war (`archive_overrides`" in text
    assert "- `dog-a`, `dog-b`: models.timeout-ms 5000, models.model_a.timeout-ms 5000, models.retry-attempts 1" in text
    assert "- `dog-c`: models.timeout-ms 300000" in text and "`m`:" not in text
