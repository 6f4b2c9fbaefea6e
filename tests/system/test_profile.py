"""A suite's `profile: best` against a real TorchServe (py-spy from outside every worker, a torch.profiler trace per
node) and, beside it, against the best command target (a peer server: every process, py-spy on the Python ones)."""

import json
import sys
from pathlib import Path

from segserve.cli import main
from tests.conftest import ROOT

SERVER = Path(__file__).with_name("command_server.py")


# max_others_share 1.0: beside make test's other process every window and bare-forward slice counts as disturbed and
# is measured again (up to max_windows more): seconds a point that nothing here reads. Each profile samples for
# profile_seconds three times (before, during, after), each on a server of its own: 1 s, 6 s less in all than 2 s
def test_a_suite_with_profile_best_profiles_its_best_point_and_its_best_command_target(tmp_path, trained_weights):
    suite = tmp_path / "prof.yaml"
    suite.write_text(
        f"""
targets:
  - seg_jpeg_fused
  - name: peer
    command: [{sys.executable}, {SERVER}, --port, "{{port}}", --mode, native, --busy-ms, "2", --started-log, {tmp_path / "started"}]
inputs: [{{images: ["{ROOT / "samples" / "shapes_0.jpg"}"]}}]
grid: {{archive: {{batch_size: [4]}}, load: {{concurrency: [4]}}}}
load: {{warmup_s: 0.5, window_s: 1.0, stable_windows: 2, max_windows: 3, stability_tolerance: 0.5, bare_forward_s: 0.6,
       max_others_share: 1.0}}
profile: best
profile_seconds: 1
"""
    )
    assert main(["bench", str(suite), "--results", str(tmp_path / "results"), "--weights", str(trained_weights)]) == 0
    (folder,) = (tmp_path / "results" / "prof").iterdir()
    report = (folder / "report.md").read_text()
    assert "## Profile of the best point: seg_jpeg_fused" in report and "the profiler's cost" in report
    assert "## Profile of the best command target: peer" in ours_then_peer(report)
    ours, peer = sorted((folder / "profile").iterdir())
    assert list(ours.glob("seg_jpeg_fused-*.svg")) and (ours / "seg_jpeg_fused.trace.json").is_file()
    summary = json.loads((peer / "profile.json").read_text())
    python = Path(sys.executable).name
    assert sorted(summary["workers"]) == sorted([python, "sleep"]) and summary["errors"] == [], summary
    assert list(peer.glob(f"{python}-*.svg")) and summary["top_functions"][python]  # the server's own Python, sampled
    (native,) = summary["not_python"]  # the child that is not Python is named, not an error
    assert native.startswith("sleep ") and summary["cpu_pct"]["sleep"] == 0.0 and summary["cpu_pct"][python] > 0
    assert summary["requests_failed"] == 0 and summary["throughput_rps"]["sampled"] > 0


def ours_then_peer(report: str) -> str:
    """The report from the first profile on: ours first, the command target's after it."""
    return report[report.index("## Profile of the best point") :]
