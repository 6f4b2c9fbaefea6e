"""Core plans: validation, and a real TorchServe whose workers pin themselves to their model's slots;
without a plan, workers of a model share its cores."""

import fcntl
import multiprocessing
import os
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from handlers import pinning
from handlers.pinning import WORKERS_DIR, SharedCores, count_live_workers, register_worker
from segserve.errors import UsageError
from segserve.serving.cores import load_plan
from tests.conftest import ROOT

PLAN = ROOT / "core_plan.yaml"  # frontend + seg_jpeg__jpeg on core 0, seg_jpeg__seg on core 1


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


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a share smaller than every core needs 2 cores")
def test_a_worker_compiling_waits_for_its_peers_then_keeps_its_threads(tmp_path, monkeypatch, caplog):
    """Dynamo compiles again when torch's thread count changes: a sharing worker counts its peers until the
    count holds, sizes its threads by it before compiling, and keeps them when the share changes later."""
    cores = len(os.sched_getaffinity(0))
    fork = multiprocessing.get_context("fork")
    threads_before = torch.get_num_threads()
    monkeypatch.setattr(pinning, "_process_share", None)
    assert pinning.settle_threads_for_compiling() is None  # not sharing: nothing to settle
    peer = None
    try:
        shared = SharedCores("m", directory=tmp_path)
        assert shared.threads == cores  # alone so far
        ready = fork.Event()
        peer = fork.Process(target=hold_worker_lock, args=(str(tmp_path), ready), daemon=True)
        starter = __import__("threading").Timer(0.6, peer.start)  # a peer that registers while this one waits
        starter.start()
        began = time.monotonic()
        assert pinning.settle_threads_for_compiling() == cores // 2
        assert ready.wait(5) and time.monotonic() - began >= pinning.SETTLE_S
        assert torch.get_num_threads() == cores // 2
        peer.kill()
        peer.join(10)
        shared.counted_at = -float("inf")
        with caplog.at_level("WARNING", logger="handlers.pinning"):
            assert shared.refresh() == cores // 2  # alone again, but compiled for the share: kept
        assert torch.get_num_threads() == cores // 2
        assert f"a share of {cores} thread(s), but this worker keeps {cores // 2}" in caplog.text
    finally:
        if peer is not None and peer.pid:
            peer.kill()
            peer.join(10)
        torch.set_num_threads(threads_before)


def workers_dir(server, model: str) -> Path:
    """Where a server's workers of `model` hold their locks: its TMPDIR, its process group (the launcher's pid)."""
    return server.run_dir / "tmp" / f"{WORKERS_DIR}-{os.getuid()}" / str(server.running_pid()) / model


def test_a_lock_folder_of_the_shared_tmp_that_is_open_to_others_a_link_or_another_users_is_not_used(tmp_path, monkeypatch, caplog):
    """Under a stock `torchserve` the workers' locks live in the shared /tmp: in a folder another local user made (or
    may write) they could hold a worker's lock file, so that it waits, or add lock files that shrink its share. Such
    a folder is not used: the worker counts alone and says why."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # gettempdir(): the shared /tmp of a stock torchserve
    cores, threads_before, uid = len(os.sched_getaffinity(0)), torch.get_num_threads(), os.getuid()
    root = tmp_path / f"{WORKERS_DIR}-{uid}"
    try:
        for folder in (tmp_path / WORKERS_DIR, root):  # the name of old, and the user's own
            folder.mkdir()
            os.chmod(folder, 0o777)
        with caplog.at_level("WARNING", logger="handlers.pinning"):
            shared = SharedCores("m")
        assert sorted(tmp_path.rglob("*")) == sorted([tmp_path / WORKERS_DIR, root])  # nothing made in either
        assert shared.threads == cores and shared.lock is None  # alone: no peer counted, no file of its own
        assert f"{root}: not a folder of user {uid} with mode 0700 (mode drwxrwxrwx, user {uid}), not used" in caplog.text
        os.chmod(root, 0o700)
        root.rename(tmp_path / "mine")
        root.symlink_to(tmp_path / "mine")  # a link in its place: not followed
        caplog.clear()
        with caplog.at_level("WARNING", logger="handlers.pinning"):
            assert SharedCores("m").lock is None and list((tmp_path / "mine").iterdir()) == []
        assert "(mode lrwxrwxrwx" in caplog.text
        root.unlink()
        (tmp_path / "mine").rename(root)  # mode 0700, but seen from another user: theirs
        monkeypatch.setattr(os, "getuid", lambda: uid + 1)
        root.rename(tmp_path / f"{WORKERS_DIR}-{uid + 1}")
        caplog.clear()
        with caplog.at_level("WARNING", logger="handlers.pinning"):
            assert SharedCores("m").lock is None
        assert f"not a folder of user {uid + 1} with mode 0700 (mode drwx------, user {uid})" in caplog.text
        assert list(tmp_path.rglob("*.lock")) == []
    finally:
        torch.set_num_threads(threads_before)


def test_a_folder_of_the_users_own_is_made_with_mode_0700_and_used(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    threads_before = torch.get_num_threads()
    try:
        shared = SharedCores("m")
        root = tmp_path / f"{WORKERS_DIR}-{os.getuid()}"
        assert stat.S_IMODE(os.lstat(root).st_mode) == 0o700 and shared.lock is not None
        assert (root / str(os.getpgid(0)) / "m" / f"{os.getpid()}.lock").is_file()
    finally:
        torch.set_num_threads(threads_before)


def test_workers_each_leading_a_process_group_count_one_another_by_the_group_their_engine_names(tmp_path, monkeypatch):
    """Ray starts every replica as a process group of its own: counted by process group, two replicas of a model on 2
    cores would run 2 threads each. The Ray engine names their group (SEGSERVE_WORKERS_GROUP); a name that is no
    plain folder name is not used (the process group is)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv(pinning.GROUP_ENV, "ray-engine1")
    child = "import sys; from handlers.pinning import SharedCores; SharedCores('m'); print('up', flush=True); sys.stdin.read()"
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    threads_before = torch.get_num_threads()
    peer = subprocess.Popen([sys.executable, "-c", child], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert peer.stdout.readline() == b"up\n"
        assert os.getpgid(peer.pid) != os.getpgid(0)  # a group of its own, as a replica's
        shared = SharedCores("m")
        assert shared.live_workers() == 2 and shared.directory == tmp_path / f"{WORKERS_DIR}-{os.getuid()}" / "ray-engine1" / "m"
        monkeypatch.setenv(pinning.GROUP_ENV, "../elsewhere")
        assert pinning.workers_group() == str(os.getpgid(0))
    finally:
        peer.communicate(b"", timeout=30)
        torch.set_num_threads(threads_before)


def test_a_lock_file_another_process_holds_is_waited_on_a_bounded_time_then_the_worker_counts_alone(tmp_path, monkeypatch, caplog):
    """A worker waits for its own lock file only while a peer removes a stale one of its pid; one held longer (by a
    process that shares the folder from another pid namespace, say) never keeps it waiting for ever."""
    monkeypatch.setattr(pinning, "REGISTER_WAIT_S", 0.3)
    threads_before = torch.get_num_threads()
    with open(tmp_path / f"{os.getpid()}.lock", "a+") as held:  # another open file: its flock excludes ours
        fcntl.flock(held, fcntl.LOCK_EX)
        started = time.monotonic()
        try:
            with caplog.at_level("WARNING", logger="handlers.pinning"):
                shared = SharedCores("m", directory=tmp_path)
            assert time.monotonic() - started < 5
            assert shared.lock is None and shared.threads == len(os.sched_getaffinity(0))
            assert f"{os.getpid()}.lock: held by another process for 0.3 s: this worker is not counted" in caplog.text
        finally:
            torch.set_num_threads(threads_before)
