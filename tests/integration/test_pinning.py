"""Core plans: validation, and a real TorchServe whose workers pin themselves to their model's slots;
without a plan, workers of a model share its cores."""

import fcntl
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from segserve.serving.cores import live_affinity
from segserve.serving.http import request
from segserve.serving.served_pipeline import served_targets, start_pipeline
from segserve.serving.server import TorchServe
from tests.conftest import ROOT
from tests.unit.test_pinning import PLAN, workers_dir  # noqa: F401 (fixtures among them)

needs_two_cores = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2 or not {0, 1} <= os.sched_getaffinity(0), reason="needs cores 0 and 1"
)


@pytest.fixture(scope="module")
def pinned(tmp_path_factory, model_store):
    server = TorchServe(tmp_path_factory.mktemp("pinned"), model_store, ROOT / "config.properties", free_ports=True, core_plan=PLAN)
    start_pipeline(server, served_targets("seg_jpeg"), log=lambda _: None)  # the plan's models: the workflow's two nodes
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


@needs_two_cores
def test_every_process_runs_on_the_cores_of_the_plan(pinned):
    rows = live_affinity(pinned)
    assert [r["cpus"] for r in rows if r["model"] == "(frontend)"] == ["0"]
    assert list(affinity(pinned, "seg_jpeg__seg").values()) == ["1"]
    assert list(affinity(pinned, "seg_jpeg__jpeg").values()) == ["0"]
    assert slot_holder(pinned) in affinity(pinned, "seg_jpeg__seg")


@needs_two_cores
def test_scaling_a_node_up_and_down_keeps_slots_disjoint_and_frees_them(pinned):
    scaling_keeps_slots(pinned)


def scaling_keeps_slots(pinned) -> None:
    """seg_jpeg__seg scaled 1→2→1 on a server serving core_plan.yaml (tests/integration/test_ray_pinning.py too)."""
    jpeg_before = affinity(pinned, "seg_jpeg__jpeg")
    pinned.scale("seg_jpeg__seg", 2)
    two = affinity(pinned, "seg_jpeg__seg")
    assert len(two) == 2 and set(two.values()) == {"1"}  # the second worker shares its model's core, never core 0
    assert affinity(pinned, "seg_jpeg__jpeg") == jpeg_before  # other models' workers untouched
    pinned.scale("seg_jpeg__seg", 1)
    one = affinity(pinned, "seg_jpeg__seg")
    assert len(one) == 1 and set(one.values()) == {"1"}
    assert slot_holder(pinned) in one  # the slot is held by a live worker: nothing leaked


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
