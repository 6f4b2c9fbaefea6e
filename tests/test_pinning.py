"""Core plans: validation, and a real TorchServe whose workers pin themselves to their model's slots."""

import fcntl
import os
import signal
import time

import pytest

from segserve.cli import start_pipeline
from segserve.errors import UsageError
from segserve.pinning import live_affinity, load_plan
from segserve.server import TorchServe
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
    start_pipeline(server, log=lambda _: None)
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
