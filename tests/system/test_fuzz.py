"""The fuzzer (segserve/qa/fuzz.py): its harness sees crashes, hangs and 500s; the saved corpus replays clean;
a bounded run over every handler's input path finds nothing. `make fuzz` runs it longer."""

import pytest

from segserve.qa.fuzz import TARGETS, fuzz
from tests.unit.test_fuzz import CORPUS_INPUTS, JPEG, NAN_RAW, harness  # noqa: F401 (fixtures among them)

FUZZ_SECONDS = 90  # shared evenly by the four targets


def test_a_bounded_fuzz_run_finds_no_crash_hang_or_bad_answer():
    run = fuzz(TARGETS, FUZZ_SECONDS, seed=0, corpus=None)
    assert all(run.tried[target] >= 5 for target in TARGETS), run.summary()  # every target was driven (a share of the time each)
    if run.findings:
        pytest.fail(run.summary(), pytrace=False)
