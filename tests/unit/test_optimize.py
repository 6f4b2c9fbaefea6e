"""Model optimisations (#15): compiled networks at fixed batch buckets, int8 PT2E programs, the accuracy gate,
`segserve optimize`, and the bench's optimize axis. Timings are never asserted: only what each variant answers."""

import pytest
import torch

from handlers import optimize
from segserve.bench.results.render import status
from segserve.bench.run.point import validity
from segserve.bench.suite.columns import best
from segserve.errors import RuntimeFailure
from segserve.model.accuracy import MAX_IOU_DROP, verdict
from segserve.model.quantize import quantize_int8

SMALL = {"input_height": 64, "input_width": 96}


def test_batch_buckets_are_powers_of_two_up_to_the_largest_batch():
    assert optimize.batch_buckets("compile", 8) == (1, 2, 4, 8)
    assert optimize.batch_buckets("int8", 6) == (1, 2, 4, 6)
    assert optimize.batch_buckets("eager", 8) == () and optimize.batch_buckets("ipex", 8) == ()
    assert [optimize.padded_rows(n, (1, 2, 4, 6)) for n in (1, 3, 5, 6, 7)] == [1, 4, 6, 6, 7]
    assert optimize.padded_rows(3, ()) == 3


def test_an_unknown_optimisation_and_int8_at_another_precision_are_refused():
    with pytest.raises(ValueError, match="optimize must be one of"):
        optimize.optimise(torch.nn.Identity(), "tensorrt", torch.device("cpu"), torch.float32)
    with pytest.raises(ValueError, match="use precision fp32"):
        optimize.optimise(torch.nn.Identity(), "int8", torch.device("cpu"), torch.bfloat16)


def test_the_accuracy_gate_marks_an_iou_drop_over_0_01_invalid_with_the_reason():
    assert verdict({"iou": 0.970, "iou_eager": 0.975, "agreement": 0.99}) == (True, None)
    valid, reason = verdict({"iou": 0.95, "iou_eager": 0.975, "agreement": 0.9})
    assert not valid and "0.0250 below eager fp32's 0.9750" in reason and str(MAX_IOU_DROP) in reason


def test_an_invalid_point_never_wins_and_the_report_says_why():
    fast = {"run_id": "a", "throughput_rps": 300.0, "accurate": False, "invalid_reason": "IoU 0.9 is 0.07 below", "error": None}
    slow = {"run_id": "b", "throughput_rps": 100.0, "error": None}
    for record in (fast, slow):
        record.update(validity(record))
    assert fast["valid"] is False and slow["valid"] is True
    assert best([fast, slow], {}, "throughput_rps") is slow
    assert status(fast, slow, {}) == "✗ invalid (accuracy)"
    failed = {"run_id": "c", "error": "RuntimeFailure: optimize ipex: intel_extension_for_pytorch is not importable"}
    assert validity(failed) == {"valid": False, "invalid_reason": failed["error"]}


def test_a_model_that_cannot_be_quantised_names_the_step(tmp_path):
    scripted = tmp_path / "scripted.pt"
    torch.jit.script(torch.nn.Conv2d(3, 2, 1)).save(str(scripted))
    with pytest.raises(RuntimeFailure, match=r"int8 quantisation of scripted.pt failed while \w+"):
        quantize_int8(scripted, SMALL, tmp_path / "out.pt2", images=2)
