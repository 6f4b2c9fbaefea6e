"""The fuzzer (segserve/qa/fuzz.py): its harness sees crashes, hangs and 500s; the saved corpus replays clean;
a bounded run over every handler's input path finds nothing. `make fuzz` runs it longer."""

import pytest

from segserve.qa.fuzz import CORPUS, TARGETS, Harness, read_corpus
from segserve.qa.fuzz_inputs import Input, InputSource, header_text_errors
from tests.unit.test_fuzz import CORPUS_INPUTS, JPEG, NAN_RAW, harness  # noqa: F401 (fixtures among them)


def test_the_harness_reports_a_crash_a_hang_and_a_500_and_serves_on_after_each():
    with Harness(["selftest"], timeout_s=5) as selftest:

        def check(body: bytes):
            return selftest.check("selftest", Input(body.decode(), body))

        assert check(b"ok") is None
        crash = check(b"crash")
        assert crash.kind == "crash" and crash.symptom.startswith("signal 11 (SIGSEGV) in handle (fuzz_worker.py:")
        assert check(b"ok") is None  # a fresh child
        hang = check(b"hang")
        assert hang.kind == "hang" and hang.symptom.startswith("no answer in 5 s in handle (fuzz_worker.py:")
        assert check(b"raise").symptom == "handle() raised RuntimeError (TorchServe: 500 for the whole batch)"
        assert check(b"500").symptom == "status 500 for the fuzzed row"
        phrase = check(b"phrase")  # TorchServe's frontend refuses the phrase and the worker dies (issue 64)
        assert phrase.symptom == "a status phrase or header that kills a TorchServe worker"
        assert phrase.detail == "row 1: status phrase 'deliberate\\r\\nX-Injected: 1'"
        assert check(b"ok") is None


@pytest.mark.parametrize("target, item", CORPUS_INPUTS, ids=[item.description.split(":")[0] for _, item in CORPUS_INPUTS])
def test_a_corpus_input_gets_200_or_400_and_its_batch_mates_200(harness, target, item):
    finding = harness.check(target, item)
    if finding:
        pytest.fail(f"{finding.kind}: {finding.symptom} {finding.detail}\n  input: {item.description}", pytrace=False)


@pytest.mark.parametrize("target", TARGETS)
def test_an_error_text_that_could_break_a_status_line_gets_a_safe_one(harness, target):
    """Upstream error bodies whose message holds CR/LF, NUL, U+0085/2028/2029, a lone surrogate, ANSI escapes or
    100 KB: the jpeg node's 400 once carried the message as its reason phrase, and netty's refusal killed the worker."""
    findings = [harness.check(target, item) for item in header_text_errors()]
    found = [f"{f.input.description}: {f.symptom} {f.detail}" for f in findings if f]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("target", TARGETS)
def test_input_generation_never_breaks_for_many_seeds(target):
    """The harness's own generators: a 10-minute run once stopped on an IndexError in craft_jpeg (seed 3)."""
    for seed in range(6):  # with the corpus as extra seeds, as `segserve.qa.fuzz` runs it
        source = InputSource(target, seed, raw_nbytes=3 * 256 * 448 * 2, extra_seeds=read_corpus(CORPUS, target))
        assert all(isinstance(next(source).body, bytes) for _ in range(1500))
