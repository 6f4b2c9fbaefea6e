"""A join member's named inputs over gRPC: each parent's answer one entry of the PredictionsRequest's input map, the
row TorchServe's workflow hands the join, sent by the load generator to a small gRPC server on loopback whatever the
suite's protocol; plain bodies stay one "data" input, and HTTP points stay HTTP."""

import pickle
import threading
from concurrent import futures

import grpc
import pytest

from segserve.bench.run import grpc_load
from segserve.bench.run.dag_requests import request_of, worker_row
from segserve.bench.run.load import LoadSpec, run_load
from segserve.bench.run.measure import Endpoint, _load_spec, _protocol, _server_columns, protocol_of
from segserve.bench.suite.spec import LoadSettings

PARENTS = {"fn_first": b'{\n  "size": 64\n}', "model_a": bytes(range(256)) * 3}


@pytest.fixture
def predictions():
    """A loopback gRPC server of TorchServe's Predictions method that records each request's input map."""
    messages = grpc_load.inference_messages()
    seen, lock = [], threading.Lock()

    def predict(request, context):
        with lock:
            seen.append((request.model_name, dict(request.input)))
        return messages.PredictionResponse(prediction=b"ok")

    request, reply = messages.PredictionsRequest.FromString, messages.PredictionResponse.SerializeToString
    method = grpc.unary_unary_rpc_method_handler(predict, request_deserializer=request, response_serializer=reply)
    service, name = grpc_load.SERVICE.rsplit("/", 1)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.lstrip("/"), {name: method}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"grpc://127.0.0.1:{port}", seen
    finally:
        server.stop(None)


def test_a_joins_row_goes_as_one_grpc_input_per_parent_and_a_plain_body_as_data(predictions):
    url, seen = predictions
    join, plain = request_of(PARENTS), request_of({"model_a": PARENTS["model_a"]})
    assert join.parts == PARENTS and getattr(plain, "parts", None) is None
    # a load process gets the parts too (spawn pickles the bodies)
    assert pickle.loads(pickle.dumps(join)).parts == PARENTS
    result = run_load(LoadSpec(url=url, path="overlay", bodies=[join, plain], concurrency=1), duration_s=0.5)
    assert result.status and set(result.status) == {200}, result.status_counts()
    assert seen[0] == ("overlay", PARENTS) and seen[1] == ("overlay", {"data": PARENTS["model_a"]}), seen[:2]
    # its bytes are the same row as multipart (what a function node run here decodes): parameters without a content type
    row, headers = worker_row(join, join.content_type)
    assert row == {parent: bytearray(answer) for parent, answer in PARENTS.items()}
    assert headers == {parent: {"content-type": ""} for parent in PARENTS}


def test_named_inputs_choose_grpc_whatever_the_protocol_and_say_why_http_points_stay_http():
    endpoint = Endpoint("http://127.0.0.1:1", "/predictions/j-overlay", "t", {}, "http://127.0.0.1:3", ("j-overlay",), "grpc://127.0.0.1:4")
    join, plain = [request_of(PARENTS)], [request_of({"model_a": b"x"})]
    for params in ({}, {"protocol": "http"}, {"protocol": "grpc"}):
        spec = _load_spec(endpoint, LoadSettings(), join, 2, None, _protocol(params, join))
        assert (spec.url, spec.path) == ("grpc://127.0.0.1:4", "j-overlay"), params
    assert protocol_of(join)["protocol"] == "grpc" and "multipart" in protocol_of(join)["protocol_reason"]
    assert protocol_of(plain) == {}  # its record keeps the point's own protocol
    assert _load_spec(endpoint, LoadSettings(), plain, 2, None, _protocol({}, plain)).url == "http://127.0.0.1:1"
    # a TorchServe of ours with gRPC off cannot send them: said, with the way out
    off = Endpoint("http://127.0.0.1:1", "/predictions/j-overlay", "t", {}, "http://127.0.0.1:3", ("j-overlay",), None)
    with pytest.raises(Exception, match="enable_grpc=false"):
        _load_spec(off, LoadSettings(), join, 2, None, _protocol({}, join))


def test_over_grpc_torchserves_queue_and_inference_means_are_unknown_not_zero():
    # TorchServe 0.12 counts these for REST requests only (RestJob): a gRPC point's would read 0
    endpoint = Endpoint("http://127.0.0.1:1", "/predictions/m", "t", {}, "http://127.0.0.1:3", ("m",), "grpc://127.0.0.1:4")
    counted = {("ts_queue_latency_microseconds", "m"): 4000.0, ("ts_inference_latency_microseconds", "m"): 9000.0}
    over_http = _server_columns(endpoint, {}, counted, 2, "http://127.0.0.1:1")
    over_grpc = _server_columns(endpoint, {}, {}, 2, "grpc://127.0.0.1:4")
    assert (over_http["server_queue_ms"], over_http["server_inference_ms"]) == (2.0, 4.5)
    assert (over_grpc["server_queue_ms"], over_grpc["server_inference_ms"]) == (None, None)
