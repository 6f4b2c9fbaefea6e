"""A Ray engine's replicas on their cores as a TorchServe's workers (#66 item 2): with a core plan
(`segserve serve --engine ray --core-plan`) Ray's own processes, HAProxy and Serve's proxy run on the frontend's cores
and each replica claims its model's slot (handlers/pinning.py, as in tests/integration/test_pinning.py on
TorchServe), shown by `segserve pin --show`; without one, a model's replicas share its cores as workers do, though
each is a process group of its own (engine.WORKERS_GROUP_ENV).

Marked long: two Ray engines, about a minute on 2 cores (docs/testing.md)."""

import fcntl
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from segserve.cli import main
from segserve.engines import engine_interface as engines
from segserve.engines.ray.engine import RayServe
from segserve.serving.cores import live_affinity
from segserve.serving.http import request
from segserve.serving.served_pipeline import served_targets, start_pipeline
from segserve.serving.ts_config import free_port
from tests.conftest import ROOT
from tests.integration.test_pinning import affinity, needs_two_cores, scaling_keeps_slots, slot_holder
from tests.unit.test_pinning import PLAN

pytestmark = pytest.mark.long


def quiet(*_) -> None:
    pass


def ports() -> dict[str, int]:
    return {"port": free_port(), "management_port": free_port()}


@pytest.fixture(scope="module")
def pinned(tmp_path_factory, model_store):
    engine = RayServe(tmp_path_factory.mktemp("ray_pinned"), model_store=model_store, config_template=ROOT / "config.properties", **ports())
    engine.core_plan, engine.haproxy = PLAN, True  # as `segserve serve --engine ray --core-plan` opens it
    engines.record(engine)
    start_pipeline(engine, served_targets("seg_jpeg"), log=quiet)  # the plan's models: the workflow's two nodes
    try:
        yield engine
    finally:
        engine.stop()


@needs_two_cores
def test_rays_processes_run_on_the_frontends_cores_and_each_replica_on_its_models_slot(pinned, capsys):
    rows = live_affinity(pinned)
    own = [row for row in rows if row["model"] in ("(frontend)", "(ray)")]
    assert {row["model"] for row in own} == {"(frontend)", "(ray)"} and {row["cpus"] for row in own} == {"0"}, own
    assert any(row["model"] == "(frontend)" for row in own)  # HAProxy and Serve's proxy found
    assert list(affinity(pinned, "seg_jpeg__seg").values()) == ["1"]
    assert list(affinity(pinned, "seg_jpeg__jpeg").values()) == ["0"]
    assert slot_holder(pinned) in affinity(pinned, "seg_jpeg__seg")  # the replica holds the slot's lock
    # the workflow still answers through its pinned replicas
    sample = next((ROOT / "samples").glob("*.jpg")).read_bytes()
    answer = request(pinned.url("inference"), "POST", "/wfpredict/seg_jpeg", pinned.token("inference"), sample, timeout_s=60)
    assert answer.status == 200 and answer.body.startswith(b"\xff\xd8\xff"), answer.body[:300]  # TorchServe's: JSON's type
    # `segserve pin --show` on the engine's run folder: the same rows
    assert main(["pin", "--show", "--run-dir", str(pinned.run_dir), "--config", str(ROOT / "config.properties")]) == 0
    shown = capsys.readouterr().out
    (seg_pid,) = affinity(pinned, "seg_jpeg__seg")
    assert f"{'seg_jpeg__seg':24s} {seg_pid:>8d}  1" in shown and "(frontend)" in shown, shown


@needs_two_cores
def test_scaling_a_pinned_model_keeps_its_slot_and_other_models_untouched(pinned):
    scaling_keeps_slots(pinned)


def lock_threads(pid: int) -> str | None:
    """What a replica's own lock file says (its thread count), after checking the replica holds it; None: none."""
    for path in (Path(tempfile.gettempdir()) / f"segserve-workers-{os.getuid()}").glob(f"ray-*/seg/{pid}.lock"):
        with open(path) as handle:
            with pytest.raises(BlockingIOError):
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return handle.read().strip()
    return None


@needs_two_cores
def test_without_a_plan_a_models_replicas_share_its_cores_as_workers_do(tmp_path, model_store):
    """2 replicas on 2 cores: a thread each (counted by process group, each would run 2)."""
    engine = RayServe(tmp_path / "run", model_store=model_store, config_template=ROOT / "config.properties", haproxy=True, **ports())
    engine.start(log=quiet)
    try:
        engine.register_model("seg.mar", "seg", workers=2, log=quiet)
        pids = [int(worker["pid"]) for worker in engine.describe("seg")["workers"]]
        assert len(pids) == 2
        sample = next((ROOT / "samples").glob("*.jpg")).read_bytes()

        def one(_) -> int:
            return request(engine.url("inference"), "POST", "/predictions/seg", engine.token("inference"), sample, timeout_s=60).status

        deadline = time.monotonic() + 60  # a replica recounts at a batch, at most once a second
        while {lock_threads(pid) for pid in pids} != {"1"} and time.monotonic() < deadline:
            with ThreadPoolExecutor(4) as pool:
                assert set(pool.map(one, range(8))) == {200}
            time.sleep(1.1)
        assert [lock_threads(pid) for pid in pids] == ["1", "1"]
    finally:
        engine.stop()
