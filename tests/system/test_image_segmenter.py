"""A .mar with TorchServe's own built-in image_segmenter handler (benchmarks/foreign/build_image_segmenter.py builds
it around torchvision's LR-ASPP MobileNetV3 as TorchScript), benchmarked by its suite with nothing installed beyond
segserve's own environment: TorchServe's vision handlers import captum, which torchserve does not bring."""

import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from segserve.archives.handler_check import archive_import_failures
from segserve.cli import main

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "benchmarks/foreign/image_segmenter.yaml"


@pytest.fixture(scope="module")
def segmenter_archive(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("segmenter")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/foreign/build_image_segmenter.py"), str(folder)], capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return folder / "image_segmenter.mar"


def test_the_image_segmenter_archive_names_torchserves_handler_brings_no_code_and_its_suite_plans(segmenter_archive, monkeypatch, capsys):
    # that the handler imports in segserve's environment: tests/unit/test_handler_check.py (in process, cheap), and
    # as the worker imports it in the long test below
    with zipfile.ZipFile(segmenter_archive) as zipped:
        manifest = json.loads(zipped.read("MAR-INF/MANIFEST.json"))["model"]
        python_files = [name for name in zipped.namelist() if name.endswith(".py")]
    assert manifest["handler"] == "image_segmenter" and manifest["serializedFile"] == "lraspp.pt" and python_files == []
    monkeypatch.chdir(segmenter_archive.parent)
    assert main(["bench", str(SUITE), "--dry-run"]) == 0, capsys.readouterr().err
    assert len(re.findall(r"^ +\d+\. ", capsys.readouterr().out, re.MULTILINE)) == 2  # batch 1 and 4


@pytest.mark.long  # a TorchServe whose worker answers each photo with a 224×224×2 JSON list: about a second each on 2 cores
def test_a_mar_with_torchserves_image_segmenter_handler_is_benchmarked_by_its_suite(segmenter_archive, tmp_path, monkeypatch, capsys):
    # in a process of its own, as TorchServe's worker imports it: ts.torch_handler.image_segmenter, captum and all
    assert archive_import_failures(segmenter_archive, segmenter_archive.parent) == []
    monkeypatch.chdir(segmenter_archive.parent)
    assert main(["bench", str(SUITE), "--results", str(tmp_path / "results")]) == 0, capsys.readouterr().err
    (folder,) = (tmp_path / "results" / "image_segmenter").iterdir()
    records = [json.loads(path.read_text()) for path in sorted((folder / "runs").glob("*.json"))]
    outcomes = [{k: r.get(k) for k in ("run_id", "error", "error_cause", "requests_ok", "requests_failed")} for r in records]
    assert len(records) == 2 and all(r["error"] is None and r["requests_ok"] > 0 and r["requests_failed"] == 0 for r in records), outcomes
