"""One batch under torch.profiler, on request from outside the worker (`segserve profile`).

A request is a file <server run dir>/profile-requests/<model>.json holding {"trace": PATH}. Each batch, the
worker looks for its model's file (one stat); the first worker of the model to rename it to its own name takes
the request, runs that batch under torch.profiler and writes a Chrome trace JSON to PATH (and beside it
<model>.ops.txt: the batch's ops by their own CPU time). The run dir comes
from the environment every worker inherits from `segserve serve` (SEGSERVE_RUN_DIR).
"""

import json
import logging
import os
from pathlib import Path

import torch

logger = logging.getLogger(__name__)
REQUESTS_FOLDER = "profile-requests"
RUN_DIR_ENV = "SEGSERVE_RUN_DIR"


def request_path(run_dir: Path, model: str) -> Path:
    return Path(run_dir) / REQUESTS_FOLDER / f"{model}.json"


def post_request(run_dir: Path, model: str, trace: Path) -> None:
    """Ask the model's next batch for a trace written to `trace`. Written beside, then renamed into place: a worker
    looks for the file at every batch, and one that found it still empty dropped it as bad JSON (make test, run 63)."""
    pending = request_path(run_dir, model)
    pending.parent.mkdir(parents=True, exist_ok=True)
    partial = pending.with_name(pending.name + ".partial")
    partial.write_text(json.dumps({"trace": str(trace)}))
    os.replace(partial, pending)


def request_file(model: str) -> Path | None:
    """Where a profile request for this model would appear; None outside a segserve server (no run dir)."""
    run_dir = os.environ.get(RUN_DIR_ENV)
    return request_path(Path(run_dir), model) if run_dir and model else None


def claim(pending: Path) -> str | None:
    """The trace path of a pending request (request_file), taken by this worker; None when there is none."""
    if not pending.exists():
        return None
    taken = pending.with_name(f"{pending.stem}.taken-{os.getpid()}")
    try:
        os.rename(pending, taken)  # atomic: of several workers of the model, one gets it
    except OSError:
        return None
    try:
        return str(json.loads(taken.read_text())["trace"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        logger.warning("ignored profile request %s: %s", pending, error)
        return None
    finally:
        taken.unlink(missing_ok=True)


def traced(run, trace: str):
    """run() under torch.profiler (CPU, shapes recorded); its Chrome trace written to `trace`."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as profiler:
        result = run()
    path = Path(trace)
    path.parent.mkdir(parents=True, exist_ok=True)
    ops = profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=20)
    path.with_name(path.name.replace(".trace.json", "") + ".ops.txt").write_text(ops)
    partial = path.with_name(path.name + ".partial")
    profiler.export_chrome_trace(str(partial))
    os.replace(partial, path)  # whoever waits for the trace sees it whole
    logger.info("wrote a torch.profiler trace of one batch to %s", trace)
    return result
