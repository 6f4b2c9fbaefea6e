"""The one seam for switches that exist only for tests: nothing here is set in normal use, and a worker with one set
says so in its log. A new test-only switch goes here, not into a handler.

SEGSERVE_TEST_SLOWDOWN=0.1 makes every batch take 10% longer (the handler spins on a core for that share of its time):
how the regression gate (`segserve bench ab --b-env`, `bench compare`) is tested against a version known to be slower.

SEGSERVE_TEST_CUDA_OVERLAP=1 lets a CUDA worker overlap micro-batches before a device run has shown that it gives the
same bytes (handlers/batching.py OVERLAP_CHECKED_ON_CUDA): how the GPU test checks it.
"""

import logging
import os
import time

logger = logging.getLogger(__name__)

SLOWDOWN_ENV = "SEGSERVE_TEST_SLOWDOWN"
CUDA_OVERLAP_ENV = "SEGSERVE_TEST_CUDA_OVERLAP"


def cuda_overlap() -> bool:
    if os.environ.get(CUDA_OVERLAP_ENV) != "1":
        return False
    logger.warning("%s=1: overlap allowed on CUDA before a device run has checked it (for testing)", CUDA_OVERLAP_ENV)
    return True


def slowdown_fraction() -> float:
    text = os.environ.get(SLOWDOWN_ENV, "")
    if not text:
        return 0.0
    fraction = float(text)
    if not 0 <= fraction <= 10:
        raise ValueError(f"{SLOWDOWN_ENV}={text!r}: a fraction of the handler's time between 0 and 10")
    logger.warning(
        "%s=%s: this worker is slowed down on purpose by %.0f%% (for testing a regression gate)", SLOWDOWN_ENV, text, 100 * fraction
    )
    return fraction


def spin(seconds: float) -> None:
    """Busy-wait: a slowdown that costs CPU, as a slower handler would."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
