"""The autoscaler on a real TorchServe (#16): a phase change (small images, then large photos) makes it move a
worker, and no request fails while it moves. The budget is set above this 2-core machine's on purpose: with one
worker per node at least, two cores leave nothing to move (the CLI refuses such a budget).

Which node takes the worker is the machine's answer, not the test's: large photos grow both seg's decode and
jpeg's encode, and which grows more depends on the cores (here jpeg's queue usually wins; with one core busy
elsewhere seg's did, and the move to seg was tried and undone). The direction on given metrics is tested
without a server (tests/unit/test_autoscale.py)."""

import os
import time

from torchvision.io import encode_jpeg

from segserve.archives.catalog import Catalog
from segserve.autoscale.loop import Autoscaler
from segserve.autoscale.rules import Bounds, Policy
from segserve.bench.run.profiler import Background, torchserve_load
from segserve.model.synthetic import make_sample
from tests.conftest import ROOT

SEG, JPEG = "seg_jpeg__seg", "seg_jpeg__jpeg"


def test_a_phase_of_large_photos_moves_a_worker_and_no_request_fails(server, tmp_path):
    target = Catalog(ROOT).target("seg_jpeg")
    small = [(ROOT / "samples" / "shapes_0.jpg").read_bytes()]
    large = [encode_jpeg(make_sample(seed, 1080, 1920)[0], quality=90).numpy().tobytes() for seed in (1, 2)]
    bounds = {SEG: Bounds(1, 2), JPEG: Bounds(1, 2)}
    policy = Policy(budget_workers=3, min_interval_s=4, hysteresis=0.1, min_queue_ms=1)
    scaler = Autoscaler(server, bounds, policy, tmp_path)
    records, results = [], []
    try:
        # the large phase lasts until the move, at most 90 s: on a busy machine a trial undone, a mix that
        # has not held yet and a new worker importing torch each take several of its 2 s steps
        for phase, bodies, seconds in (("small", small, 8), ("large", large, 90)):
            load = Background(torchserve_load(server, target.endpoint, bodies, 6), seconds + 60)
            load.start()
            started = time.monotonic()
            while time.monotonic() - started < seconds:
                time.sleep(2)
                records.append({**scaler.step(), "phase": phase})
                if phase == "large" and records[-1]["applied"] and "takes a worker" in records[-1]["why"]:
                    break  # a move of its own in this phase (not the undo of a trial from the last)
            results.append(load.finish())
    finally:
        server.scale(JPEG, 1)
        server.scale(SEG, 1)
    print(*[(r["phase"], r["move"], r["why"]) for r in records], sep="\n")  # shown with -s: what it saw and did
    assert any(r["phase"] == "large" and r["applied"] and "takes a worker" in r["why"] for r in records), records
    failed = [result.status_counts() for result in results if not all(result.ok)]
    assert not failed, (failed, server_errors(server))
    assert all(r["error"] is None for r in records)


def server_errors(server) -> list[str]:
    """TorchServe's log lines that say why a request failed: shown with a failure, for the next reader."""
    words = ("ERROR", "Exception", "Timed out", "WORKER_SCALED_DOWN", "status: 5")
    lines = [line for log in sorted((server.run_dir / "logs").glob("*.log")) for line in log.read_text(errors="replace").splitlines()]
    return [line[:300] for line in lines if any(w in line for w in words)][-40:]


def test_a_fused_pipeline_under_load_takes_a_worker_and_its_threads_follow(server, tmp_path):
    from tests.integration.test_pinning import worker_threads

    fused = Catalog(ROOT).target("seg_jpeg_fused")
    cores = len(os.sched_getaffinity(0))
    policy = Policy(budget_workers=cores, min_interval_s=4, hysteresis=0.1, min_queue_ms=1)
    scaler = Autoscaler(server, {fused.name: Bounds(1, cores)}, policy, tmp_path, fused=True)
    records, threads = [], {}
    load = Background(torchserve_load(server, fused.endpoint, [(ROOT / "samples" / "shapes_0.jpg").read_bytes()], 8), 150)
    load.start()
    try:
        started = time.monotonic()
        while time.monotonic() - started < 90 and server.describe(fused.name)["minWorkers"] == 1:
            time.sleep(2)  # 8 connections on one worker: requests wait, and it takes a worker
            records.append(scaler.step())
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and set((threads := worker_threads(server, fused.name)).values()) != {str(cores // 2)}:
            time.sleep(1)  # each worker recounts its threads at a batch, at most once a second
    finally:
        result = load.finish()
        server.scale(fused.name, 1)
    print(*[(r["move"], r["why"]) for r in records], sep="\n")  # shown with -s
    assert [fused.name, 2] in [list(step) for r in records if r["applied"] for step in r["move"]], records
    assert len(threads) == 2 and set(threads.values()) == {str(cores // 2)}, threads  # workers × threads = the budget
    assert all(200 <= s < 300 for s in result.status) and all(r["error"] is None for r in records)
