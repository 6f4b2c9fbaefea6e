"""The serving path's own cost (#49): a seg handler with no network, the handlers' time split by stage, and the
server's CPU per request by role."""

import subprocess
import sys
import time
import types

import pytest
import torch

from handlers import classmap
from handlers.segmentation import SegmentationHandler
from segserve.bench.run.measure import worker_stage_columns
from segserve.serving.metrics import ProcessSampler, cpu_ms_per_request, cpu_s_of
from tests.conftest import make_context, status_of, with_rows

RAW_SHAPE = (3, 256, 448)


def counters_after_a_batch(handler, bodies) -> tuple[list, dict]:
    counters = {}
    context = with_rows(make_context(None, {}), len(bodies))
    context.metrics = types.SimpleNamespace(add_counter=lambda name, value: counters.update({name: value}))
    out = handler.handle([{"body": bytearray(b)} for b in bodies], context)
    assert [status_of(context, i) for i in range(len(bodies))] == [200] * len(bodies)
    return out, counters


def test_skip_network_answers_the_argmax_of_the_inputs_first_channels_and_runs_no_network(tiny_weights):
    handler = SegmentationHandler()
    handler.initialize(make_context(tiny_weights.parent, {"skip_network": True}, tiny_weights.name))
    assert not any(True for _ in handler.network.parameters())  # the stand-in has no weights: nothing is computed
    raws = [torch.randn(RAW_SHAPE, generator=torch.Generator().manual_seed(seed)).half() for seed in (1, 2)]
    out, _ = counters_after_a_batch(handler, [raw.numpy().tobytes() for raw in raws])
    for raw, answer in zip(raws, out, strict=True):
        labels = classmap.unpack(answer).labels
        assert torch.equal(labels, raw[:2].float().argmax(0).to(torch.uint8))


def test_a_batch_reports_each_stage_of_the_handlers_time(tiny_weights):
    handler = SegmentationHandler()
    handler.initialize(make_context(tiny_weights.parent, {}, tiny_weights.name))
    raw = torch.randn(RAW_SHAPE).half().numpy().tobytes()
    _, counters = counters_after_a_batch(handler, [raw, raw, raw])
    for stage in ("ReadMs", "DecodeMs", "StageMs", "PredictMs", "ForwardMs", "EncodeMs", "AnswerMs"):
        assert f"Segserve{stage}" in counters, stage
    assert 0 < counters["SegserveForwardMs"] <= counters["SegservePredictMs"]  # the forward pass runs inside predict
    assert counters["SegserveRequests"] == 3


def test_worker_columns_sum_the_nodes_and_leave_the_forward_pass_out():
    stages = {
        "seg_jpeg__seg": {"read_ms": 0.1, "decode_ms": 0.5, "stage_ms": 0.3, "predict_ms": 10.0, "forward_ms": 9.0, "answer_ms": 0.2},
        "seg_jpeg__jpeg": {"read_ms": 0.1, "decode_ms": 0.4, "predict_ms": 2.0, "encode_ms": 0.1, "answer_ms": 0.1},
    }
    columns = worker_stage_columns(stages)
    assert columns["worker_read_ms"] == 0.2 and columns["worker_check_ms"] == 0.9 and columns["worker_forward_ms"] == 9.0
    assert columns["worker_answer_ms"] == 0.4 and columns["worker_copy_ms"] == 0.0
    # everything but the 9 ms forward: 0.2 read + 0.9 check + 0.3 stage + 0.4 answer + (12 - 9) of predict
    assert columns["worker_outside_forward_ms"] == 4.8
    assert worker_stage_columns({}) == {}


def test_the_servers_cpu_per_request_is_split_into_frontend_and_workers():
    processes = {
        "frontend": {"cpu_s": 3.0},
        "seg/101": {"cpu_s": 2.0},
        "seg/102": {"cpu_s": 1.0},
        "other": {"cpu_s": 0.5},
    }
    assert cpu_ms_per_request(cpu_s_of(processes), 1000) == {
        "frontend_cpu_ms_per_request": 3.0,
        "workers_cpu_ms_per_request": 3.0,
        "server_cpu_ms_per_request": 6.5,
    }
    assert cpu_ms_per_request(cpu_s_of(processes), 1000, "_whole_run")["server_cpu_ms_per_request_whole_run"] == 6.5
    assert cpu_ms_per_request(cpu_s_of(processes), 0) == {}


def test_the_process_sampler_gives_a_groups_cpu_over_the_measured_windows_only(tmp_path):
    stop = tmp_path / "stop"  # the burner spins until this exists, then sleeps: busy, then idle, on the test's clock
    code = f"import os, time\nwhile not os.path.exists({str(stop)!r}): pass\ntime.sleep(60)"
    burner = subprocess.Popen([sys.executable, "-c", code])
    try:
        sampler = ProcessSampler({"frontend": [burner.pid]}, interval_s=0.05)
        sampler.start()
        time.sleep(1.0)
        stop.touch()
        stopped_s = time.monotonic() - sampler.started
        time.sleep(0.8)
        whole = sampler.stop()["server_processes"]["frontend"]["cpu_s"]
        busy = sampler.between([(0.2, stopped_s - 0.1)])["frontend"]
        idle = sampler.between([(stopped_s + 0.2, stopped_s + 0.75)])["frontend"]
        assert busy > 0.05 and idle <= 0.03 and whole >= busy
        both = sampler.between([(0.2, stopped_s - 0.1), (stopped_s + 0.2, stopped_s + 0.75)])["frontend"]
        assert abs(both - (busy + idle)) < 1e-9  # spans add up
        assert sampler.between([(0.0, 60.0)]) == {}  # not covered by its samples
    finally:
        burner.kill()
        burner.wait()


def test_labels_of_gives_argmaxs_bytes_for_every_class_count_ties_nan_and_inf():
    for classes in (1, 2, 3, 5, 8):
        logits = torch.randn(4, classes, 32, 48, generator=torch.Generator().manual_seed(classes))
        logits[0, :, 0, 0] = 1.0  # a tie: the first class wins, as with argmax
        nan, inf = logits.clone(), logits.clone()
        nan[1, classes - 1, 5, 5] = float("nan")  # argmax takes NaN as the largest
        inf[2, classes - 1, 7, 7], inf[2, 0, 8, 8] = float("inf"), float("-inf")
        for variant in (logits, logits.half(), logits.contiguous(memory_format=torch.channels_last), nan, inf):
            assert torch.equal(classmap.labels_of(variant), variant.argmax(1).to(torch.uint8)), classes


def test_a_raw_body_is_staged_into_a_channels_last_row_with_the_same_values():
    from handlers.segmentation import copy_into

    raw = torch.randn(RAW_SHAPE).half()
    for layout in (torch.channels_last, torch.contiguous_format):
        buffer = torch.full((2, *RAW_SHAPE), float("nan")).contiguous(memory_format=layout)
        copy_into(buffer[1], raw)
        assert torch.equal(buffer[1], raw.float()) and buffer[0].isnan().all()


def test_grpc_load_is_refused_for_a_workflow_or_a_server_that_is_not_torchserve():
    from segserve.bench.run.measure import Endpoint, _load_spec
    from segserve.bench.suite.spec import LoadSettings
    from segserve.errors import RuntimeFailure

    model = Endpoint("http://127.0.0.1:1", "/predictions/seg", "t", {}, "http://127.0.0.1:3", ("seg",), "grpc://127.0.0.1:4")
    spec = _load_spec(model, LoadSettings(), [b"x"], 2, None, "grpc")
    assert (spec.url, spec.path, spec.token) == ("grpc://127.0.0.1:4", "seg", "t")
    assert _load_spec(model, LoadSettings(), [b"x"], 2, None, None).url == "http://127.0.0.1:1"
    workflow = Endpoint("http://127.0.0.1:1", "/wfpredict/seg_jpeg", "t", {}, "http://127.0.0.1:3", ("seg_jpeg",), "grpc://127.0.0.1:4")
    other = Endpoint("http://127.0.0.1:1", "/v2/models/m/infer", None, {}, None, ())
    for endpoint in (workflow, other):
        with pytest.raises(RuntimeFailure, match="gRPC inference API serves models"):
            _load_spec(endpoint, LoadSettings(), [b"x"], 2, None, "grpc")
