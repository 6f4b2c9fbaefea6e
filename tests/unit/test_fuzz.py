"""The fuzzer (segserve/qa/fuzz.py): its harness sees crashes, hangs and 500s; the saved corpus replays clean;
a bounded run over every handler's input path finds nothing. `make fuzz` runs it longer."""

import random
import struct

import pytest

from handlers.base import BATCH_SIZE_HEADER
from segserve.model.worker_context import worker_context
from segserve.qa.fuzz import CORPUS, MAX_SAVED_BYTES, TARGETS, Harness, judge, read_corpus, save_input
from segserve.qa.fuzz_inputs import Input, InputSource
from segserve.qa.fuzz_worker import unsafe_answer

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


def test_judge_counts_a_phrase_or_header_that_kills_a_worker_as_a_finding():
    reply = {"statuses": [200, 400, 200], "outputs": [b"{}"] * 3, "error": None, "unsafe": ["row 1: status phrase 'x\\r\\n'"]}
    assert judge("areas", b"x", reply, raw_nbytes=8) == ("a status phrase or header that kills a TorchServe worker", reply["unsafe"][0])


@pytest.mark.parametrize(
    "phrase, header, problems",
    [
        ("Bad Request", "4", []),
        (None, "4", []),  # no phrase set: TorchServe sends ""
        ("x\r\nX-Injected: 1", "4", ["row 0: status phrase 'x\\r\\nX-Injected: 1'"]),
        ("x\x85", "4", ["row 0: status phrase 'x\\x85'"]),
        ("Bad Request", 4, ["row 0: header 'x-segserve-batch-size': 4"]),  # TorchServe's encoding fails on a non-str
        ("x" * 257, "4", ["row 0: status phrase '" + "x" * 79]),  # longer than any phrase or header of ours: bounded
    ],
)
def test_unsafe_answer_names_each_phrase_or_header_netty_or_torchserves_encoding_refuses(phrase, header, problems):
    context = worker_context(None, {}, rows=1)
    if phrase is not None:
        context.set_response_status(400, phrase, 0)
    context.set_response_header(0, BATCH_SIZE_HEADER, header)
    found = unsafe_answer(context, [b"{}"])
    assert found[: len(problems)] == problems
    if isinstance(header, int):  # and TorchServe's own create_predict_response fails on it, after the handler
        assert found[-1] == "TorchServe's create_predict_response raised AttributeError: 'int' object has no attribute 'encode'"
    else:
        assert len(found) == len(problems)


def test_a_lone_surrogate_in_a_phrase_fails_torchserves_own_encoding():
    context = worker_context(None, {}, rows=1)
    context.set_response_status(400, "x\ud800", 0)
    assert unsafe_answer(context, [b"{}"])[-1].startswith("TorchServe's create_predict_response raised UnicodeEncodeError")


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
