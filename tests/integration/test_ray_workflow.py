"""A user's .war on the Ray engine against a real TorchServe 0.12: the dog-breed shape of tests/system/workflow_shapes.py
(a function node first, a join with per-batch state, rows refused in the middle and at the leaf), built with the real
archivers, registered on both through TorchServe's management API (POST /workflows?url=), each input sent to both
/wfpredict/dogbreed at once so that rows batch; the same status, content type and bytes asked of Ray's answers, and
the same describe; the fused .mar (segserve fuse) beside it as one deployment, the same bytes; then 16 connections
on Ray for a few seconds with every request answered, its own bytes, none past 30 s; DELETE /workflows, and nothing
left running after stop.

One exception, documented in docs/ray.md: Ray's HTTP server hands the handler the request's header names in lower
case, so the join's get_request_header(i, "Content-Length") finds nothing on Ray (`"request_length": null`).

Marked long: the TorchServe, the Ray engine and five node workers start in about a minute on 2 cores; the
composition's parts are tests/unit/test_ray_workflow.py."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from segserve.cli import main
from segserve.engines.ray.engine import RayServe
from segserve.serving.http import Connection, request
from segserve.serving.server import TorchServe
from tests.system import workflow_shapes as shapes
from tests.system.test_foreign_archives import workflow_archive
from tests.system.test_fuse import model_archive

ROOT = Path(__file__).resolve().parents[2]
BODIES = [b" dog-rex ", b"cat-tom", b"dog-mutt", b"refuse", b"dog-fido", b"cat-felix", b"dog-mutt-2", b"dog-ace"]

pytestmark = pytest.mark.long


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("dogbreed_store")
    for name, handler in (("animal", shapes.ANIMAL), ("breed", shapes.BREED)):
        model_archive(folder, name, {f"{name}.py": handler}, f"{name}.py")
    workflow_archive(folder, "dogbreed", shapes.DOGBREED_SPEC, shapes.DOGBREED_FUNCTIONS)
    assert main(["fuse", str(folder / "dogbreed.war"), "--model-store", str(folder)]) == 0  # fused_dogbreed.mar
    return folder


def answers(server, bodies: list[bytes], path: str = "/wfpredict/dogbreed") -> list[tuple[int, str, bytes]]:
    """Every body to `path` at once."""
    token, url = server.token("inference"), server.url("inference")

    def post(body: bytes):
        reply = request(url, "POST", path, token, body, timeout_s=60)
        return reply.status, reply.content_type, reply.body

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(post, bodies))


def header_names_lowered(body: bytes) -> bytes:
    """TorchServe's answer as the join reads the request's headers on Ray (their names in lower case)."""
    start = body.find(b'"request_length": "')
    if start < 0:
        return body
    end = body.index(b'"', start + len(b'"request_length": "'))
    return body[:start] + b'"request_length": null' + body[end + 1 :]


def alive(pids: list[int], wait_s: float = 5) -> list[int]:
    """Those of `pids` still running after up to wait_s: a process killed at stop is a zombie until its new parent
    (init) reaps it, a moment later, and a zombie runs nothing (seen once: a pid of the engine still "existing")."""
    deadline = time.monotonic() + wait_s
    while True:
        running = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    running.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not running or time.monotonic() >= deadline:
            return running
        time.sleep(0.2)


def test_a_war_on_ray_answers_as_torchserves_wfpredict_and_loses_nothing_under_16_connections(store, tmp_path):
    began = time.monotonic()
    with TorchServe(tmp_path / "ts", store, ROOT / "config.properties", free_ports=True) as torchserve:
        torchserve.register_workflow("dogbreed.war", "dogbreed", log=lambda *_: None)
        expected = answers(torchserve, BODIES)
        described = torchserve.call("management", "GET", "/workflows/dogbreed").json()
        listed = torchserve.call("management", "GET", "/workflows").json()
        nodes = torchserve.models()
    ray = RayServe(tmp_path / "ray", model_store=store)
    ray.start(log=lambda *_: None)
    try:
        ray.register_workflow("dogbreed.war", "dogbreed", log=lambda *_: None)  # POST /workflows?url=dogbreed.war&workflow_name=
        assert ray.models() == nodes == ["dogbreed__animal", "dogbreed__breed"]  # a function node is not listed
        assert ray.call("management", "GET", "/workflows/dogbreed").json() == described
        assert ray.call("management", "GET", "/workflows").json() == listed
        got = answers(ray, BODIES)
        assert got == [(status, kind, header_names_lowered(body)) for status, kind, body in expected]
        assert {status for status, _, _ in got} == {200} and got[3][2] == b'It\'s not a dog: {\n  "error": "not an animal"\n}'
        own = {body: answer for body, answer in zip(BODIES, got, strict=True)}
        # the fused .mar beside it, one deployment: the same answers
        fused = ray.call("management", "POST", "/models?url=fused_dogbreed.mar&batch_size=4&max_batch_delay=200")
        assert fused.status == 200, fused.text()
        assert answers(ray, BODIES, "/predictions/fused_dogbreed") == got

        replies, stop = [], threading.Event()

        def load(seat: int) -> None:
            connection = Connection(ray.url("inference"), ray.token("inference"), timeout_s=30)
            sent = 0
            while not stop.is_set():
                body = BODIES[(seat + sent) % len(BODIES)]
                sent_at = time.monotonic()
                try:
                    reply = connection.request("POST", "/wfpredict/dogbreed", body)
                    replies.append((body, (reply.status, reply.content_type, reply.body), time.monotonic() - sent_at))
                except OSError as failed:  # no answer within 30 s, or the connection dropped: a lost answer
                    replies.append((body, ("lost", str(failed), b""), time.monotonic() - sent_at))
                sent += 1
            connection.close()

        senders = [threading.Thread(target=load, args=(seat,)) for seat in range(16)]
        load_began = time.monotonic()
        for sender in senders:
            sender.start()
        time.sleep(4)
        stop.set()
        for sender in senders:
            sender.join()
        load_s = time.monotonic() - load_began
        wrong = [(body, answer) for body, answer, _ in replies if answer != own[body]]
        assert replies and not wrong, wrong[:3]
        print(f"16 connections on Ray: {len(replies)} answers in {load_s:.1f} s, slowest {max(s for _, _, s in replies):.2f} s")

        deleted = ray.call("management", "DELETE", "/workflows/dogbreed")
        assert (deleted.status, deleted.json()) == (200, {"status": 'Workflow "dogbreed" unregistered'})
        assert ray.models() == ["fused_dogbreed"]
        gone = request(ray.url("inference"), "POST", "/wfpredict/dogbreed", ray.token("inference"), b"dog")
        assert (gone.status, gone.json()) == (
            404,
            {"code": 404, "type": "WorkflowNotFoundException", "message": "Workflow not found: dogbreed"},
        )
        running = ray.process_ids()
    finally:
        ray.stop()
    assert ray.process_ids() == [] and alive(running) == []
    print(f"whole test: {time.monotonic() - began:.1f} s")
