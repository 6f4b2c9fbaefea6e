"""The GPU bundle (make gpu-bundle): built here, under its size limit, and its run.sh run as a dry run without CUDA;
the summary's goals computed from a GPU run's numbers."""

import json
import os
import subprocess
import sys
from pathlib import Path

from segserve.gpu.summary import _goals, point_flags, summary_text, write_summary
from tests.conftest import ROOT


def test_run_sh_refuses_an_interpreter_without_torch_in_one_line(tmp_path):
    env = {**os.environ, "PYTHON": "/usr/bin/env", "OUT": str(tmp_path / "out")}  # runs, but is no Python with torch
    run = subprocess.run([str(ROOT / "segserve" / "gpu" / "run.sh"), "--dry-run"], env=env, capture_output=True, text=True, timeout=30)
    assert run.returncode == 2
    assert run.stderr.startswith("run.sh: /usr/bin/env has no torch and torchvision: set PYTHON")


def test_run_sh_refuses_an_unknown_argument_with_its_usage():
    run = subprocess.run([str(ROOT / "segserve" / "gpu" / "run.sh"), "--gpu"], capture_output=True, text=True, timeout=30)
    assert run.returncode == 2
    assert run.stderr.strip().endswith("run.sh [--dry-run]")


def test_run_sh_refuses_steps_it_does_not_have_and_steps_without_an_earlier_work(tmp_path):
    script = str(ROOT / "segserve" / "gpu" / "run.sh")
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "out"), "STEPS": "serve,deploy"}
    run = subprocess.run([script, "--dry-run"], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and run.stderr.startswith("run.sh: STEPS: no step 'deploy' (steps: unpack facts"), run.stderr
    env.update(STEPS="serve", WORK=str(tmp_path / "fresh"))
    run = subprocess.run([script, "--dry-run"], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "runs steps again in the WORK of an earlier run" in run.stderr, run.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "fresh").exists()  # nothing written


def test_a_summary_after_steps_were_run_again_takes_each_steps_last_outcome_in_run_order(tmp_path):
    """run.sh's STEPS appends the steps it runs again to the earlier run's steps.jsonl (after that run's own summary
    line): the summary lists each step once, with its last outcome."""
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    lines = [("unpack", 0), ("venv", 0), ("serve", 1), ("bench", 124), ("summary", 0), ("serve", 0), ("bench", 0)]
    (work / "steps.jsonl").write_text("".join(json.dumps({"step": s, "rc": rc, "seconds": 1.0}) + "\n" for s, rc in lines))
    (work / "facts.json").write_text('{"dry_run": true, "cuda": false}')
    assert write_summary(work, out) == 0
    steps = json.loads((out / "summary.json").read_text())["steps"]
    assert [(s["step"], s["rc"]) for s in steps] == [("unpack", 0), ("venv", 0), ("serve", 0), ("bench", 0)]
    assert "steps: unpack ok 1s, venv ok 1s, serve ok 1s, bench ok 1s\n" in (out / "summary.txt").read_text()


MEMBERS, PIPELINES = ["seg", "jpeg"], {"seg_jpeg": 0.9, "seg_jpeg_fused": 0.95}


def point(target, rate, workers=1, nodes=None, flags=()):
    return {"target": target, "workers": workers, "throughput_rps": rate, "nodes": nodes or {}, "flags": list(flags)}


def gpu_run(seg_rps, jpeg_rps, workflow_rps, fused_rps, seg_copied=114688.0, fused_copied=6000.0, workers=1, flags=None) -> dict:
    flags = flags or {}
    return {
        "points": [
            point("seg", seg_rps, workers, {"seg": {"device_to_host_bytes": seg_copied, "response_bytes": 114706.0}}, flags.get("seg", ())),
            point("jpeg", jpeg_rps, workers, {"jpeg": {"device_to_host_bytes": 6000.0, "response_bytes": 6000.0}}, flags.get("jpeg", ())),
            point("seg_jpeg", workflow_rps, workers, {}, flags.get("seg_jpeg", ())),
            point(
                "seg_jpeg_fused",
                fused_rps,
                workers,
                {"seg_jpeg_fused": {"device_to_host_bytes": fused_copied, "response_bytes": 6000.0}},
                flags.get("seg_jpeg_fused", ()),
            ),
        ]
    }


def goals_of(run: dict) -> dict:
    return _goals(run, cuda=True, members=MEMBERS, goals_by_pipeline=PIPELINES)


def verdicts(goals: dict) -> dict:
    return {(g["pipeline"], g["workers"]): (g["ratio"], g["verdict"]) for g in goals["pipelines"]}


def test_the_goals_compare_the_pipelines_with_the_slower_member_and_the_copies_with_the_answers():
    goals = goals_of(gpu_run(314, 420, 290, 300))
    assert verdicts(goals) == {("seg_jpeg", 1): (0.924, "met"), ("seg_jpeg_fused", 1): (0.955, "met")}
    assert goals["device_to_host_is_the_answer"]["met"]
    seed = verdicts(goals_of(gpu_run(314, 420, 141, 141)))  # the seed's report: 141 req/s together
    assert seed[("seg_jpeg", 1)][1] == seed[("seg_jpeg_fused", 1)][1] == "NOT met"
    logits = goals_of(gpu_run(314, 420, 300, 300, seg_copied=2 * 256 * 448 * 2))  # logits copied to the host
    assert not logits["device_to_host_is_the_answer"]["met"]
    assert not logits["device_to_host_is_the_answer"]["nodes"]["seg@1/seg"]["met"]
    # the fused pipeline keeps the class map on the device: a copy of it on top of the JPEG is a miss
    kept = goals_of(gpu_run(314, 420, 300, 300, fused_copied=6000.0 + 114688.0))
    assert not kept["device_to_host_is_the_answer"]["nodes"]["seg_jpeg_fused@1/seg_jpeg_fused"]["met"]


def test_a_goal_is_judged_at_every_worker_count_and_only_from_stable_unflagged_points():
    """#48's first device run: seg measured cold (37 req/s, its rate still climbing) made both pipelines look 2-5x
    faster than their slower member, and the summary printed `met`. Such a point is now `not judged`, with why."""
    run = gpu_run(37.2, 1228, 72.6, 198, flags={"seg": ["its rate did not settle"]})
    run["points"] += gpu_run(930, 1330, 664, 708, workers=4)["points"]
    found = verdicts(goals_of(run))
    assert found[("seg_jpeg", 1)] == (1.952, "not judged") and found[("seg_jpeg_fused", 1)][1] == "not judged"
    assert found[("seg_jpeg", 4)] == (0.714, "NOT met") and found[("seg_jpeg_fused", 4)] == (0.761, "NOT met")
    reasons = {g["pipeline"]: g["reasons"] for g in goals_of(run)["pipelines"] if g["workers"] == 1}
    assert reasons["seg_jpeg"] == ["seg: its rate did not settle"]


def test_a_point_is_flagged_for_each_thing_that_makes_its_numbers_unfit_to_judge():
    assert point_flags({"stable": True}) == []
    flags = point_flags({"stable": False, "disturbed": True, "client_saturated": True, "requests_failed": 3, "error": None})
    assert flags == [
        "its rate did not settle",
        "other processes took the machine",
        "the load generator saturated its core",
        "3 requests failed",
    ]


def test_the_summary_text_says_when_a_goal_is_missed_or_not_judged():
    run = gpu_run(314, 420, 141, 141)
    run["points"] += gpu_run(37.2, 1228, 72.6, 198, workers=2, flags={"seg": ["its rate did not settle"]})["points"]
    for p in run["points"]:
        p.update(
            throughput_ci_rps=[None, None], latency_p99_ms=10.0, requests_failed=0, gpu_util_mean_pct=None, gpu_util_max_pct=None,
            cpu={"pct": {"frontend": 100.0, "workers": 200.0, "client": 50.0},
                 "ms_per_request": {"frontend": 1.0, "workers": 2.0, "client": 0.5}},
        )  # fmt: skip
    summary = {
        "facts": {"cuda": True, "dry_run": False, "device": "NVIDIA H200"},
        "steps": [{"step": "bench", "rc": 0, "seconds": 80.0}],
        "gpu_tests": {"ran": False},
        "serve": {},
        "benchmark": run,
        "goals": goals_of(run),
    }
    text = summary_text(summary)
    assert text.startswith("segserve GPU check: GPU\n")
    assert "seg_jpeg_fused over seg at 1 workers: 0.45 (goal ≥ 0.95) NOT met" in text
    assert "seg_jpeg_fused over seg at 2 workers: 5.32 (goal ≥ 0.95) not judged (seg: its rate did not settle)" in text


def test_a_run_whose_venv_step_ran_out_of_time_still_gets_its_summary_from_the_standard_library(tmp_path):
    """Seen under a loaded make test: the venv step timed out, and the summary step, run by that half-made venv's
    Python (no torch, no yaml), died on `import torch`. Now write_summary needs only the standard library."""
    work, out, bare = tmp_path / "work", tmp_path / "out", tmp_path / "bare"
    work.mkdir()
    steps = [("unpack", 0, 14.7), ("facts", 0, 15.8), ("venv", 124, 4.1), ("gpu_tests", 124, 0), ("bench", 124, 0)]
    (work / "steps.jsonl").write_text("".join(f'{{"step": "{s}", "rc": {rc}, "seconds": {t}}}\n' for s, rc, t in steps))
    (work / "facts.json").write_text('{"dry_run": true, "cuda": false, "python": "3.11.7"}')
    subprocess.run(["/usr/bin/env", "python3", "-m", "venv", "--without-pip", str(bare)], check=True, timeout=60)
    probe = subprocess.run([str(bare / "bin" / "python"), "-c", "import torch"], capture_output=True, timeout=60)
    assert probe.returncode != 0  # what the summary step had
    done = subprocess.run(
        [str(bare / "bin" / "python"), "-m", "segserve.gpu.bundle", "summary", str(work), str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    text = (out / "summary.txt").read_text()
    assert text.startswith("segserve GPU check: DRY RUN (no CUDA)\n")
    assert "venv FAILED rc=124 4s" in text and "bench FAILED rc=124 0s" in text


def test_the_wheel_downloads_run_at_once_each_in_a_folder_of_its_own_and_are_merged(tmp_path, monkeypatch):
    """psutil's abi3 wheel is the same file for every CPython version: two pips writing it into one folder at once
    read each other's half-written file as a bad hash (a make test run failed so). Here each fake pip writes what
    the real ones fetch; a shared folder would show as two commands with the same -d."""
    from segserve.gpu import bundle

    folders = []

    class FakePip:
        def __init__(self, command):
            folder = Path(command[command.index("-d") + 1])
            folders.append(folder)
            folder.mkdir(parents=True)
            names = ["torchserve-0.12.0-py3-none-any.whl"] if "--python-version" not in command else []
            if "--python-version" in command:
                version = command[command.index("--python-version") + 1].replace(".", "")
                names += ["psutil-7.2.2-cp36-abi3-manylinux_2_28_x86_64.whl", f"pyyaml-6.0.4-cp{version}-manylinux_2_28_x86_64.whl"]
            for name in names:
                (folder / name).write_bytes(name.encode())

        def wait(self):
            return 0

    uncompressed = []
    monkeypatch.setattr(bundle.subprocess, "Popen", FakePip)
    monkeypatch.setattr(bundle, "uncompress_torchserve", uncompressed.append)
    wheels = tmp_path / "wheels"
    bundle.download_wheels(wheels, log=lambda _: None)
    assert len(folders) == 1 + len(bundle.PYTHON_VERSIONS) and len(set(folders)) == len(folders)
    assert sorted(p.name for p in wheels.iterdir()) == sorted(
        ["psutil-7.2.2-cp36-abi3-manylinux_2_28_x86_64.whl", "torchserve-0.12.0-py3-none-any.whl"]
        + [f"pyyaml-6.0.4-cp{v.replace('.', '')}-manylinux_2_28_x86_64.whl" for v in bundle.PYTHON_VERSIONS]
    )
    assert uncompressed == [wheels / "torchserve-0.12.0-py3-none-any.whl"]


def test_a_bench_step_stopped_by_its_timeout_still_reports_the_points_it_finished(tmp_path):
    """The sweep's bench step may overrun its share of DEADLINE_S: its finished points are in runs/, with no
    summary.jsonl yet; the summary reads them from there."""
    from segserve.gpu.summary import _benchmark

    folder = tmp_path / "results" / "gpu" / "20261204T000000Z"
    (folder / "runs").mkdir(parents=True)
    for workers, rate in ((1, 400.0), (2, 700.0)):
        record = {"run_id": f"seg-{workers}", "target": "seg", "workers": workers, "throughput_rps": rate, "stable": True}
        (folder / "runs" / f"seg-{workers}.json").write_text(json.dumps(record))
    points = _benchmark(tmp_path / "results")["points"]
    assert [(p["target"], p["workers"], p["throughput_rps"], p["flags"]) for p in points] == [
        ("seg", 1, 400.0, []),
        ("seg", 2, 700.0, []),
    ]
