"""Core pinning inside a worker: claim a free slot of this model's cores, pin to it, size the thread pool.

`segserve serve --core-plan` writes the plan as JSON and names it in SEGSERVE_CORE_PLAN, which every
worker inherits. A slot is claimed with an exclusive flock on its lock file, held open for the life of
the worker: the kernel releases it when the worker exits — also when it is killed — so a replacement
worker finds the slot free again, and scaling a model claims and frees slots without touching the
workers of any other model. When every slot of the model is taken, the worker shares its model's
first slot: slots of different models never overlap.

Without a slot (no plan, or the model not in it) and without a thread count given, SharedCores splits the
worker's cores evenly among its model's live workers, counted by the flocks they hold on per-worker lock files.
"""

import fcntl
import json
import logging
import math
import os
import re
import stat
import tempfile
import time
from pathlib import Path

import torch

PLAN_ENV = "SEGSERVE_CORE_PLAN"
logger = logging.getLogger(__name__)
_held_locks: list = []  # open lock files: closing one would release its slot


def pin_all_threads(pid: int, cpus: list[int]) -> None:
    """sched_setaffinity acts per thread: pin every thread the process has now (new ones inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except (ProcessLookupError, PermissionError):
            pass  # a thread that ended meanwhile


def claim_cores(model_name: str) -> tuple[list[int], int | None] | None:
    """(cores, slot index or None when sharing) for this worker, pinned; None without a plan for the model."""
    plan_path = os.environ.get(PLAN_ENV)
    if not plan_path:
        return None
    plan = json.loads(Path(plan_path).read_text())
    slots = plan["models"].get(model_name)
    if not slots:
        return None
    lock_dir = Path(plan["lock_dir"])
    for index, cpus in enumerate(slots):
        handle = open(lock_dir / f"{model_name}.{index}.lock", "a+")  # noqa: SIM115 — held open on purpose
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        _held_locks.append(handle)
        return _pin(cpus), index
    logger.warning("%s: all %d core slots are taken; sharing slot 0 (%s)", model_name, len(slots), slots[0])
    return _pin(slots[0]), None


def _pin(cpus: list[int]) -> list[int]:
    pin_all_threads(os.getpid(), cpus)
    torch.set_num_threads(len(cpus))
    return cpus


# Without a core plan --------------------------------------------------------------------------------
# <tmp>/segserve-workers-<uid>/<group>/<model>/<pid>.lock: `segserve serve` gives each server its own TMPDIR, and a
# TorchServe's workers share its process group; handlers run in other processes (tests, bench inputs) do not count.
# Ray starts each replica as a process group of its own, so the Ray engine names its replicas' group in GROUP_ENV.
# Under a stock `torchserve` <tmp> is the shared /tmp: the folder is the user's own (mode 0700), or not used.
WORKERS_DIR = "segserve-workers"
GROUP_ENV = "SEGSERVE_WORKERS_GROUP"
# The longest a worker waits for its own lock file, held only while a peer removes a stale file of its pid (a moment);
# longer, and something else holds it (a process of another pid namespace that shares <tmp>): it goes on uncounted.
REGISTER_WAIT_S = 10.0
RECOUNT_S = 1.0
# Before compiling: the count must be unchanged this long (TorchServe starts a model's workers together, and each
# registers within a second or two of the others), and is waited for at most SETTLE_LIMIT_S.
SETTLE_S, SETTLE_LIMIT_S = 2.0, 15.0
_process_share: "SharedCores | None" = None  # this worker's, when it sizes its threads by sharing
_registered: dict[Path, object] = {}  # lock file → its open file, held for the life of the process


def workers_root() -> Path | None:
    """<tmp>/segserve-workers-<uid>, made with mode 0700 where missing; None, logged, where it is a link, not a folder,
    another user's or open to others: there another local user could hold a worker's lock file (a worker waiting on
    it) or add lock files that shrink its share."""
    root = Path(tempfile.gettempdir()) / f"{WORKERS_DIR}-{os.getuid()}"
    try:
        root.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as error:
        logger.warning("%s: cannot make it (%s): this worker's threads are not shared with its peers'", root, error.strerror)
        return None
    found = os.lstat(root)  # the entry itself: a link is not followed
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or stat.S_IMODE(found.st_mode) & 0o077:
        logger.warning(
            "%s: not a folder of user %d with mode 0700 (mode %s, user %d), not used: this worker's threads are not "
            "shared with its peers' (remove it, and the next worker makes it again)",
            root, os.getuid(), stat.filemode(found.st_mode), found.st_uid,
        )  # fmt: skip
        return None
    return root


def workers_group() -> str:
    """The folder of the workers that count one another: GROUP_ENV where it is a plain name (a path would leave the
    root), else this process's group (TorchServe's frontend and its workers)."""
    named = os.environ.get(GROUP_ENV, "")
    if re.fullmatch(r"[A-Za-z0-9_-]{1,64}", named):
        return named
    return str(os.getpgid(0))


def register_worker(directory: Path):
    """Hold an exclusive flock on `<directory>/<pid>.lock` for the life of this worker: the lock is what
    makes it count as live (the kernel drops it on exit or kill). Returns the open file, or None (logged) when
    another process holds it for REGISTER_WAIT_S; a process that registers twice (several handlers in one process,
    as in tests) gets its first one back."""
    path = directory / f"{os.getpid()}.lock"
    if path in _registered:
        return _registered[path]
    directory.mkdir(parents=True, exist_ok=True)
    wait_s = REGISTER_WAIT_S
    deadline = time.monotonic() + wait_s
    while True:
        handle = open(path, "a+")  # noqa: SIM115 — held open on purpose
        if not _lock_by(handle, deadline):  # a peer holds a stale file of this pid a moment, to remove it
            handle.close()
            logger.warning("%s: held by another process for %g s: this worker is not counted among its peers", path, wait_s)
            return None
        if _still_linked(path, handle):
            _registered[path] = handle
            return handle
        handle.close()  # a peer removed the file between open and flock: lock a fresh one


def _lock_by(handle, deadline: float) -> bool:
    """An exclusive flock on `handle`, tried until `deadline` (time.monotonic()); False when it was not had."""
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


def count_live_workers(directory: Path) -> int:
    """Lock files someone holds (this worker's own included); stale ones, left by workers that are gone, are removed."""
    live = 0
    for path in directory.glob("*.lock"):
        try:
            handle = open(path)  # noqa: SIM115
        except FileNotFoundError:
            continue
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                live += 1  # may briefly count a stale file a peer is removing: the next count corrects it
                continue
            if _still_linked(path, handle):
                path.unlink()
    return live


def _still_linked(path: Path, handle) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
    except FileNotFoundError:
        return False


class SharedCores:
    """Threads of a worker that has no core slot: its model's cores (this process's affinity) split evenly
    among the model's live workers, so threads × workers never exceed the cores. TorchServe starts one
    worker per core by default, each with every core as threads; workers come and go with scaling, so the
    count is redone at the start of a batch, at most once per RECOUNT_S."""

    def __init__(self, model_name: str, directory: Path | None = None):
        self.model_name = model_name
        self.cores = len(os.sched_getaffinity(0))
        if directory is None:
            root = workers_root()
            directory = root / workers_group() / model_name if root is not None else None
        self.lock = register_worker(directory) if directory is not None else None
        # unregistered (a folder not ours, a lock file held): it counts alone, as a worker of no peers would
        self.directory = directory if self.lock is not None else None
        self.threads = 0
        self.kept_for: str | None = None  # why the thread count no longer follows the share (a compiled network)
        self.declined = 0  # the last share not applied (logged once per value)
        self.counted_at = -math.inf
        self.refresh()
        self.counted_at = -math.inf  # recount at the first batch: peers may have started since
        global _process_share
        _process_share = self

    def refresh(self) -> int:
        """Recount (unless counted within RECOUNT_S) and resize torch's thread pool when the share changed."""
        now = time.monotonic()
        if now - self.counted_at < RECOUNT_S:
            return self.threads
        self.counted_at = now
        workers = self.live_workers()
        threads = max(1, self.cores // max(workers, 1))
        if threads != self.threads and self.kept_for is not None:
            if threads != self.declined:
                self.declined = threads
                logger.warning(
                    "%s: %d live worker(s) share %d core(s), a share of %d thread(s), but this worker keeps %d: %s",
                    self.model_name, workers, self.cores, threads, self.threads, self.kept_for,
                )  # fmt: skip
            return self.threads
        if threads != self.threads:
            torch.set_num_threads(threads)
            self.threads = threads
            if self.lock is not None:  # The lock file says how many threads this worker runs: exact, for `ls` and tests.
                self.lock.seek(0)
                self.lock.truncate()
                self.lock.write(f"{threads}\n")
                self.lock.flush()
            logger.info("%s: %d live worker(s) share %d core(s): %d thread(s) each", self.model_name, workers, self.cores, threads)
        return threads

    def live_workers(self) -> int:
        return count_live_workers(self.directory) if self.directory is not None else 1

    def settle(self, sleep=time.sleep) -> int:
        """Count until the number of live workers stayed the same for SETTLE_S (at most SETTLE_LIMIT_S), and size
        the threads by it: the workers started with this one have registered by then."""
        started = changed = time.monotonic()
        last = self.live_workers()
        while (now := time.monotonic()) - changed < SETTLE_S and now - started < SETTLE_LIMIT_S:
            sleep(0.25)
            count = self.live_workers()
            if count != last:
                last, changed = count, time.monotonic()
        self.counted_at = -math.inf
        return self.refresh()

    def keep(self, why: str) -> None:
        """From now on the thread count stays as it is; a changed share is logged with `why`, not applied."""
        self.kept_for, self.declined = why, self.threads


def settle_threads_for_compiling() -> int | None:
    """Called just before a network is compiled (handlers/optimize.py, `warm_up`). Dynamo guards a compiled graph on
    torch's thread count: a worker that compiled at 2 threads and is then told 1 (a second worker came up)
    compiles every batch size again on requests, minutes for int8. Measured on 2 cores, fused int8 with 2
    workers: 48.3 req/s at the default threads against 100.2 at `threads: 1` (benchmarks/int8_threads.yaml).
    So a sharing worker sizes its threads once its model's workers have all registered, and keeps them.
    Returns the threads kept, or None where threads are not shared (a core slot, `threads`, OMP_NUM_THREADS)."""
    if _process_share is None:
        return None
    threads = _process_share.settle()
    _process_share.keep(f"its network was compiled for {threads} thread(s), and a change would compile it again on requests")
    logger.info("%s: compiling for %d thread(s), kept from now on", _process_share.model_name, threads)
    return threads
