"""Core pinning inside a worker: claim a free slot of this model's cores, pin to it, size the thread pool.

`segserve serve --core-plan` writes the plan as JSON and names it in SEGSERVE_CORE_PLAN, which every
worker inherits. A slot is claimed with an exclusive flock on its lock file, held open for the life of
the worker: the kernel releases it when the worker exits — also when it is killed — so a replacement
worker finds the slot free again, and scaling a model claims and frees slots without touching the
workers of any other model. When every slot of the model is taken, the worker shares its model's
first slot: slots of different models never overlap.
"""

import fcntl
import json
import logging
import os
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
