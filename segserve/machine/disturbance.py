"""Disturbance, measured: the CPU time that processes other than the server and the load generator took on
this machine during each measurement window (and the hypervisor's steal time, where the kernel reports it).

The machine's busy time comes from /proc/stat; the server's processes and this process (the load
generator) are subtracted; what is left belongs to others. A window where others took more than a set
share of the machine is not a measurement of the server alone: the bench discards and re-measures it.
"""

import os
import threading
import time
from pathlib import Path

import psutil

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def machine_cpu_s() -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole machine since boot: /proc/stat's first line."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq) / TICKS_PER_S, steal / TICKS_PER_S


class DisturbanceSampler:
    """Samples the machine's, the server's and this process's CPU time every `interval_s` in a thread; asked
    afterwards (or while it runs) for the share of the machine others took between two times, in seconds
    since start()."""

    def __init__(self, server_pids: list[int], interval_s: float = 0.25, own_pids=None):
        # own_pids() → the pids of the load generator's other processes now (segserve/bench/run/load_processes.py):
        # theirs is this process's CPU, not others'
        self.own_pids = own_pids or set
        self.own: dict[int, psutil.Process] = {}
        self.processes = []
        for pid in server_pids:
            try:
                self.processes.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                pass
        self.interval_s, self.cores = interval_s, len(os.sched_getaffinity(0)) or 1
        self.samples: list[tuple[float, float, float]] = []  # (s since start, others' busy s, steal s)
        self.stopped = threading.Event()
        self.lock = threading.Lock()

    def _server_cpu_s(self) -> float:
        total = 0.0
        for process in self.processes:
            try:
                times = process.cpu_times()
                total += times.user + times.system
            except psutil.NoSuchProcess:
                pass
        return total

    def _own_cpu_s(self) -> float:
        total = time.process_time()
        for pid in self.own_pids():
            try:
                times = self.own.setdefault(pid, psutil.Process(pid)).cpu_times()
                total += times.user + times.system
            except psutil.Error:  # ended between the two calls: its last CPU lands after the last window
                pass
        return total

    def _sample(self) -> None:
        busy_s, steal_s = machine_cpu_s()
        others_s = busy_s - self._server_cpu_s() - self._own_cpu_s()
        with self.lock:
            self.samples.append((time.monotonic() - self.started, others_s, steal_s))

    def _loop(self) -> None:
        while not self.stopped.wait(self.interval_s):
            self._sample()

    def start(self) -> None:
        self.started = time.monotonic()
        self._sample()
        self.thread = threading.Thread(target=self._loop, name="disturbance", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()
        self._sample()

    def share(self, from_s: float, to_s: float) -> tuple[float | None, float | None]:
        """(others, steal) as a share of the whole machine (0..1) between from_s and to_s; None before samples
        cover the span. The samples nearest to the bounds are used (every `interval_s`)."""
        with self.lock:
            samples = list(self.samples)
        if len(samples) < 2 or samples[-1][0] < to_s - self.interval_s:
            return None, None
        first = min(samples, key=lambda s: abs(s[0] - from_s))
        last = min(samples, key=lambda s: abs(s[0] - to_s))
        span_s = last[0] - first[0]
        if span_s <= 0:
            return None, None
        machine_s = span_s * self.cores
        # clock ticks are coarse (10 ms) and sampled at different instants: a few ms below zero is zero
        return max(0.0, (last[1] - first[1]) / machine_s), max(0.0, (last[2] - first[2]) / machine_s)


class OwnSpan:
    """Others' share of the machine while this process does the work being measured (a bare-forward slice,
    timed inside the measuring process): the machine's busy time less this process's own CPU, the rule the
    sampler applies to a served window, without a thread."""

    def __init__(self):
        self.cores = len(os.sched_getaffinity(0)) or 1
        self.started_s, self.busy_s, self.own_s = time.monotonic(), machine_cpu_s()[0], time.process_time()

    def others_share(self) -> float:
        wall_s = time.monotonic() - self.started_s
        others_s = machine_cpu_s()[0] - self.busy_s - (time.process_time() - self.own_s)
        # clock ticks are coarse (10 ms): a few ms below zero is zero
        return max(0.0, others_s / (wall_s * self.cores)) if wall_s > 0 else 0.0
