"""GPU use during a measurement, read from NVML: how busy the GPUs were and how much of their memory was taken.

NVML comes through `pynvml` (the package nvidia-ml-py), which a GPU machine's image has and segserve does not
depend on: it is imported when a sampler starts. Where it is missing, or NVML cannot start (no driver, no GPU),
the sampler measures nothing and its columns say why, once (`gpu_usage_unavailable`).
"""

import threading
import time

MIB = 2**20


class GpuUsageSampler:
    """Every `interval_s` in a thread between start() and stop(): the utilisation of every GPU NVML sees (the %
    of the sample period a kernel ran, and the % its memory was read or written) and the memory they hold.
    With several GPUs a sample is their mean utilisation and their summed memory."""

    def __init__(self, interval_s: float = 0.1):
        self.interval_s = interval_s
        self.samples: list[tuple[float, float, float, float]] = []  # (s since start, util %, memory util %, memory used MiB)
        self.unavailable: str | None = None
        self.nvml, self.handles, self.thread = None, [], None
        self.stopped = threading.Event()
        self.lock = threading.Lock()

    def start(self) -> "GpuUsageSampler":
        self.started = time.monotonic()
        self.unavailable = self._open()
        if self.unavailable is None:
            self.thread = threading.Thread(target=self._loop, name="gpu-usage", daemon=True)
            self.thread.start()
        return self

    def _open(self) -> str | None:
        """None when NVML answers, else why it does not."""
        try:
            import pynvml
        except ImportError:
            return "pynvml is not installed (the package nvidia-ml-py; GPU machines' images have it)"
        try:
            pynvml.nvmlInit()
        except Exception as failure:  # pynvml.NVMLError_*: no driver, no library, insufficient permissions
            return f"NVML could not start: {type(failure).__name__}: {failure}"
        try:
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception as failure:
            pynvml.nvmlShutdown()
            return f"NVML could not list the GPUs: {type(failure).__name__}: {failure}"
        if not self.handles:
            pynvml.nvmlShutdown()
            return "NVML sees no GPU"
        self.nvml = pynvml
        try:
            self.sample()  # the first reading: a GPU that cannot report its utilisation (a MIG slice) says so here
        except Exception as failure:
            pynvml.nvmlShutdown()
            return f"NVML could not read the GPUs' use: {type(failure).__name__}: {failure}"
        return None

    def sample(self) -> None:
        """One reading of every GPU (the thread's; a test calls it to script the readings)."""
        rates = [self.nvml.nvmlDeviceGetUtilizationRates(handle) for handle in self.handles]
        used_mib = sum(self.nvml.nvmlDeviceGetMemoryInfo(handle).used for handle in self.handles) / MIB
        util = sum(rate.gpu for rate in rates) / len(rates)
        memory_util = sum(rate.memory for rate in rates) / len(rates)
        with self.lock:
            self.samples.append((time.monotonic() - self.started, util, memory_util, used_mib))

    def _loop(self) -> None:
        while not self.stopped.wait(self.interval_s):
            try:
                self.sample()
            except Exception as failure:  # a GPU lost mid-run: keep what was read before
                self.unavailable = f"NVML failed while sampling: {type(failure).__name__}: {failure}"
                return

    def stop(self) -> dict:
        """The columns over every sample (usage_columns)."""
        if self.thread is not None:
            self.stopped.set()
            self.thread.join()
            self.thread = None
            self.nvml.nvmlShutdown()
        return self.columns()

    def columns(self, spans: list[tuple[float, float]] | None = None) -> dict:
        """The columns over the samples taken in `spans` (seconds since start(), as the load's windows are); over
        all of them when no span is given or no sample falls in one."""
        with self.lock:
            samples = list(self.samples)
        inside = [s for s in samples if any(start <= s[0] <= end for start, end in spans or [])]
        return usage_columns(inside or samples, self.unavailable)


def usage_columns(samples: list[tuple[float, float, float, float]], unavailable: str | None = None) -> dict:
    """{gpu_util_mean_pct, gpu_util_max_pct, gpu_memory_util_mean_pct, gpu_memory_used_max_mib, gpu_samples} of
    (time, util %, memory util %, memory used MiB) samples; without samples, only why (`gpu_usage_unavailable`)."""
    if not samples:
        return {"gpu_usage_unavailable": unavailable or "no GPU sample was taken"}
    utils, memory_utils, used = ([s[k] for s in samples] for k in (1, 2, 3))
    return {
        "gpu_util_mean_pct": round(sum(utils) / len(utils), 1),
        "gpu_util_max_pct": round(max(utils), 1),
        "gpu_memory_util_mean_pct": round(sum(memory_utils) / len(memory_utils), 1),
        "gpu_memory_used_max_mib": round(max(used), 1),
        "gpu_samples": len(samples),
    }
