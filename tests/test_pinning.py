"""Core plans: validation, and a real TorchServe whose workers pin themselves to their model's slots;
without a plan, workers of a model share its cores."""

import fcntl
import multiprocessing
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from handlers.pinning import WORKERS_DIR, SharedCores, count_live_workers, register_worker
from segserve.errors import UsageError
from segserve.serving.cores import live_affinity, load_plan
from segserve.serving.http import request
from segserve.serving.launch import served_targets, start_pipeline
from segserve.serving.server import TorchServe
from tests.conftest import ROOT

PLAN = ROOT / "core_plan.yaml"  # frontend + seg_jpeg__jpeg on core 0, seg_jpeg__seg on core 1
needs_two_cores = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2 or not {0, 1} <= os.sched_getaffinity(0), reason="needs cores 0 and 1"
)


def test_plans_with_overlapping_or_missing_cores_are_refused(tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text("frontend: [0]\nmodels:\n  a: {cores: [0]}\n  b: {cores: [0]}\n")
    with pytest.raises(UsageError, match="core 0 is given to both a and b"):
        load_plan(plan)
    plan.write_text("frontend: [0]\nmodels:\n  a: {cores: [4096]}\n")
    with pytest.raises(UsageError, match=r"a: cores \[4096\] are not available here"):
        load_plan(plan)
    plan.write_text("frontend: [0]\nmodels:\n  a: {cores: [0], slot_cores: 2}\n")
    with pytest.raises(UsageError, match="1 cores do not split into slots of 2"):
        load_plan(plan)
    plan.write_text("frontend: [0]\nmodel: {}\n")
    with pytest.raises(UsageError, match="model: Extra inputs are not permitted"):
        load_plan(plan)


@pytest.fixture(scope="module")
def pinned(tmp_path_factory, model_store):
    server = TorchServe(tmp_path_factory.mktemp("pinned"), model_store, ROOT / "config.properties", free_ports=True, core_plan=PLAN)
    start_pipeline(server, served_targets(None), log=lambda _: None)
    try:
        yield server
    finally:
        server.stop()


def affinity(server, model: str) -> dict[int, str]:
    return {row["pid"]: row["cpus"] for row in live_affinity(server) if row["model"] == model}


def slot_holder(server) -> int:
    """The pid written in seg_jpeg__seg's slot lock, after checking the lock is really held."""
    path = server.run_dir / "core_slots" / "seg_jpeg__seg.0.lock"
    with open(path) as handle:
        with pytest.raises(BlockingIOError):
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return int(handle.read().strip())


@pytest.mark.integration
@needs_two_cores
def test_every_process_runs_on_the_cores_of_the_plan(pinned):
    rows = live_affinity(pinned)
    assert [r["cpus"] for r in rows if r["model"] == "(frontend)"] == ["0"]
    assert list(affinity(pinned, "seg_jpeg__seg").values()) == ["1"]
    assert list(affinity(pinned, "seg_jpeg__jpeg").values()) == ["0"]
    assert slot_holder(pinned) in affinity(pinned, "seg_jpeg__seg")


@pytest.mark.integration
@needs_two_cores
def test_scaling_a_node_up_and_down_keeps_slots_disjoint_and_frees_them(pinned):
    jpeg_before = affinity(pinned, "seg_jpeg__jpeg")
    pinned.scale("seg_jpeg__seg", 2)
    two = affinity(pinned, "seg_jpeg__seg")
    assert len(two) == 2 and set(two.values()) == {"1"}  # the second worker shares its model's core, never core 0
    assert affinity(pinned, "seg_jpeg__jpeg") == jpeg_before  # other models' workers untouched
    pinned.scale("seg_jpeg__seg", 1)
    one = affinity(pinned, "seg_jpeg__seg")
    assert len(one) == 1 and set(one.values()) == {"1"}
    assert slot_holder(pinned) in one  # the slot is held by a live worker: nothing leaked


@pytest.mark.integration
@needs_two_cores
def test_a_killed_workers_slot_is_claimed_by_its_replacement(pinned):
    (old_pid,) = affinity(pinned, "seg_jpeg__seg")
    os.kill(old_pid, signal.SIGKILL)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        workers = pinned.describe("seg_jpeg__seg")["workers"]
        if len(workers) == 1 and workers[0].get("pid") and int(workers[0]["pid"]) != old_pid and workers[0]["status"] == "READY":
            break
        time.sleep(0.5)
    new = affinity(pinned, "seg_jpeg__seg")
    assert old_pid not in new and list(new.values()) == ["1"]
    assert slot_holder(pinned) in new


# Without a core plan: threads × live workers ≤ cores ------------------------------------------------------
def hold_worker_lock(directory: str, ready) -> None:
    register_worker(Path(directory))
    ready.set()
    time.sleep(120)  # until the test ends it


def test_live_workers_are_the_lock_files_held_and_a_killed_holders_file_is_removed(tmp_path):
    fork = multiprocessing.get_context("fork")  # children only flock a file: no need to re-import torch
    holders = []
    threads_before = torch.get_num_threads()
    try:
        for _ in range(3):
            ready = fork.Event()
            holders.append(fork.Process(target=hold_worker_lock, args=(str(tmp_path), ready), daemon=True))
            holders[-1].start()
            assert ready.wait(30)
        assert count_live_workers(tmp_path) == 3
        shared = SharedCores("m", directory=tmp_path)  # this process registers too: 4 live workers
        assert shared.threads == max(1, len(os.sched_getaffinity(0)) // 4)
        holders[0].kill()
        holders[0].join(10)
        stale = tmp_path / f"{holders[0].pid}.lock"
        assert stale.exists()  # the kernel dropped the lock; the file stays until someone counts
        assert count_live_workers(tmp_path) == 3
        assert not stale.exists()
        for child in holders[1:]:
            child.terminate()
            child.join(10)
        shared.counted_at = -float("inf")
        assert shared.refresh() == len(os.sched_getaffinity(0))  # alone again: every core
        assert (tmp_path / f"{os.getpid()}.lock").read_text() == f"{shared.threads}\n"
        assert sorted(p.name for p in tmp_path.iterdir()) == [f"{os.getpid()}.lock"]
    finally:
        for child in holders:
            child.kill()
            child.join(10)
        torch.set_num_threads(threads_before)


@pytest.fixture(scope="module")
def unplanned(tmp_path_factory, model_store):
    """TorchServe without a core plan or thread settings, `seg` with 2 workers."""
    server = TorchServe(tmp_path_factory.mktemp("unplanned"), model_store, ROOT / "config.properties", free_ports=True)
    with pytest.MonkeyPatch.context() as env:  # workers inherit the frontend's environment
        for name in ("OMP_NUM_THREADS", "SEGSERVE_THREADS", "SEGSERVE_CORE_PLAN"):
            env.delenv(name, raising=False)
        server.start(log=lambda _: None)
    try:
        server.register_model("seg.mar", "seg", log=lambda _: None)
        server.scale("seg", 2)  # the archive's model config caps workers at registration
        server.wait_ready("seg")
        yield server
    finally:
        server.stop()


def workers_dir(server, model: str) -> Path:
    """Where a server's workers of `model` hold their locks: its TMPDIR, its process group (the launcher's pid)."""
    return server.run_dir / "tmp" / WORKERS_DIR / str(server.running_pid()) / model


def worker_threads(server, model: str) -> dict[int, str]:
    """pid → the thread count each live worker wrote into its lock file."""
    pids = [int(w["pid"]) for w in server.describe(model)["workers"] if int(w.get("pid") or -1) > 0]
    directory = workers_dir(server, model)
    return {pid: (directory / f"{pid}.lock").read_text().strip() for pid in pids}


def send_until(server, model: str, wanted: str, concurrency: int, timeout_s: float = 90) -> dict[int, str]:
    """Send batches of requests (each worker recounts at a batch, at most once a second) until every worker reports `wanted`."""
    body = (ROOT / "samples" / "shapes_0.jpg").read_bytes()
    token = server.token("inference")

    def predict(_):
        return request(server.url("inference"), "POST", f"/predictions/{model}", token=token, body=body, timeout_s=60).status

    seen: dict[int, str] = {}
    deadline = time.monotonic() + timeout_s
    with ThreadPoolExecutor(concurrency) as pool:
        while time.monotonic() < deadline:
            time.sleep(1.1)
            assert set(pool.map(predict, range(4 * concurrency))) == {200}
            seen = worker_threads(server, model)
            if seen and set(seen.values()) == {wanted}:
                break
    return seen


@pytest.mark.integration
@needs_two_cores
def test_without_a_plan_workers_of_a_model_share_its_cores_and_take_them_back_after_a_scale_down(unplanned):
    cores = len(os.sched_getaffinity(0))
    two = send_until(unplanned, "seg", str(cores // 2), concurrency=8)
    assert len(two) == 2 and set(two.values()) == {str(cores // 2)}  # 2 workers on 2 cores: 1 thread each
    unplanned.scale("seg", 1)
    one = send_until(unplanned, "seg", str(cores), concurrency=1)
    assert len(one) == 1 and set(one.values()) == {str(cores)}
    (pid,) = one
    directory = workers_dir(unplanned, "seg")
    assert sorted(p.name for p in directory.iterdir()) == [f"{pid}.lock"]  # the stopped worker's file is gone
