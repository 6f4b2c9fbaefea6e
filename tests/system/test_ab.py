"""`segserve bench ab`: two versions of the project, each with its own TorchServe, measured in turn."""

import json
import re
import subprocess
import textwrap

from segserve.bench.results.compare import VERDICTS
from segserve.cli import main
from tests.conftest import ROOT


def write_suite(tmp_path):
    # max_others_share 1.0: beside make test's other process every window and bare-forward slice counts as disturbed
    # and is measured again (up to max_windows more), in each round of each side: seconds that nothing here reads
    suite = tmp_path / "ab.yaml"
    suite.write_text(
        textwrap.dedent(
            f"""
            targets: [jpeg]
            inputs: [{{images: ["{ROOT / "samples" / "shapes_0.jpg"}"]}}]
            grid: {{archive: {{batch_size: [4]}}, load: {{concurrency: [2]}}}}
            load: {{warmup_s: 0.5, window_s: 1.0, stable_windows: 2, max_windows: 3, stability_tolerance: 0.5, bare_forward_s: 0.6,
                    max_others_share: 1.0}}
            """
        )
    )
    return suite


def worktrees() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True).stdout


def test_ab_measures_both_versions_in_turn_and_leaves_no_worktree(tmp_path, trained_weights, capsys):
    before = worktrees()
    args = ["bench", "ab", str(write_suite(tmp_path)), "--a", "HEAD", "--b", str(ROOT), "--rounds", "2"]
    code = main([*args, "--results", str(tmp_path / "results"), "--weights", str(trained_weights)])
    (folder,) = (tmp_path / "results" / "ab").iterdir()
    summary = json.loads((folder / "ab.json").read_text())
    (point,) = summary["points"]
    assert code == (1 if summary["slower"] else 0)
    assert point["verdict"] in VERDICTS and len(point["a_windows_rps"]) >= 4 and len(point["b_windows_rps"]) >= 4
    assert len(point["a_rounds_rps"]) == len(point["b_rounds_rps"]) == 2
    # each round's cost per request: the server's CPU by process (a real TorchServe: its frontend and a worker)
    for side in ("a_rounds_cost_ms", "b_rounds_cost_ms"):
        cost = point[side]
        assert len(cost["server_cpu_ms_per_request"]) == 2 and all(ms > 0 for ms in cost["frontend_cpu_ms_per_request"])
        assert all(ms > 0 for ms in cost["workers_cpu_ms_per_request"])
    assert (summary["a"], summary["rounds"]) == ("HEAD", 2)
    assert worktrees() == before  # the worktree made for HEAD is gone
    out = capsys.readouterr().out
    assert re.search(r"round 2 jpeg-\S+ B:", out) and re.search(r"round 1 jpeg-\S+ A: .* CPU-ms a request", out)


def test_ab_b_env_reaches_bs_workers(tmp_path, trained_weights):
    # SEGSERVE_TEST_SLOWDOWN=10: B's handler spins ten times its own time, so B serves several times slower
    args = ["bench", "ab", str(write_suite(tmp_path)), "--a", str(ROOT), "--b", str(ROOT), "--rounds", "1"]
    args += ["--b-env", "SEGSERVE_TEST_SLOWDOWN=10", "--results", str(tmp_path / "results"), "--weights", str(trained_weights)]
    code = main(args)
    (folder,) = (tmp_path / "results" / "ab").iterdir()
    summary = json.loads((folder / "ab.json").read_text())
    (point,) = summary["points"]
    assert summary["b_env"] == {"SEGSERVE_TEST_SLOWDOWN": "10"} and code == (1 if summary["slower"] else 0)
    # several times slower when the variable reaches B's workers (about 1 when it does not); a margin for one
    # round measured on busy cores
    assert point["b_rps"] < point["a_rps"] / 1.5, point
