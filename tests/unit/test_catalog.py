"""The catalog: every target from the project's YAML; broken workflow YAMLs refused before anything starts; and a
new DAG, added as YAML only, built, served, predicted and benchmarked."""

import shutil

import pytest
import yaml

from segserve.archives.catalog import Catalog
from segserve.cli import main
from tests.conftest import ROOT

PROJECT_PARTS = ("handlers", "model_config", "workflows", "config.properties", "samples")


def copy_project(destination):
    """What a user's checkout holds that the catalog and the archives read (segserve itself is installed)."""
    for part in PROJECT_PARTS:
        source = ROOT / part
        if source.is_dir():
            shutil.copytree(source, destination / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, destination / part)
    return destination


def test_the_catalog_lists_every_model_dag_and_fused_twin():
    catalog = Catalog(ROOT)
    assert list(catalog.targets) == [
        "seg",
        "areas",
        "jpeg",
        "jpeg_json",
        "seg_fanout",
        "seg_fanout_fused",
        "seg_jpeg",
        "seg_jpeg_fused",
    ]
    workflow, fused = catalog.targets["seg_fanout"], catalog.targets["seg_fanout_fused"]
    assert workflow.endpoint == "/wfpredict/seg_fanout" and fused.endpoint == "/predictions/seg_fanout_fused"
    assert workflow.models == ("seg_fanout__seg", "seg_fanout__areas", "seg_fanout__jpeg")
    assert workflow.members == ("seg", "areas", "jpeg_json") and workflow.leaves == ("areas", "jpeg")
    assert (workflow.takes, workflow.gives, catalog.targets["seg_jpeg"].gives) == ("image", "json", "jpeg")
    assert fused.models == ("seg_fanout_fused",) and fused.scaled_nodes == ()
    assert catalog.family("seg_jpeg") == ["seg", "jpeg", "seg_jpeg", "seg_jpeg_fused"]


BROKEN = {
    "missing node config": ("models: {a: {url: seg.mar}, b: {url: nothere.mar}}\ndag: {a: [b]}\n", "node 'b': no node config"),
    "cycle": (
        "models: {a: {url: seg.mar}, b: {url: jpeg.mar}, c: {url: jpeg.mar}}\ndag: {a: [b], b: [c], c: [b]}\n",
        "dag: the fused pipeline does not join inputs",  # c → b makes b a join as well as a cycle
    ),
    "pure cycle": ("models: {a: {url: seg.mar}, b: {url: jpeg.mar}}\ndag: {a: [b], b: [a]}\n", "cycle"),
    "join": (
        "models: {a: {url: seg.mar}, b: {url: seg.mar}, c: {url: jpeg.mar}}\ndag: {a: [c], b: [c]}\n",
        "node(s) with several parents: {'c': ['a', 'b']}",
    ),
    "missing handler": ("models: {a: {url: seg.mar}, b: {url: ghost.mar}}\ndag: {a: [b]}\n", "node 'b': its handler 'nope'"),
    "not a list": ("models: {a: {url: seg.mar}, b: {url: jpeg.mar}}\ndag: {a: b}\n", "each node maps to a list of node names"),
    "wrong input": (
        "models: {a: {url: seg.mar}, b: {url: seg.mar}}\ndag: {a: [b]}\n",
        "node 'b' takes image but its parent 'a' gives class_map",
    ),
}


def test_every_shipped_workflow_asks_a_node_again_before_a_client_gives_up():
    """TorchServe 0.12 can drop a workflow node's answer (docs/serving.md): a node must be asked again after its
    timeout-ms, inside the load generator's 30 s, or the request is lost (a CI run failed on it)."""
    from segserve.bench.run.load import LoadSpec

    client_timeout_ms = LoadSpec.__dataclass_fields__["timeout_s"].default * 1000
    for path in sorted((ROOT / "workflows").glob("*.yaml")):
        models = yaml.safe_load(path.read_text())["models"]
        assert models["retry-attempts"] >= 1, path.name
        assert models["timeout-ms"] * (models["retry-attempts"] + 1) < client_timeout_ms, path.name


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_workflow_yaml_is_one_error_line_naming_file_and_node_before_anything_starts(case, tmp_path, monkeypatch, capsys):
    project = copy_project(tmp_path / "project")
    text, message = BROKEN[case]
    (project / "workflows" / "bad.yaml").write_text(text)
    ghost = yaml.safe_load((project / "model_config" / "jpeg.yaml").read_text())
    ghost["segserve"]["handler"] = "nope"
    (project / "model_config" / "ghost.yaml").write_text(yaml.safe_dump(ghost))
    if case != "missing handler":
        (project / "model_config" / "ghost.yaml").unlink()
    monkeypatch.chdir(project)
    assert main(["build", "--model-store", str(tmp_path / "store"), "--weights", str(tmp_path / "none.pt")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: {project / 'workflows' / 'bad.yaml'}: ") and message in lines[0], lines[0]
    assert not (tmp_path / "store").exists()  # refused before anything was built


def test_a_model_config_named_like_a_dag_is_refused(tmp_path, monkeypatch, capsys):
    project = copy_project(tmp_path / "project")
    shutil.copy(project / "model_config" / "jpeg.yaml", project / "model_config" / "seg_jpeg.yaml")
    monkeypatch.chdir(project)
    assert main(["serve", "--targets", "seg"]) == 2
    assert "seg_jpeg.yaml: 'seg_jpeg' is also the target of workflows/seg_jpeg.yaml: rename one" in capsys.readouterr().err
