"""The fuzzer (segserve/qa/fuzz.py): its harness sees crashes, hangs and 500s; the saved corpus replays clean;
a bounded run over every handler's input path finds nothing. `make fuzz` runs it longer."""

import random
import struct

import pytest

from segserve.qa.fuzz import CORPUS, MAX_SAVED_BYTES, TARGETS, Harness, judge, read_corpus, save_input
from segserve.qa.fuzz_inputs import Input, InputSource

CORPUS_INPUTS = [(target, item) for target in TARGETS for item in read_corpus(CORPUS, target)]


@pytest.fixture(scope="module")
def harness():
    with Harness(list(TARGETS)) as instance:
        yield instance


JPEG = b"\xff\xd8 a jpeg \xff\xd9"
NAN_RAW = struct.pack("<e", float("nan")) * 4  # a raw tensor body of 8 bytes, for raw_nbytes=8


@pytest.mark.parametrize(
    "target, body, statuses, outputs, symptom",
    [
        ("fused", b"x", [200, 400, 500], [JPEG, b"{}", b"{}"], "batch-mates answered 200 and 500"),
        ("fused", b"x", [200, 200, 200], [JPEG, b"<html>", JPEG], "200 with a malformed fused answer"),
        ("areas", b"x", [200, 200, 200], [b"{}", b"{}", b"{}"], None),
        ("areas", b"x", [200, 200, 200], [b"{}", b"{", b"{}"], "200 with a malformed areas answer"),
        ("areas", b"x", [200, 200, 200], [b"{}", b"[]", b"{}"], "200 with a malformed areas answer"),
        ("fused", NAN_RAW, [200, 200, 200], [JPEG, JPEG, JPEG], "200 for a raw tensor holding NaN/Inf (expected 400)"),
        ("fused", NAN_RAW, [200, 400, 200], [JPEG, b"{}", JPEG], None),
        ("jpeg", NAN_RAW, [200, 200, 200], [JPEG, JPEG, JPEG], None),  # the jpeg node takes class maps, not raw tensors
    ],
)
def test_judge_wants_200_or_400_for_the_row_well_formed_answers_and_200_for_its_batch_mates(target, body, statuses, outputs, symptom):
    problem = judge(target, body, {"statuses": statuses, "outputs": outputs, "error": None}, raw_nbytes=8)
    assert (problem and problem[0]) == symptom


@pytest.mark.parametrize("target", ["seg", "jpeg"])
def test_inputs_are_a_function_of_the_seed(target):
    def first(seed: int) -> list[Input]:
        source = InputSource(target, seed, raw_nbytes=3 * 256 * 448 * 2)
        return [next(source) for _ in range(len(source.seeds) + 40)]  # every seed, then crafted and mutated ones

    assert first(1) == first(1)
    assert first(1) != first(2)


def test_a_saved_input_reads_back_with_its_description_and_a_big_one_is_gzipped_or_skipped(tmp_path):
    tiny, nan_raw = b"\x89PNG tiny", struct.pack("<e", float("nan")) * (3 * 256 * 448)
    assert save_input(tmp_path, "seg", tiny, "crash: x\ninput: a tiny png\n").endswith(".bin")
    assert save_input(tmp_path, "seg", nan_raw, "bad answer: y\ninput: raw fp16, all NaN\n").endswith(".bin.gz")
    assert save_input(tmp_path, "seg", random.Random(0).randbytes(200_000), "input: noise\n") == ""  # does not compress
    saved = {item.body: item.description for item in read_corpus(tmp_path, "seg")}
    assert len(saved) == 2 and saved[tiny].endswith(": a tiny png") and saved[nan_raw].endswith(": raw fp16, all NaN")


def test_the_corpus_holds_small_inputs_of_every_target():
    assert {target for target, _ in CORPUS_INPUTS} == set(TARGETS)
    assert all(path.stat().st_size <= MAX_SAVED_BYTES for path in CORPUS.rglob("*.bin*"))
