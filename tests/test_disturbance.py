"""Disturbance, measured: CPU that other processes take during a window, the server's own subtracted."""

import subprocess
import sys
import time

from segserve.bench.disturbance import DisturbanceSampler, machine_cpu_s

BURN = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


def burner(seconds: float) -> subprocess.Popen:
    """Another process that keeps one core busy."""
    return subprocess.Popen([sys.executable, "-c", BURN.format(seconds=seconds)])


def shares_while_burning(server_pids_of) -> float:
    process = burner(2.0)
    try:
        sampler = DisturbanceSampler(server_pids_of(process), interval_s=0.1)
        sampler.start()
        time.sleep(1.6)
        sampler.stop()
        return sampler.share(0.3, 1.5)[0]
    finally:
        process.wait()


def test_a_process_burning_a_core_is_seen_as_others_unless_it_is_the_server():
    as_other = shares_while_burning(lambda process: [])
    as_server = shares_while_burning(lambda process: [process.pid])
    # one core of this machine's: 1/cores of it (0.5 on 2 cores) shows up as others …
    assert as_other >= 0.3, as_other
    # … and the same burner counted as the server is subtracted
    assert as_server <= as_other - 0.25, (as_server, as_other)


def test_no_share_before_the_samples_cover_the_span():
    sampler = DisturbanceSampler([], interval_s=0.1)
    sampler.start()
    try:
        assert sampler.share(0.0, 5.0) == (None, None)
    finally:
        sampler.stop()
    busy_s, steal_s = machine_cpu_s()
    assert busy_s > 0 and steal_s >= 0
