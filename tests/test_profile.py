"""`segserve profile` against a real TorchServe: py-spy from outside every worker, a torch.profiler trace per node."""

import json

import pytest

from segserve.bench.run.profiler import handler_costs, profile, top_functions
from segserve.cli import main
from tests.conftest import ROOT

pytestmark = pytest.mark.integration


def test_top_functions_count_own_and_total_samples_per_function(tmp_path):
    raw = tmp_path / "w.txt"
    raw.write_text(
        "main (a.py:1);forward (b.py:2);conv (c.py:3) 4\nmain (a.py:1);forward (b.py:2);conv (c.py:9) 2\n"
        "main (a.py:1);encode (d.py:4) 3\nmain (a.py:1) 1\n"
    )
    rows = {r["function"]: r for r in top_functions([raw])}
    assert rows["conv (c.py)"]["self_pct"] == 60.0 and rows["conv (c.py)"]["total_pct"] == 60.0  # its two lines together
    assert rows["main (a.py)"]["self_pct"] == 10.0 and rows["main (a.py)"]["total_pct"] == 100.0
    assert list(rows)[0] == "conv (c.py)"


def test_handler_costs_name_the_innermost_handler_frame(tmp_path):
    raw = tmp_path / "w.txt"
    raw.write_text(
        "loop (ts/x.py:1);handle (handlers/base.py:5);fill (handlers/segmentation.py:7);interpolate (torch/f.py:2) 3\n"
        "loop (ts/x.py:1);handle (handlers/base.py:5);encode (handlers/jpeg.py:9);__call__ (torch/_ops.py:1) 1\n"
        "loop (ts/x.py:1);recv (ts/y.py:3) 1\n"
    )
    rows = {r["function"]: r["pct"] for r in handler_costs([raw])}
    assert rows == {"fill (handlers/segmentation.py)": 60.0, "encode (handlers/jpeg.py)": 20.0, "outside handlers: recv (ts/y.py)": 20.0}


def test_profile_samples_every_worker_of_a_workflow_and_traces_each_node(server, tmp_path):
    from segserve.archives.catalog import Catalog

    target = Catalog(ROOT).target("seg_jpeg")
    bodies = [(ROOT / "samples" / "shapes_0.jpg").read_bytes()]
    summary = profile(server, target, server.run_dir, 2.0, tmp_path, bodies, connections=4, rate_hz=50, log=lambda _: None)
    assert summary["errors"] == []
    folder = tmp_path / summary["folder"].split("/")[-1]
    for model, pids in summary["workers"].items():
        assert {f"{model}-{pid}.svg" for pid in pids} <= set(summary["flame_graphs"])
        assert (folder / f"{model}-{pids[0]}.svg").read_text().lstrip().startswith("<?xml")
        trace = json.loads((folder / f"{model}.trace.json").read_text())
        assert trace["traceEvents"], model
        assert "Self CPU" in (folder / f"{model}.ops.txt").read_text()
        assert summary["top_functions"][model] and sum(r["self_pct"] for r in summary["top_functions"][model]) <= 100.5
        assert any("(handlers/" in r["function"] for r in summary["handler_costs"][model])
    assert set(summary["workers"]) == {"seg_jpeg__seg", "seg_jpeg__jpeg"}
    assert all(rate > 0 for rate in summary["throughput_rps"].values()) and summary["requests_failed"] == 0
    assert summary["profiler_cost_pct"] is not None
    assert (folder / "report.md").read_text().startswith("# Profile of seg_jpeg")
    assert not list((server.run_dir / "profile-requests").glob("*"))  # every request was taken


def test_profile_without_a_running_server_says_how_to_start_one(tmp_path, capsys):
    assert main(["profile", "seg_jpeg_fused", "--run-dir", str(tmp_path / "nothing"), "--seconds", "1"]) == 1
    assert "segserve serve --targets seg_jpeg_fused" in capsys.readouterr().err


def test_a_suite_with_profile_best_profiles_its_best_point(tmp_path, trained_weights):
    suite = tmp_path / "prof.yaml"
    suite.write_text(
        f"""
targets: [seg_jpeg_fused]
inputs: [{{images: ["{ROOT / "samples" / "shapes_0.jpg"}"]}}]
grid: {{archive: {{batch_size: [4]}}, load: {{concurrency: [4]}}}}
load: {{warmup_s: 0.5, window_s: 1.0, stable_windows: 2, max_windows: 3, stability_tolerance: 0.5}}
profile: best
profile_seconds: 2
"""
    )
    assert main(["bench", str(suite), "--results", str(tmp_path / "results"), "--weights", str(trained_weights)]) == 0
    (folder,) = (tmp_path / "results" / "prof").iterdir()
    report = (folder / "report.md").read_text()
    assert "## Profile of the best point: seg_jpeg_fused" in report and "the profiler's cost" in report
    (profile_dir,) = (folder / "profile").iterdir()
    assert list(profile_dir.glob("seg_jpeg_fused-*.svg")) and (profile_dir / "seg_jpeg_fused.trace.json").is_file()
