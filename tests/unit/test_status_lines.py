"""No text of a request, a handler or an exception reaches a status line or a header (issue 64): a 31-byte upstream
error `{"error": "x\\r\\nX-Injected: 1"}` became the jpeg node's reason phrase, netty refused it and the worker died,
every time. Each answer here is also put through TorchServe's own create_predict_response and netty's rules
(segserve/qa/fuzz_worker.unsafe_answer), as a worker would send it."""

import http
import json
import logging

import pytest
import ts
from ts.context import Context, RequestProcessor

from handlers.base import MAX_HEADER_CHARS, safe_header_text, status_phrase
from handlers.jpeg import JpegHandler
from segserve import fuse
from segserve.fuse import fused_handler
from segserve.qa.chaos import replaced_workers
from segserve.qa.fuzz_inputs import HEADER_TEXTS, header_text_errors
from segserve.qa.fuzz_worker import unsafe_answer
from tests.conftest import make_context, with_rows
from tests.unit.test_fuse import mar, war

UNSAFE = [text for _, text in HEADER_TEXTS] + ["x" * (MAX_HEADER_CHARS + 1), "\x7f", "é", 400, None, b"Bad Request"]


def test_a_status_has_its_fixed_phrase_and_an_unknown_one_a_fixed_fallback():
    assert [status_phrase(code) for code in (200, 400, 500, 503, 507)] == [
        "OK",
        "Bad Request",
        "Internal Server Error",
        "Service Unavailable",
        "Insufficient Storage",
    ]
    assert status_phrase(599) == status_phrase(799) == "Unknown Status"


def test_safe_header_text_is_bounded_printable_ascii_only():
    assert all(safe_header_text(text) for text in ("", "Bad Request", "application/json", "x" * MAX_HEADER_CHARS))
    assert not any(safe_header_text(text) for text in UNSAFE)


def test_the_fused_handlers_own_copies_agree_with_the_handlers():
    """fused_handler.py imports nothing of segserve, so it keeps its own two one-liners: the same answers."""
    assert all(fused_handler.status_phrase(code) == status_phrase(code) for code in range(100, 600))
    samples = ["", "Bad Request", "x" * MAX_HEADER_CHARS, *UNSAFE]
    assert [fused_handler.safe_header_text(s) for s in samples] == [safe_header_text(s) for s in samples]


@pytest.fixture(scope="module")
def jpeg():
    handler = JpegHandler()
    handler.initialize(make_context(None, {}))
    return handler


def test_an_upstream_error_is_answered_bad_request_and_its_text_only_in_the_json_body(jpeg):
    items = header_text_errors()
    context = with_rows(make_context(None, {}), len(items))
    out = jpeg.handle([{"body": bytearray(item.body)} for item in items], context)
    assert {context.get_response_status(i) for i in range(len(items))} == {(400, "Bad Request")}
    assert unsafe_answer(context, out) == []
    crlf = next(i for i, item in enumerate(items) if item.description == "upstream error with CRLF header injection")
    assert json.loads(out[crlf]) == {"error": "x\r\nX-Injected: 1"}  # the message, escaped by json.dumps
    assert b"\r" not in out[crlf] and all(body.isascii() for body in out)


# A user's node in a fused workflow that sets whatever a handler can set: the fused worker must send none of it raw.
EVIL = """
def handle(data, context):
    if data is None:
        return None
    out = []
    for i, row in enumerate(data):
        body = bytes(row["body"])
        if body == b"phrase":
            context.set_response_status(400, "refused\\r\\nX-Injected: 1", i)
        elif body == b"content type":
            context.set_response_status(415, "Unsupported Media Type", i)
            context.set_response_content_type(i, "text/plain\\r\\nX-Injected: 1")
        elif body == b"content type object":
            context.set_response_status(415, "Unsupported Media Type", i)
            context.set_response_content_type(i, 42)
        elif body == b"header":
            context.set_response_header(i, "x-count", 3)
            context.set_response_header(i, "x-text", "\\ud800")
        elif body == b"status":
            context.set_response_status("400", "Bad Request", i)
        elif body == b"raise":
            raise ValueError("cannot read /home/user/.aws/credentials: token=abc")
        out.append(body)
    return out
"""
ROWS = [b"phrase", b"content type", b"content type object", b"header", b"status", b"raise", b"fine"]


def fused_evil(tmp_path, row_errors: str) -> Context:
    mar(tmp_path, "evil", EVIL)
    spec = "models:\n  retry-attempts: 1\n  evil: {url: evil.mar}\ndag:\n  evil: []\n"
    fuse.write_contents(fuse.read_workflow(war(tmp_path, spec), tmp_path), tmp_path / "fused", row_errors)
    context = Context("fused_flow", str(tmp_path / "fused"), None, 8, None, ts.__version__)
    fused_handler.handle(None, context)
    return context


def answers(context: Context, bodies: list[bytes]) -> list:
    context.request_ids = {i: f"request-{i}" for i in range(len(bodies))}
    context.request_processor = [RequestProcessor({}) for _ in bodies]
    out = fused_handler.handle([{"body": bytearray(b)} for b in bodies], context)
    assert unsafe_answer(context, out) == []  # the fused worker's own answer: nothing TorchServe or netty refuses
    return [(*context.get_response_status(i), context.get_response_content_type(i), out[i]) for i in range(len(bodies))]


def test_with_row_errors_node_a_nodes_phrase_and_content_type_are_made_safe_and_its_exception_stays_in_the_log(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    got = dict(zip(ROWS, answers(fused_evil(tmp_path, "node"), ROWS), strict=True))
    assert got[b"phrase"] == (400, "Bad Request", None, b"phrase")
    assert got[b"content type"] == (415, "Unsupported Media Type", "application/octet-stream", b"content type")
    assert got[b"content type object"] == (415, "Unsupported Media Type", "application/octet-stream", b"content type object")
    assert got[b"header"] == (200, "OK", "application/json", b"header")  # a node's headers stay inside the fused worker
    assert got[b"fine"] == (200, "OK", "application/json", b"fine")
    # a status no worker could send fails the row as a worker of its own fails its batch: its batch-mates are served
    status, phrase, content_type, body = got[b"status"]
    assert (status, phrase, content_type) == (503, "Service Unavailable", "application/json")
    assert json.loads(body)["error"] == "node evil set a status that is not an HTTP status (an int of 100 to 599) for a row"
    # an exception: the client gets an opaque id, the worker's log what broke under that id
    status, phrase, content_type, body = got[b"raise"]
    assert (status, phrase, content_type) == (503, "Service Unavailable", "application/json")
    assert json.loads(body) == {"error": "node evil failed (request id request-5)", "request_id": "request-5"}
    logged = [r.getMessage() for r in caplog.records]
    assert any("request-5" in line and "/home/user/.aws/credentials" in line for line in logged)
    assert any("node evil set a content type that cannot be sent" in line and "application/octet-stream" in line for line in logged)


def test_with_row_errors_workflow_every_status_line_is_the_fixed_phrase_of_its_status(tmp_path):
    got = answers(fused_evil(tmp_path, "workflow"), ROWS)
    assert all(phrase == http.HTTPStatus(status).phrase for status, phrase, _, _ in got)
    assert [status for status, *_ in got] == [200, 200, 200, 200, 500, 500, 200]  # "Error executing evil" for two


def test_a_worker_replaced_or_not_ready_during_hostile_inputs_is_named():
    before = {"jpeg": [(7, "READY")], "seg": [(8, "READY"), (9, "READY")]}
    assert replaced_workers(before, before) == []
    died = {"jpeg": [(7, "UNLOADING")], "seg": [(8, "READY"), (9, "READY")]}  # at once: the old pid, not READY
    assert replaced_workers(before, died) == ["jpeg: workers (pid, status) [(7, 'READY')] → [(7, 'UNLOADING')]"]
    back = {"jpeg": [(7, "READY")], "seg": [(8, "READY"), (10, "READY")]}  # seconds later: a new pid
    assert replaced_workers(before, back) == ["seg: workers (pid, status) [(8, 'READY'), (9, 'READY')] → [(8, 'READY'), (10, 'READY')]"]
