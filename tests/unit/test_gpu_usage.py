"""GPU use per point from NVML (segserve/machine/gpu_usage.py), through a scripted stand-in for pynvml: the
columns come out of the readings, and a machine without NVML gets only the reason."""

import sys
import time
from types import ModuleType, SimpleNamespace

import pytest

from segserve.machine.gpu_usage import GpuUsageSampler


def fake_pynvml(readings: list[list[tuple[int, int, int]]], fail_init: Exception | None = None) -> ModuleType:
    """pynvml answering (gpu %, memory %, memory used MiB) per GPU for each reading in turn, the last one after."""
    module = ModuleType("pynvml")
    turn = {"reading": -1}
    module.calls = []

    def init():
        module.calls.append("init")
        if fail_init:
            raise fail_init

    def rates(handle):
        if handle == 0:  # every reading starts with the first GPU
            turn["reading"] = min(turn["reading"] + 1, len(readings) - 1)
        gpu, memory, _ = readings[turn["reading"]][handle]
        return SimpleNamespace(gpu=gpu, memory=memory)

    module.nvmlInit = init
    module.nvmlShutdown = lambda: module.calls.append("shutdown")
    module.nvmlDeviceGetCount = lambda: len(readings[0])
    module.nvmlDeviceGetHandleByIndex = lambda index: index
    module.nvmlDeviceGetUtilizationRates = rates
    module.nvmlDeviceGetMemoryInfo = lambda handle: SimpleNamespace(used=readings[turn["reading"]][handle][2] * 2**20)
    return module


def test_the_gpu_columns_are_the_mean_and_max_of_the_readings(monkeypatch):
    nvml = fake_pynvml([[(10, 5, 1000)], [(50, 20, 1500)], [(90, 35, 1200)]])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    sampler = GpuUsageSampler(interval_s=60).start()  # the first reading; the thread's would come a minute later
    sampler.sample(), sampler.sample()
    assert sampler.stop() == {
        "gpu_util_mean_pct": 50.0,
        "gpu_util_max_pct": 90.0,
        "gpu_memory_util_mean_pct": 20.0,
        "gpu_memory_used_max_mib": 1500.0,
        "gpu_samples": 3,
    }
    assert nvml.calls == ["init", "shutdown"]


def test_several_gpus_are_averaged_for_utilisation_and_summed_for_memory(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([[(80, 30, 1000), (20, 10, 500)]]))
    columns = GpuUsageSampler(interval_s=60).start().stop()
    assert (columns["gpu_util_mean_pct"], columns["gpu_memory_util_mean_pct"], columns["gpu_memory_used_max_mib"]) == (50.0, 20.0, 1500.0)


def test_only_the_readings_inside_the_measured_windows_count():
    sampler = GpuUsageSampler()
    # (s since start, gpu %, memory %, memory MiB): the warm-up's reading, then two in the measured window
    sampler.samples = [(0.5, 0.0, 0.0, 100.0), (5.0, 60.0, 10.0, 300.0), (7.0, 80.0, 10.0, 300.0)]
    assert sampler.columns([(4.0, 8.0)])["gpu_util_mean_pct"] == 70.0
    assert sampler.columns([(20.0, 30.0)])["gpu_samples"] == 3  # no reading in the windows: all of them


def test_the_thread_reads_the_gpus_until_stopped(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([[(40, 10, 800)]]))
    sampler = GpuUsageSampler(interval_s=0.01).start()
    time.sleep(0.3)
    columns = sampler.stop()
    assert columns["gpu_samples"] >= 3 and columns["gpu_util_mean_pct"] == 40.0
    count = len(sampler.samples)
    time.sleep(0.05)
    assert len(sampler.samples) == count


def test_without_pynvml_the_sampler_measures_nothing_and_says_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    sampler = GpuUsageSampler().start()
    columns = sampler.stop()
    assert list(columns) == ["gpu_usage_unavailable"] and "pynvml is not installed" in columns["gpu_usage_unavailable"]
    assert sampler.thread is None


@pytest.mark.parametrize(
    ("nvml", "reason"),
    [
        (fake_pynvml([[(0, 0, 0)]], fail_init=RuntimeError("Driver Not Loaded")), "NVML could not start: RuntimeError: Driver Not Loaded"),
        (fake_pynvml([[]]), "NVML sees no GPU"),
    ],
)
def test_nvml_that_cannot_start_or_sees_no_gpu_is_the_reason(monkeypatch, nvml, reason):
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    assert GpuUsageSampler().start().stop() == {"gpu_usage_unavailable": reason}
