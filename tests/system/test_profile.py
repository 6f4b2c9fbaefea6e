"""`segserve profile` against a real TorchServe: py-spy from outside every worker, a torch.profiler trace per node."""

from segserve.cli import main
from tests.conftest import ROOT


def test_a_suite_with_profile_best_profiles_its_best_point(tmp_path, trained_weights):
    suite = tmp_path / "prof.yaml"
    suite.write_text(
        f"""
targets: [seg_jpeg_fused]
inputs: [{{images: ["{ROOT / "samples" / "shapes_0.jpg"}"]}}]
grid: {{archive: {{batch_size: [4]}}, load: {{concurrency: [4]}}}}
load: {{warmup_s: 0.5, window_s: 1.0, stable_windows: 2, max_windows: 3, stability_tolerance: 0.5, bare_forward_s: 0.6}}
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
