"""The fuzzer (segserve/qa/fuzz.py): its harness sees crashes, hangs and 500s; the saved corpus replays clean;
a bounded run over every handler's input path finds nothing. `make fuzz` runs it longer."""

import struct

import pytest

from segserve.qa.fuzz import CORPUS, TARGETS, Harness, fuzz, read_corpus

FUZZ_SECONDS = 90  # shared evenly by the four targets
CORPUS_INPUTS = [(target, item) for target in TARGETS for item in read_corpus(CORPUS, target)]


@pytest.fixture(scope="module")
def harness():
    with Harness(list(TARGETS)) as instance:
        yield instance


JPEG = b"\xff\xd8 a jpeg \xff\xd9"
NAN_RAW = struct.pack("<e", float("nan")) * 4  # a raw tensor body of 8 bytes, for raw_nbytes=8


def test_a_bounded_fuzz_run_finds_no_crash_hang_or_bad_answer():
    run = fuzz(TARGETS, FUZZ_SECONDS, seed=0, corpus=None)
    assert all(run.tried[target] >= 5 for target in TARGETS), run.summary()  # every target was driven (a share of the time each)
    if run.findings:
        pytest.fail(run.summary(), pytrace=False)
