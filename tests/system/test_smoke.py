"""The smoke tier (#52): the documented commands that no other test runs, each once in a short form that still
checks its outcome. SMOKE in segserve/docs/smoke.py maps every command the docs and the Makefile name to the
test that runs it (these and others) or to why it cannot run here; tests/unit/test_docs.py fails on one without.

`make chaos` was dead for weeks while `make test` stayed green: nothing ran it. Each test here runs a command as
its Makefile target does (the same module or CLI, shorter), so a command that breaks fails `make test`."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch
import yaml

from segserve.cli import main
from segserve.qa.fuzz import TARGETS as FUZZ_TARGETS
from segserve.serving.processes import MARKER
from segserve.serving.ts_config import free_port_base
from tests.conftest import ROOT


def run_module(module: str, *args: str, timeout_s: float) -> subprocess.CompletedProcess:
    """`python -m MODULE ARGS` from the checkout, as its make target runs it; stdout and stderr together."""
    command = [sys.executable, "-m", module, *args]
    return subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout_s)


def test_make_chaos_meets_its_goal_on_a_short_load(model_store, tmp_path):
    """`make chaos`, short: the workflow alone under 4 requests/s; each of its two node's workers killed and back,
    a node rescaled 1 → 2 → 1, the hostile inputs refused, the frontend killed and served again with `segserve
    serve`, then used: no 5xx outside a kill, none unanswered (the goal `make chaos` judges)."""
    args = ["--targets", "seg_jpeg", "--pause-s", "0.5", "--rps", "4", "--load-s", "2"]
    done = run_module("segserve.qa.chaos", *args, "--model-store", str(model_store), "--run-dir", str(tmp_path / "run"), timeout_s=300)
    assert done.returncode == 0 and "\ngoal met:" in done.stdout, done.stdout[-3000:]
    assert done.stdout.count("a new worker was READY after") == 2 and "serving again" in done.stdout, done.stdout[-3000:]
    refused = int(done.stdout.split("hostile requests: ")[1].split()[0])
    assert refused > 0, done.stdout[-3000:]


def test_make_mix_answers_every_small_and_large_request(model_store):
    """`make mix`, short: the fused pipeline, 2 s of small requests alone and 2 s beside 25-megapixel JPEGs; every
    request answered 200 (its goal) and both rows of the table printed with their latencies."""
    args = ["--model-store", str(model_store), "--targets", "seg_jpeg_fused", "--seconds", "2", "--rounds", "1"]
    done = run_module("segserve.qa.mix", *args, timeout_s=240)
    assert done.returncode == 0 and "goal met: 0 request(s)" in done.stdout, done.stdout[-3000:]
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("seg_jpeg_fused ")]
    assert [row[1] for row in rows] == ["0.00", "0.50"], done.stdout
    alone, beside = rows
    assert float(alone[2]) > 0 and float(beside[2]) > 0  # small p50 in ms, alone and beside the large ones
    answered, sent = map(int, beside[6].split("/"))
    assert answered == sent >= 1, done.stdout  # the large JPEGs were sent and answered


def test_make_fuzz_for_a_few_seconds_finds_nothing(tmp_path):
    """`make fuzz`, 4 s instead of 15 min, with its --save-crashes (into a copy of the corpus): every target
    driven, no finding, nothing saved."""
    corpus = tmp_path / "corpus"
    shutil.copytree(ROOT / "tests" / "fuzz_corpus", corpus)
    before = sorted(p.relative_to(corpus) for p in corpus.rglob("*"))
    done = run_module("segserve.qa.fuzz", "--seconds", "4", "--save-crashes", "--corpus", str(corpus), timeout_s=180)
    assert done.returncode == 0 and "\n0 finding(s)" in done.stdout, done.stdout[-3000:]
    rows = [line.split() for line in done.stdout.splitlines()]
    tried = {row[0]: int(row[1]) for row in rows if row and row[0] in FUZZ_TARGETS}  # target, inputs, inputs/s, findings
    assert set(tried) == set(FUZZ_TARGETS) and min(tried.values()) > 0, done.stdout
    assert sorted(p.relative_to(corpus) for p in corpus.rglob("*")) == before


@pytest.fixture
def litserve_peer() -> Path:
    """The litserve peer's venv as `make setup-peers` makes it (its pattern rule; the project venv taken as is). It
    installs in seconds (litserve, fastapi, uvicorn: 45 MB, torch from the project venv); ray's and triton's don't."""
    done = subprocess.run(
        ["make", "-o", ".venv/.installed", ".peers/litserve/.installed"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    if done.returncode != 0:  # no registry here: said, not hidden
        pytest.skip(f"cannot run here: `make .peers/litserve/.installed` failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return ROOT / ".peers" / "litserve" / "bin" / "python"


def test_make_peers_measures_one_point_of_one_peer(litserve_peer, tmp_path, capsys):
    """`make peers`, one point of one peer: benchmarks/peers.yaml's litserve target at its first setting, measured
    for a few seconds as the suite measures it: answered, no request failed, its processes gone afterwards."""
    peers = yaml.safe_load((ROOT / "benchmarks" / "peers.yaml").read_text())
    litserve = next(t for t in peers["targets"] if isinstance(t, dict) and t["name"] == "litserve")
    litserve["params"] = {name: values[:1] for name, values in litserve["params"].items()}
    load = {"warmup_s": 0.5, "window_s": 1.0, "stable_windows": 2, "max_windows": 2, "stability_tolerance": 1.0, "max_others_share": 1.0}
    suite = {"name": "peers", "targets": [litserve], "inputs": peers["inputs"], "grid": {"load": {"concurrency": [2]}}, "load": load}
    (tmp_path / "peers.yaml").write_text(yaml.safe_dump(suite))
    assert main(["bench", str(tmp_path / "peers.yaml"), "--results", str(tmp_path / "results")]) == 0
    (folder,) = (tmp_path / "results" / "peers").iterdir()
    (record,) = [json.loads(line) for line in (folder / "summary.jsonl").read_text().splitlines()]
    assert record["error"] is None and record["requests_ok"] > 0 and record["requests_failed"] == 0, record
    assert record["target"] == "litserve" and record["throughput_rps"] > 0
    assert peer_processes("litserve") == []  # the app and its workers were stopped with it


def peer_processes(name: str) -> list[psutil.Process]:
    """Processes a command target named NAME started (its run folder, segserve-peer-NAME-…, in their environment)."""
    found = []
    for process in psutil.process_iter():
        try:
            if f"segserve-peer-{name}-" in process.environ().get(MARKER, ""):
                found.append(process)
        except psutil.Error:
            continue
    return found


def test_make_gpu_check_on_the_cpu_skips_every_gpu_test_with_its_reason_and_the_check_refuses(monkeypatch, capsys):
    """`make gpu-check`'s CPU side: its pytest selection (`-m gpu`, as the Makefile writes it) collects, and every
    test in it skips saying it needs CUDA; `python -m segserve.gpu.check` refuses in one line. With CUDA, make test
    runs the gpu tests itself and this runs the check for a second."""
    from segserve.gpu import check

    if torch.cuda.is_available():
        monkeypatch.setattr(sys, "argv", ["check", "--seconds", "1", "--batch-size", "4"])
        check.main()
        assert json.loads(capsys.readouterr().out)["seg_fp16_rps"] > 0
        return
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-q", "-rs"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    skipped = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert done.returncode == 0 and skipped, done.stdout[-3000:]
    assert all(line.endswith("needs CUDA (run `make gpu-check` on a GPU machine)") for line in skipped), skipped
    assert f"{len(skipped)} skipped" in done.stdout.splitlines()[-1] and "failed" not in done.stdout.splitlines()[-1]
    monkeypatch.setattr(sys, "argv", ["check", "--seconds", "1"])
    with pytest.raises(SystemExit, match="^gpu-check: CUDA is not available$"):
        check.main()


def test_make_clean_removes_its_three_folders_and_nothing_else(tmp_path):
    """`make clean`, the Makefile as written, in a scratch folder: model_store, out and .segserve go; results and
    weights stay."""
    for path in ("model_store/seg.mar", "out/a.jpg", ".segserve/ts/config.properties", "results/quick/r.json", "weights/seg.pt"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("x")
    subprocess.run(["make", "-f", str(ROOT / "Makefile"), "-C", str(tmp_path), "clean"], check=True, capture_output=True, timeout=60)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results", "weights"]


def test_segserve_train_help_lists_its_options(capsys):
    """`segserve train --help`: parses and names its options (training itself: tests/integration/test_training.py)."""
    with pytest.raises(SystemExit) as exit:
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert exit.value.code == 0 and all(option in out for option in ("--weights", "--backbone", "--steps"))


def test_segserve_scale_and_profile_on_a_served_pipeline(model_store, tmp_path, capsys):
    """`segserve scale` and `segserve profile` on a server `segserve serve --targets seg_jpeg_fused` started:
    1 → 2 → 1 workers, each step said and done; a flame graph and a torch.profiler trace of the worker."""
    args = ["--run-dir", str(tmp_path / "run"), "--model-store", str(model_store), "--config", str(ROOT / "config.properties")]
    assert main(["serve", "--targets", "seg_jpeg_fused", "--port-base", str(free_port_base()), *args]) == 0
    try:
        for workers in (2, 1):
            assert main(["scale", "seg_jpeg_fused", "--workers", str(workers), *args]) == 0
            assert f"seg_jpeg_fused: {workers} worker(s)" in capsys.readouterr().out
        profile = ["profile", "seg_jpeg_fused", "--seconds", "1", "--connections", "2", "--out", str(tmp_path / "profiles")]
        assert main([*profile, *args]) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        (folder,) = (tmp_path / "profiles").iterdir()
        assert f"profile: {folder}" in out and "(handlers/" in out  # the report names the handler's own functions
        assert len(list(folder.glob("seg_jpeg_fused-*.svg"))) == 1 and (folder / "seg_jpeg_fused.trace.json").is_file()
    finally:
        assert main(["serve", "--stop", *args]) == 0
