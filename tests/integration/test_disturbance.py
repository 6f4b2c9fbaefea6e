"""Disturbance, measured: CPU that other processes take during a window, the server's own subtracted."""

import subprocess
import sys
import time

import pytest

from segserve.machine.disturbance import DisturbanceSampler, machine_cpu_s

# it measures other processes' CPU: alone, after the rest (make test)
pytestmark = pytest.mark.solo

BURN = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


def burner(seconds: float) -> subprocess.Popen:
    """Another process that keeps one core busy."""
    return subprocess.Popen([sys.executable, "-c", BURN.format(seconds=seconds)])


def burner_share(**counted_as) -> tuple[float, float]:
    """(others' share seen by a sampler that knows nothing of a burner, by one told of it as `counted_as`) over
    the same window: whatever else runs on the machine meanwhile is in both, so their difference is the burner."""
    process = burner(2.0)
    try:
        blind = DisturbanceSampler([], interval_s=0.1)
        told = DisturbanceSampler(**{key: value(process.pid) for key, value in counted_as.items()}, interval_s=0.1)
        for sampler in (blind, told):
            sampler.start()
        time.sleep(1.6)
        for sampler in (blind, told):
            sampler.stop()
        return blind.share(0.3, 1.5)[0], told.share(0.3, 1.5)[0]
    finally:
        process.wait()


def test_a_process_burning_a_core_is_seen_as_others_unless_it_is_the_server():
    others_share, server_share = burner_share(server_pids=lambda pid: [pid])
    # the burner keeps most of one core busy, up to 1/cores of the machine (0.5 on 2 cores): seen as others'
    # by the first, subtracted by the second
    assert others_share - server_share >= 0.2, (others_share, server_share)


def test_the_load_generators_own_processes_are_not_others():
    """A load spread over processes (#49): their CPU is the load generator's, as this process's is."""
    others_share, own_share = burner_share(server_pids=lambda pid: [], own_pids=lambda pid: lambda: {pid})
    assert others_share - own_share >= 0.2, (others_share, own_share)


def test_no_share_before_the_samples_cover_the_span():
    sampler = DisturbanceSampler([], interval_s=0.1)
    sampler.start()
    try:
        assert sampler.share(0.0, 5.0) == (None, None)
    finally:
        sampler.stop()
    busy_s, steal_s = machine_cpu_s()
    assert busy_s > 0 and steal_s >= 0


def test_a_bare_forward_beside_busy_cores_is_flagged_disturbed_not_reported_clean(tiny_weights):
    import os

    from segserve.bench.run.bare_forward import run_bare

    # the bare forward on one thread, every other core burnt: others take ≥ half the machine in every slice
    burners = [burner(20.0) for _ in range(max(len(os.sched_getaffinity(0)) - 1, 1))]
    try:
        entry = run_bare(tiny_weights, 1, ["1:64:64"], seconds=0.9, rounds=3, max_others_share=0.1, retries=2)[0]
    finally:
        for process in burners:
            process.kill()
            process.wait()
    assert entry["disturbed"] is True and entry["others_cpu_pct"] >= 30.0, entry
    assert len(entry["slices_ips"]) == len(entry["slices_others_cpu_pct"]) == 5  # every slice measured, and kept
