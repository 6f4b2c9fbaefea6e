"""What TorchServe 0.12's Java frontend and its Python worker do around a handler, written once for every place that
runs a handler the way TorchServe runs it (a .war's function nodes for `members: true`, the Ray engine's replicas):

- the parameters the frontend makes of an HTTP request (InferenceRequestHandler.parseRequest: a form's fields and
  files, else one `body` with the request's type) and the values the worker decodes from them
  (ts/protocol/otf_message_handler.py's _retrieve_input_data: JSON and text decoded, the rest a bytearray);
- a request as the worker hands it to ts.service.Service.predict (requestId, headers, parameters);
- the reply Service.predict encodes (create_predict_response), read back: the batch's code and message, then each
  request's content type, status, phrase, headers and body;
- a metrics cache as a worker builds it from TorchServe's own metrics.yaml.

Nothing here imports torch or ts at module level: the CLI imports it through the bench.
"""

import email.parser
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl


def frontend_parameters(body: bytes, content_type: str) -> list[tuple[str, str, bytes]]:
    """(name, content type, bytes) of each parameter TorchServe's frontend makes of an HTTP request: a
    multipart/form-data part with a file name keeps its content type, a field has none; a urlencoded form's fields
    have none; any other body is one `body` parameter with the request's MIME type (HttpUtil.getMimeType: no
    parameters such as charset)."""
    mime = content_type.split(";")[0].strip().lower()
    if mime == "multipart/form-data":
        message = email.parser.BytesParser().parsebytes(f"Content-Type: {content_type}\r\n\r\n".encode() + bytes(body))
        parts = [
            (part.get_param("name", header="content-disposition"), part.get_content_type() if part.get_filename() else "", part)
            for part in message.get_payload()
        ]
        return [(name, kind, part.get_payload(decode=True) or b"") for name, kind, part in parts]
    if mime == "application/x-www-form-urlencoded":
        return [(name, "", value.encode()) for name, value in parse_qsl(bytes(body).decode("utf-8"), keep_blank_values=True)]
    return [("body", mime, bytes(body))]


def worker_value(value: bytes, content_type: str):
    """A parameter's value as the worker hands it to a handler: JSON and text decoded, the rest a bytearray."""
    try:
        if content_type == "application/json":
            return json.loads(value.decode("utf-8"))
        if content_type.startswith("text"):
            return value.decode("utf-8")
    except ValueError:  # the worker forwards what does not decode as it came
        pass
    return bytearray(value)


def worker_row(body: bytes, content_type: str) -> tuple[dict, dict]:
    """(row, parameter headers) a TorchServe worker hands a handler for an HTTP request of this body and type."""
    params = frontend_parameters(body, content_type)
    row = {name: worker_value(value, kind) for name, kind, value in params}
    return row, {name: {"content-type": kind} for name, kind, _ in params}


def worker_request(request_id: str, headers: list[tuple[bytes, bytes]], body: bytes, content_type: str) -> dict:
    """One request of the batch Service.predict takes, as the worker reads it from the frontend's message
    (_retrieve_request): its id and header names and values as bytes, its parameters decoded."""
    return parameters_request(request_id, headers, frontend_parameters(body, content_type))


def parameters_request(request_id: str, headers: list[tuple[bytes, bytes]], parameters) -> dict:
    """worker_request of parameters the frontend already has, (name, content type, bytes) each: what a workflow's
    DagExecutor sends a node below the start (its parents' answers, each without a content type: "")."""
    return {
        "requestId": request_id.encode(),
        "headers": [{"name": bytearray(name), "value": bytearray(value)} for name, value in headers],
        "parameters": [{"name": name, "contentType": kind, "value": worker_value(value, kind)} for name, kind, value in parameters],
    }


@dataclass
class RowReply:
    """One request's answer in a worker's reply."""

    request_id: str
    content_type: str
    status: int
    phrase: str
    headers: dict[str, str]
    body: bytes


@dataclass
class PredictReply:
    """A worker's reply to a batch: `code` 200 with each row's answer, else the batch failed (`message`: TorchServe
    answers each of its requests with it, `code` its status)."""

    code: int
    message: str
    rows: list[RowReply] = field(default_factory=list)


def read_predict_reply(message: bytes) -> PredictReply:
    """create_predict_response's bytes read back: big-endian int32 lengths, each string in UTF-8, -1 ends the list."""
    at = 0

    def number() -> int:
        nonlocal at
        (value,) = struct.unpack_from("!i", message, at)
        at += 4
        return value

    def chunk() -> bytes:
        nonlocal at
        length = number()
        at += length
        return bytes(message[at - length : at])

    code, text = number(), chunk().decode()
    reply = PredictReply(code, text)
    while (length := number()) != -1:  # each request: its id's length first
        request_id = bytes(message[at : at + length]).decode()
        at += length
        content_type = chunk().decode()
        status, phrase = number(), chunk().decode()
        headers = {chunk().decode(): chunk().decode() for _ in range(number())}
        reply.rows.append(RowReply(request_id, content_type, status, phrase, headers, chunk()))
    return reply


def metrics_cache(model_name: str | None = None):
    """A metrics cache as a worker's (from TorchServe's default metrics.yaml), for handlers that record metrics."""
    import ts
    from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl

    cache = MetricsCacheYamlImpl(config_file_path=str(Path(ts.__file__).parent / "configs" / "metrics.yaml"))
    cache.initialize_cache()
    cache.model_name = model_name  # as model_service_worker.load_model sets it before the load
    return cache
