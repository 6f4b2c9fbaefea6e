"""The archives are what TorchServe gets: check they are complete and self-contained."""

import json
import subprocess
import sys
import zipfile

import pytest
import torch
import yaml

from handlers import classmap
from tests.conftest import ROOT

# Runs in a fresh interpreter with the unpacked archive first on sys.path and the
# segserve package made unimportable, then serves one request through the handler.
IMPORT_CHECK = r"""
import importlib.abc, json, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "segserve":
            raise ImportError("segserve must not be needed inside an archive")
sys.meta_path.insert(0, Refuse())
archive_dir, module_name, body_path = sys.argv[1:]
sys.path.insert(0, archive_dir)
import yaml
from ts.context import Context, RequestProcessor
module = __import__(module_name)
import handlers
assert handlers.__file__.startswith(archive_dir), handlers.__file__
manifest = json.load(open(f"{archive_dir}/MAR-INF/MANIFEST.json"))
config = yaml.safe_load(open(f"{archive_dir}/{manifest['model']['configFile']}"))
context = Context(manifest["model"]["modelName"], archive_dir, manifest, 1, None, "0.12.0", model_yaml_config=config)
context.request_processor = [RequestProcessor({})]
entry = getattr(module, manifest["model"]["handler"].split(":")[1])
entry(None, context)
out = entry([{"body": open(body_path, "rb").read()}], context)
print(json.dumps({"status": context.get_response_status(0)[0], "type": context.get_response_content_type(0), "bytes": len(out[0])}))
"""


def unpack(archive, target):
    with zipfile.ZipFile(archive) as zipped:
        zipped.extractall(target)
    return target


EXPECTED_TYPE = {"seg": "application/octet-stream", "jpeg": "image/jpeg", "seg_jpeg_fused": "image/jpeg"}


@pytest.mark.parametrize(
    "name, body",
    [
        ("seg", "samples/shapes_0.jpg"),
        ("jpeg", None),
        ("jpeg_json", None),
        ("areas", None),
        ("seg_jpeg_fused", "samples/shapes_2.jpg"),
        ("seg_fanout_fused", "samples/shapes_2.jpg"),
    ],
)
def test_each_mar_runs_with_only_the_archive_on_the_path(model_store, tmp_path, name, body):
    archive_dir = unpack(model_store / f"{name}.mar", tmp_path / name)
    manifest = json.loads((archive_dir / "MAR-INF" / "MANIFEST.json").read_text())
    module_name = manifest["model"]["handler"].split(":")[0]
    if body is None:  # the input of the jpeg and areas nodes is the seg node's output
        (tmp_path / "map.bin").write_bytes(classmap.pack(torch.zeros(4, 4, dtype=torch.uint8), 2, 40, 60))
        body_path = tmp_path / "map.bin"
    else:
        body_path = ROOT / body
    command = [sys.executable, "-c", IMPORT_CHECK, str(archive_dir), module_name, str(body_path)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["status"] == 200
    assert result["type"] == EXPECTED_TYPE.get(name, "application/json")
    assert result["bytes"] > 0


def test_mar_carries_the_handler_package_weights_and_config(model_store):
    with zipfile.ZipFile(model_store / "seg.mar") as zipped:
        names = set(zipped.namelist())
        manifest = json.loads(zipped.read("MAR-INF/MANIFEST.json"))
    assert {"segmentation.py", "seg.pt", "handlers/__init__.py", "handlers/base.py", "handlers/segnet.py", "handlers/classmap.py"} <= names
    assert manifest["model"]["handler"] == "segmentation:handle"
    assert manifest["model"]["modelName"] == "seg"


def test_war_carries_the_dag(model_store):
    with zipfile.ZipFile(model_store / "seg_jpeg.war") as zipped:
        manifest = json.loads(zipped.read("WAR-INF/MANIFEST.json"))
        spec = yaml.safe_load(zipped.read(manifest["workflow"]["specFile"]))
    assert spec["dag"] == {"seg": ["jpeg"]}
    assert spec["models"]["seg"]["url"] == "seg.mar" and spec["models"]["jpeg"]["url"] == "jpeg.mar"


def test_fused_archive_carries_its_spec_and_the_config_of_each_node(model_store):
    with zipfile.ZipFile(model_store / "seg_fanout_fused.mar") as zipped:
        names = set(zipped.namelist())
        spec = yaml.safe_load(zipped.read("seg_fanout.yaml"))
        jpeg_node = yaml.safe_load(zipped.read("nodes/jpeg_json.yaml"))
    assert {"nodes/seg.yaml", "nodes/jpeg_json.yaml", "nodes/areas.yaml", "handlers/areas.py", "seg.pt"} <= names
    assert spec["dag"] == {"seg": ["areas", "jpeg"]} and jpeg_node["handler"]["response"] == "json"


def test_two_builds_of_one_name_at_once_keep_their_own_files(tmp_path):
    """The archivers stage in $TMPDIR/<name> and delete it first: two bench processes building the same
    model name at once broke each other's archives (seen in CI) until each run got its own TMPDIR."""
    from concurrent.futures import ThreadPoolExecutor

    from segserve.archives.build import archive_model

    def build(side: str, round_: int) -> set[str]:
        folder = tmp_path / f"{side}{round_}"
        extra, store = folder / "extra", folder / "store"
        extra.mkdir(parents=True)
        store.mkdir()
        (extra / f"only_{side}.txt").write_text(side)
        (extra / "bulk.bin").write_bytes(bytes(8 << 20))  # copying it widens the window the race needs
        config = folder / "config.yaml"
        config.write_text("minWorkers: 1\n")
        mar = archive_model("same_name", ROOT / "handlers" / "jpeg", None, config, extra, store, log=lambda _: None)
        with zipfile.ZipFile(mar) as zipped:
            return {name for name in zipped.namelist() if name.startswith("only_")}

    with ThreadPoolExecutor(2) as pool:
        for round_ in range(4):
            left, right = pool.submit(build, "left", round_), pool.submit(build, "right", round_)
            assert (left.result(), right.result()) == ({"only_left.txt"}, {"only_right.txt"})
