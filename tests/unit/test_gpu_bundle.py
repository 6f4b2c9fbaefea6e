"""The GPU bundle (make gpu-bundle): built here, under its size limit, and its run.sh run as a dry run without CUDA;
the summary's goals computed from a GPU run's numbers."""

import os
import subprocess

from segserve.gpu.summary import _goals, summary_text
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


def gpu_run(seg_rps, jpeg_rps, workflow_rps, fused_rps, seg_copied=114688.0, fused_copied=6000.0) -> dict:
    def target(rate, nodes):
        return {"throughput_rps": rate, "nodes": nodes}

    return {
        "targets": {
            "seg": target(seg_rps, {"seg": {"device_to_host_bytes": seg_copied, "response_bytes": 114706.0}}),
            "jpeg": target(jpeg_rps, {"jpeg": {"device_to_host_bytes": 6000.0, "response_bytes": 6000.0}}),
            "seg_jpeg": target(workflow_rps, {}),
            "seg_jpeg_fused": target(fused_rps, {"seg_jpeg_fused": {"device_to_host_bytes": fused_copied, "response_bytes": 6000.0}}),
        }
    }


def test_the_goals_compare_the_pipelines_with_the_slower_member_and_the_copies_with_the_answers():
    goals = _goals(gpu_run(314, 420, 290, 300), cuda=True)
    assert goals["seg_jpeg_over_slower_member"] == {"ratio": 0.924, "goal": 0.9, "met": True}
    assert goals["seg_jpeg_fused_over_slower_member"] == {"ratio": 0.955, "goal": 0.95, "met": True}
    assert goals["device_to_host_is_the_answer"]["met"]
    seed = _goals(gpu_run(314, 420, 141, 141), cuda=True)  # the seed's report: 141 req/s together
    assert not seed["seg_jpeg_over_slower_member"]["met"] and not seed["seg_jpeg_fused_over_slower_member"]["met"]
    logits = _goals(gpu_run(314, 420, 300, 300, seg_copied=2 * 256 * 448 * 2), cuda=True)  # logits copied to the host
    assert not logits["device_to_host_is_the_answer"]["met"]
    assert not logits["device_to_host_is_the_answer"]["nodes"]["seg/seg"]["met"]
    # the fused pipeline keeps the class map on the device: a copy of it on top of the JPEG is a miss
    kept = _goals(gpu_run(314, 420, 300, 300, fused_copied=6000.0 + 114688.0), cuda=True)
    assert not kept["device_to_host_is_the_answer"]["nodes"]["seg_jpeg_fused/seg_jpeg_fused"]["met"]


def test_the_summary_text_says_when_a_goal_is_missed():
    summary = {
        "facts": {"cuda": True, "dry_run": False, "device": "NVIDIA H200"},
        "steps": [{"step": "bench", "rc": 0, "seconds": 80.0}],
        "gpu_tests": {"ran": False},
        "serve": {},
        "benchmark": gpu_run(314, 420, 141, 141),
        "goals": _goals(gpu_run(314, 420, 141, 141), cuda=True),
    }
    for target in summary["benchmark"]["targets"].values():
        target.update(latency_p99_ms=10.0, requests_failed=0, device_to_host_bytes_per_request=0.0, precision="fp16")
    text = summary_text(summary)
    assert text.startswith("segserve GPU check: GPU\n")
    assert "seg_jpeg_fused_over_slower_member: 0.45 (goal ≥ 0.95) NOT met" in text
