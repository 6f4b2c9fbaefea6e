"""The bare-forward reference runs on the device the workers use (issue #48): the command the bench builds asks
for it, segserve.model.bare says where it ran, and a device that is not there is refused in one line."""

import json
import subprocess
import sys

import pytest
import torch

from segserve.bench.run import baselines
from segserve.bench.run.bare_forward import bare_command
from segserve.bench.run.point import network_variant
from segserve.bench.suite.spec import LoadSettings
from tests.conftest import ROOT


def device_argument(command: list[str]) -> str:
    return command[command.index("--device") + 1]


@pytest.mark.parametrize(("handler", "expected"), [({"device": "cpu"}, "cpu"), ({"device": "auto"}, "auto"), ({}, "auto")])
def test_the_bare_forward_asks_for_the_device_of_the_points_weights_node(handler, expected):
    variant, python = network_variant({"optimize": "eager", "precision": "fp32", **handler}, {})
    assert device_argument(bare_command(ROOT / "weights" / "seg.pt", 2, variant, python)) == expected


def test_a_bare_command_without_a_device_stays_on_the_cpu():
    # segserve optimize's variants name no device: measured where they were before the bench asked for one
    assert device_argument(bare_command(ROOT / "weights" / "seg.pt", 2, {"optimize": "compile"})) == "cpu"


def test_the_end_of_suite_bare_forward_runs_once_per_device_the_nodes_ran_on(monkeypatch):
    asked = []
    monkeypatch.setattr(baselines, "run_bare", lambda weights, threads, shapes, **kw: asked.append((shapes, kw["variant"]["device"])) or [])
    records = [
        {"target": "seg", "batch_size": 4, "omp_num_threads": 2, "weights_device": "cpu"},
        {"target": "seg", "batch_size": 8, "omp_num_threads": 2, "weights_device": "auto"},
        {"target": "seg", "batch_size": 2, "omp_num_threads": 2},  # an earlier run's record: the handler's default
        {"target": "seg", "batch_size": 16, "omp_num_threads": 2, "skip_network": True},  # no network ran: no reference
    ]
    baselines.bare_throughputs(records, ROOT / "weights" / "seg.pt", lambda target: "seg", lambda _: None, LoadSettings())
    assert sorted(asked) == [(["2:256:448", "8:256:448"], "auto"), (["4:256:448"], "cpu")]


def run_bare_module(weights, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "segserve.model.bare", "--weights", str(weights), "--threads", "1", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_the_bare_forward_on_the_cpu_says_so_and_times_the_forward_alone(tiny_weights):
    done = run_bare_module(tiny_weights, "--device", "cpu", "--shape", "1:64:64", "--seconds", "0.1", "--rounds", "1")
    assert done.returncode == 0, done.stderr
    entry = json.loads(done.stdout.splitlines()[-1])
    # forward alone, as before issue #48: CPU numbers stay comparable with earlier runs
    assert (entry["device"], entry["work"], entry["batch_size"]) == ("cpu", "forward", 1)
    assert entry["throughput_ips"] > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_asking_for_cuda_without_it_is_refused_in_one_line(tiny_weights):
    done = run_bare_module(tiny_weights, "--device", "cuda", "--shape", "1:64:64")
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and done.stdout == ""
    assert len(lines) == 1 and "--device cuda" in lines[0] and "--device auto" in lines[0], done.stderr


@pytest.mark.gpu
def test_the_bare_forward_on_a_gpu_times_forward_and_argmax_there(tiny_weights):
    done = run_bare_module(tiny_weights, "--device", "auto", "--shape", "2:64:64", "--seconds", "0.2", "--rounds", "1")
    assert done.returncode == 0, done.stderr
    entry = json.loads(done.stdout.splitlines()[-1])
    assert (entry["device"], entry["work"]) == ("cuda", "forward+argmax") and entry["throughput_ips"] > 0
