"""The Ray engine's pure parts (segserve/engines/ray/torchserve_api.py, worker_protocol.py) and a replica's batch run
through TorchServe's own Service in process: no Ray started (tests/integration/test_ray_engine.py starts it)."""

import json
import shutil
from pathlib import Path

from ts.protocol.otf_message_handler import create_predict_response
from ts.service import Service

from segserve.engines.ray import torchserve_api as api
from segserve.engines.worker_protocol import read_predict_reply, worker_request
from tests.conftest import make_context

ECHO = Path(__file__).resolve().parents[1] / "integration" / "data" / "ray_echo" / "echo_handler.py"


def test_routes_are_split_as_torchserves_frontend_splits_them():
    assert api.route("/ping") == api.Route("ping")
    assert api.route("/predictions/seg") == api.Route("predictions", "seg", None, "")
    assert api.route("/predictions/seg/2.0/") == api.Route("predictions", "seg", "2.0", "")  # trailing "/" dropped
    assert api.route("/predictions/seg/2.0/a/b") == api.Route("predictions", "seg", "2.0", "a/b")  # url_path
    assert api.route("/predictions") is None and api.route("/models") is None and api.route("/") is None


def test_the_key_check_answers_torchserves_400_envelope_unless_the_bearer_key_matches():
    assert api.key_refused("Bearer k3y", "k3y") is None and api.key_refused("Bearer   k3y", "k3y") is None
    for header in (None, "", "Bearer", "k3y", "Bearer k3y x", "Bearer other", "bearer k3y"):
        refused = api.key_refused(header, "k3y")
        assert refused.status == 400 and refused.headers == {"content-type": "application/json"}
        assert refused.body == (
            b'{\n  "code": 400,\n  "type": "InvalidKeyException",\n'
            b'  "message": "Token Authorization failed. Token either incorrect, expired, or not provided correctly"\n}\n'
        )


def test_unknown_models_and_versions_are_torchserves_404s():
    versions = {"echo": "1.0"}
    assert api.model_missing("echo", None, versions) is None and api.model_missing("echo", "1.0", versions) is None
    assert json.loads(api.model_missing("x", None, versions).body) == {
        "code": 404,
        "type": "ModelNotFoundException",
        "message": "Model not found: x",
    }
    missing = json.loads(api.model_missing("echo", "2.0", versions).body)
    assert missing == {"code": 404, "type": "ModelVersionNotFoundException", "message": "Model version: 2.0 does not exist for model: echo"}
    full = json.loads(api.queue_full("echo", None).body)
    assert full["code"] == 503 and full["message"].startswith('Model "echo" has no worker to serve inference request.')


def test_a_worker_reply_is_read_back_row_by_row_and_a_failed_batch_answers_every_request(tmp_path):
    context = make_context(tmp_path, {}, rows=2)
    context.set_response_status(418, "teapot", 1)
    context.set_response_header(1, "X-Marker", "yes")
    context.set_response_content_type(0, "application/json")
    message = create_predict_response(["text", b"\x00\xff"], {0: "id-a", 1: "id-b"}, "Prediction success", 200, context)
    reply = read_predict_reply(bytes(message))
    assert (reply.code, reply.message, [r.request_id for r in reply.rows]) == (200, "Prediction success", ["id-a", "id-b"])
    first, second = api.answers(reply, 2)
    assert (first.status, first.headers, first.body) == (200, {"content-type": "application/json"}, b"text")
    assert (second.status, second.headers, second.body) == (418, {"x-marker": "yes"}, b"\x00\xff")
    failed = api.answers(read_predict_reply(bytes(create_predict_response(None, {0: "a", 1: "b"}, "Prediction failed", 503))), 2)
    assert [a.status for a in failed] == [503, 503]
    assert json.loads(failed[0].body) == {"code": 503, "type": "InternalServerException", "message": "Prediction failed"}
    too_large = api.answers(read_predict_reply(bytes(create_predict_response(None, {0: "a"}, "too large", 413))), 1)
    assert too_large[0].status == 507  # RestJob.sendError sends 413 as 507


def test_a_request_reaches_the_handler_as_the_worker_hands_it_over():
    sent = worker_request("rid", [(b"X-Echo", b"v")], b'{"k": 1}', "application/json; charset=utf-8")
    headers, rows, ids = Service.retrieve_data_for_inference([sent])
    assert rows == [{"body": {"k": 1}}] and ids == {0: "rid"}
    assert headers[0].get_request_property("X-Echo") == "v" and headers[0].get_request_property("body") == {
        "content-type": "application/json"
    }


def test_a_replica_batch_runs_the_handler_through_torchserves_service(tmp_path, monkeypatch):
    from segserve.engines.ray.replica import ModelSpec, Request, load_service, predict

    folder = tmp_path / "echo"
    (folder / "MAR-INF").mkdir(parents=True)
    shutil.copy(ECHO, folder)
    (folder / "MAR-INF" / "MANIFEST.json").write_text(json.dumps({"model": {"modelName": "echo", "handler": "echo_handler.py"}}))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", list(__import__("sys").path))  # load_service puts the model folder first
    service = load_service(ModelSpec("echo", str(tmp_path / "echo.mar"), batch_size=4), folder, None)
    assert Path.cwd() == folder
    requests = [Request(f"r{i}", [(b"x-show", b"url_path")], body, "application/octet-stream") for i, body in enumerate([b"a", b"teapot"])]
    ok, teapot = predict(service, requests)
    answer = json.loads(ok.body)
    assert ok.status == 200 and ok.headers == {"content-type": "application/json"}
    assert answer["properties"] == {
        "batch_size": 4,
        "gpu_id": None,
        "limit_max_image_pixels": True,
        "server_name": "MMS",
        "server_version": "0.12.0",
    }
    assert answer["from_model_dir"] and answer["request_id_set"] and answer["row"] == {"body": ["bytearray", "61"]}
    assert teapot.status == 418 and teapot.headers["x-marker"] == "teapot"
    failed = predict(service, [requests[0], Request("r9", [], b"fail", "application/octet-stream")])
    assert [a.status for a in failed] == [503, 503] and json.loads(failed[0].body)["message"] == "Prediction failed"


def test_the_key_file_has_torchserves_shape():
    keys = api.new_keys(60)
    assert set(keys) == {"management", "inference", "API"} and len(keys["inference"]["key"]) == 8  # 6 bytes, base64
    assert keys["inference"]["expiration time"].endswith("Z") and "expiration time" not in keys["API"]


def test_the_thread_count_ray_forces_on_a_replica_is_undone_and_a_users_own_is_kept(tmp_path):
    """Ray sets OMP_NUM_THREADS=1 in an actor that reserves no CPU when its environment has none: a replica then ran
    torch on one thread where TorchServe's worker runs every core, and the image_segmenter's floats differed
    (tests/system/test_ray_same_bytes.py, which checks the threads' effect end to end). The environment the process
    started with tells Ray's from the user's."""
    from segserve.engines.ray.replica import threads_as_a_workers

    started = tmp_path / "environ"
    started.write_bytes(b"PATH=/usr/bin\0HOME=/root\0")
    environ = {"PATH": "/usr/bin", "OMP_NUM_THREADS": "1"}  # Ray's, set after the process started
    threads_as_a_workers(environ, started)
    assert environ == {"PATH": "/usr/bin"}
    started.write_bytes(b"PATH=/usr/bin\0OMP_NUM_THREADS=3\0")
    environ = {"PATH": "/usr/bin", "OMP_NUM_THREADS": "3"}  # the user's (the engine's environment, or runtime_env's)
    threads_as_a_workers(environ, started)
    assert environ == {"PATH": "/usr/bin", "OMP_NUM_THREADS": "3"}
    threads_as_a_workers(environ, tmp_path / "no_proc")  # no /proc: nothing to tell them apart by
    assert environ["OMP_NUM_THREADS"] == "3"
