"""The load generator over several processes, so that it is not the limit (issue #49).

One asyncio process costs 0.33–0.39 CPU-ms a request of the seed's 688 KB body (docs/measurements.md): it fills a
core near 2,500–3,000 req/s, the rate a GPU server is asked to reach. run_load_processes splits one LoadSpec among N
child processes (the closed loop's connections, or the open loop's rate with a seed each), each running run_load
against the same endpoint, and merges what they record into one LoadResult on the parent's clock: the children send
their new requests every check_every_s, the parent calls stop_early on the merge and tells them all to stop.
With processes=1 it is run_load itself.
"""

import dataclasses
import multiprocessing
import queue
import time
from collections.abc import Callable

from segserve.bench.run.load import LoadResult, LoadSpec, run_load

FIELDS = ("intended_s", "end_s", "latency_ms", "status")
_LIVE: set[int] = set()  # the load processes running now: the disturbance sampler counts them as the load generator


def live_pids() -> set[int]:
    return set(_LIVE)


def split(spec: LoadSpec, processes: int) -> list[LoadSpec]:
    """One spec per process: the connections (closed loop) or the rate and connections (open loop) shared out."""
    if spec.request_rate_rps is None and spec.concurrency < processes:
        raise ValueError(f"{processes} load processes for {spec.concurrency} connections: at most one process a connection")
    shares = [spec.concurrency // processes + (index < spec.concurrency % processes) for index in range(processes)]
    rate = None if spec.request_rate_rps is None else spec.request_rate_rps / processes
    return [
        dataclasses.replace(spec, concurrency=max(share, 1), request_rate_rps=rate, seed=spec.seed + index)
        for index, share in enumerate(shares)
    ]


def _child(spec: LoadSpec, duration_s: float, t0: float, check_every_s: float, stop, out) -> None:
    """run_load in this process; every check, the requests recorded since the last one go to the parent, shifted onto
    its clock (time.monotonic is the machine's: the same in every process)."""
    sent = sent_failed = 0
    shift = time.monotonic() - t0  # run_load's own clock starts now
    sampled: set = set()  # the kinds of failure whose sample went to the parent

    def send(result: LoadResult) -> None:
        nonlocal sent, sent_failed
        rows = {name: getattr(result, name)[sent:] for name in FIELDS}
        rows["intended_s"] = [t + shift for t in rows["intended_s"]]
        rows["end_s"] = [t + shift for t in rows["end_s"]]
        rows["failed"] = [(end_s + shift, status, index) for end_s, status, index in result.failed[sent_failed:]]
        rows["samples"] = {kind: body for kind, body in result.samples.items() if kind not in sampled}
        sent, sent_failed = sent + len(rows["status"]), sent_failed + len(rows["failed"])
        sampled.update(rows["samples"])
        out.put(("rows", rows))

    def stop_early(result: LoadResult) -> bool:
        send(result)
        return stop.is_set()

    try:
        result = run_load(spec, max(duration_s - shift, 0.0), stop_early, check_every_s)
        send(result)
        out.put(("done", result.client_cpu_s))
    except Exception as error:  # the parent says which process failed and how
        out.put(("error", f"{type(error).__name__}: {error}"))


def run_load_processes(
    spec: LoadSpec,
    duration_s: float,
    processes: int = 1,
    stop_early: Callable[[LoadResult], bool] | None = None,
    check_every_s: float = 1.0,
) -> LoadResult:
    """run_load's result, the load sent by `processes` processes; client_cpu_s is theirs together."""
    if processes <= 1:
        return run_load(spec, duration_s, stop_early, check_every_s)
    context = multiprocessing.get_context("spawn")  # not fork: the parent has sampler threads running
    stop, out = context.Event(), context.Queue()
    t0 = time.monotonic()
    children = [
        context.Process(target=_child, args=(part, duration_s, t0, check_every_s, stop, out), daemon=True)
        for part in split(spec, processes)
    ]
    for child in children:
        child.start()
        _LIVE.add(child.pid)
    merged, cpu_s, done, errors = LoadResult(), 0.0, 0, []
    next_check_s = check_every_s
    try:
        while done < len(children):
            try:
                kind, payload = out.get(timeout=check_every_s / 2)
            except queue.Empty:
                if not any(child.is_alive() for child in children):
                    errors.append("a load process ended without its result")
                    break
                kind = None
            if kind == "rows":
                for name in FIELDS:
                    getattr(merged, name).extend(payload[name])
                merged.failed.extend(payload["failed"])
                for failure, body in payload["samples"].items():  # the first of each kind to arrive, from any process
                    merged.samples.setdefault(failure, body)
            elif kind == "done":
                cpu_s, done = cpu_s + payload, done + 1
            elif kind == "error":
                errors.append(payload)
                done += 1
            now_s = time.monotonic() - t0
            if stop_early is not None and not stop.is_set() and now_s >= next_check_s:
                next_check_s = now_s + check_every_s
                snapshot = LoadResult(
                    *(list(getattr(merged, name)) for name in FIELDS), now_s, cpu_s, list(merged.failed), dict(merged.samples)
                )
                if stop_early(snapshot):
                    stop.set()
    finally:
        stop.set()
        for child in children:
            child.join(timeout=spec.timeout_s + 30)
            if child.is_alive():
                child.kill()
            _LIVE.discard(child.pid)
    if errors:
        raise RuntimeError(f"load over {processes} processes failed: {'; '.join(errors)}")
    # one list in completion order, as run_load's
    order = sorted(range(len(merged.status)), key=merged.end_s.__getitem__)
    result = LoadResult(*([getattr(merged, name)[i] for i in order] for name in FIELDS))
    result.wall_s, result.client_cpu_s = time.monotonic() - t0, cpu_s
    result.failed, result.samples = sorted(merged.failed), merged.samples
    return result
