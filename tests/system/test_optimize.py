"""Model optimisations (#15): compiled networks at fixed batch buckets, int8 PT2E programs, the accuracy gate,
`segserve optimize`, and the bench's optimize axis. Timings are never asserted: only what each variant answers."""

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
import yaml

from segserve.bench.results.render import header
from segserve.model.accuracy import MAX_IOU_DROP
from tests.conftest import ROOT
from tests.unit.test_optimize import SMALL  # noqa: F401 (fixtures among them)


def segserve(*args: str, cwd: Path = ROOT, timeout_s: float = 900) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "segserve.cli", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout_s)


@pytest.mark.long  # ~90 s: compiles and measures every variant (make test-long)
def test_segserve_optimize_measures_each_variant_against_eager_and_writes_the_best_valid_archive(trained_weights, tmp_path):
    out = tmp_path / "seg_best.mar"
    # batch 2 and 2 scored images: each compiled variant compiles for batch sizes 1 and 2 only
    small = ["--input-size", "64x96", "--batch-size", "2", "--images", "2", "--seconds", "0.6", "--weights", str(trained_weights)]
    done = segserve("optimize", "--compile", "--quantize", "int8", "--json", "--out", str(out), *small)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout)
    assert [r["variant"] for r in rows] == ["eager", "compile", "int8"]
    keys = {"variant", "throughput_ips", "latency_ms", "iou", "agreement", "valid", "reason", "int8_kernels", "slower_than_eager_because"}
    keys |= {"disturbed", "others_cpu_pct"}
    assert all(set(r) == keys for r in rows)
    eager = rows[0]
    # int8 runs as int8: inductor compiled its convolutions to oneDNN int8 kernels (counted, not timed)
    assert rows[2]["int8_kernels"]["int8_convolutions"] > 0 and rows[0]["int8_kernels"] is None
    # an int8 slower than eager names its cause; one that is not slower has none
    assert (rows[2]["slower_than_eager_because"] is not None) == (rows[2]["throughput_ips"] < eager["throughput_ips"])
    assert eager["agreement"] == 1.0 and eager["valid"] is True
    for row in rows[1:]:
        assert row["valid"] is True and row["reason"] is None and row["throughput_ips"] > 0 and row["latency_ms"] > 0
        assert abs(row["iou"] - eager["iou"]) <= MAX_IOU_DROP and row["agreement"] > 0.95
    chosen = max(rows, key=lambda r: r["throughput_ips"])
    with zipfile.ZipFile(out) as archive:
        manifest = json.loads(archive.read("MAR-INF/MANIFEST.json"))
        config = yaml.safe_load(archive.read(manifest["model"]["configFile"]))
    assert config["handler"]["optimize"] == chosen["variant"]
    assert manifest["model"]["serializedFile"].endswith(".pt2") == (chosen["variant"] == "int8")
    assert f"wrote {out}" in done.stderr + done.stdout


def test_segserve_optimize_says_which_variant_failed_and_why(tmp_path):
    scripted = tmp_path / "scripted.pt"
    torch.jit.script(torch.nn.Conv2d(3, 2, 1)).save(str(scripted))
    done = segserve("optimize", "--quantize", "int8", "--json", "--weights", str(scripted), "--input-size", "64x96", "--seconds", "0.3")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {r["variant"]: r for r in json.loads(done.stdout)}
    assert rows["eager"]["valid"] is True
    assert rows["int8"]["valid"] is False and "int8 quantisation of scripted.pt failed while" in rows["int8"]["reason"]
    assert "int8 is invalid:" in done.stderr + done.stdout


def test_segserve_optimize_refuses_a_missing_ipex_venv_or_a_bad_out_in_one_line_before_measuring(tmp_path):
    done = segserve("optimize", "--ipex", "--ipex-venv", str(tmp_path / "nothing"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "make setup-ipex" in done.stderr
    done = segserve("optimize", "--compile", "--out", str(tmp_path / "best.zip"))
    assert done.returncode == 2 and "ending in .mar" in done.stderr and "measuring" not in done.stderr


@pytest.mark.long  # ~160 s: a suite over every optimisation on a real TorchServe (make test-long)
def test_a_suite_sweeps_optimisations_scores_each_and_goes_on_past_one_that_cannot_run(tmp_path, trained_weights):
    """int8 on a real TorchServe: measured, scored against eager fp32, its load time recorded; ipex in a Python
    without it: failed before registering, invalid with the reason; the suite goes on."""
    from segserve.cli import main

    suite = tmp_path / "opt.yaml"
    suite.write_text(
        yaml.safe_dump(
            {
                "targets": ["seg"],
                "inputs": [{"images": [str(ROOT / "samples" / "shapes_0.jpg")]}],
                "grid": {"archive": {"optimize": ["eager", "int8", "ipex"], "batch_size": [2]}, "load": {"concurrency": [4]}},
                "load": {"warmup_s": 0.5, "window_s": 1.0, "stable_windows": 2, "max_windows": 3, "stability_tolerance": 0.5},
            }
        )
    )
    assert main(["bench", str(suite), "--results", str(tmp_path / "results"), "--weights", str(trained_weights)]) == 0
    (folder,) = (tmp_path / "results" / "opt").iterdir()
    records = {r["optimize"]: r for r in map(json.loads, (folder / "summary.jsonl").read_text().splitlines())}
    eager, int8, ipex = records["eager"], records["int8"], records["ipex"]
    assert eager["valid"] is True and eager["error"] is None and eager.get("iou") is None  # the reference is not scored
    assert int8["error"] is None and int8["valid"] is True and int8["requests_ok"] > 0 and int8["requests_failed"] == 0
    assert abs(int8["iou"] - int8["iou_eager"]) <= MAX_IOU_DROP and int8["agreement"] > 0.95
    assert int8["load_s"] > 0 and int8["bare_forward_ips"] > 0
    assert ipex["valid"] is False and "intel_extension_for_pytorch is not importable" in ipex["invalid_reason"]
    seg_table = (folder / "report.md").read_text().split("\n## seg\n")[-1]
    assert header("iou") in seg_table and header("agreement") in seg_table and header("load_s") in seg_table
    assert "intel_extension_for_pytorch is not importable" in seg_table  # under "Failed points"


def test_segserve_optimize_prints_a_table_with_accuracy_to_four_decimals(trained_weights):
    done = segserve("optimize", "--input-size", "64x96", "--batch-size", "2", "--seconds", "0.3", "--weights", str(trained_weights))
    assert done.returncode == 0, done.stderr[-2000:]
    header, _, eager = done.stdout.strip().splitlines()[-3:]
    assert header.split("|")[1:6] == [" variant ", " throughput_ips ", " vs_eager ", " latency_ms ", " iou "]
    cells = [c.strip() for c in eager.split("|")[1:-1]]
    assert cells[0] == "eager" and cells[2] == "1.0" and len(cells[4].split(".")[1]) == 4 and cells[5] == "1.0000"
