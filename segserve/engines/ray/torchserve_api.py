"""TorchServe 0.12's inference API as its Java frontend answers it, for the Ray engine's ingress: which route a path
is, the key check, the error envelopes, the headers every answer carries, and a worker's reply turned into each
request's answer. Pure functions: the ingress (app.py) and the tests call them without Ray.

Read from pytorch/serve's frontend (frontend/server/src/main/java/org/pytorch/serve/): HttpRequestHandler (which
exception is which status), NettyUtils.sendError/sendJsonResponse/sendHttpResponse (the envelope, pretty JSON and a
newline; the no-cache headers and x-request-id), TokenAuthorizationHandler and TokenAuthorization (the key check
before any route, `^Bearer\\s+(\\S+)$`, a failure is InvalidKeyException, a ModelException: 400),
InferenceRequestHandler (routes, the url_path and explain headers), ModelManager.getModel and BatchAggregator/RestJob
(per-request answers only when the batch's code is 200; else every request gets the batch's code and message as an
InternalServerException, 413 sent as 507).
"""

import json
import os
import re
import secrets
from base64 import urlsafe_b64encode
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from segserve.engines.worker_protocol import PredictReply

TOKEN_FAILED = "Token Authorization failed. Token either incorrect, expired, or not provided correctly"
NOT_FOUND = "Requested resource is not found, please refer to API document."
NOT_ALLOWED = "Requested method is not allowed, please refer to API document."
# ArchiveUtils' VALID_URL_PATTERN's schemes: a registration url the frontend would download
URL_SCHEME = re.compile(r"^(?:https?|ftp|file|s3)://", re.IGNORECASE)
BEARER = re.compile(r"^Bearer\s+(\S+)$")
# NettyUtils.sendHttpResponse: on every answer, so that no browser caches one
NO_CACHE = {
    "Pragma": "no-cache",
    "Cache-Control": "no-cache; no-store, must-revalidate, private",
    "Expires": "Thu, 01 Jan 1970 00:00:00 UTC",
}


@dataclass
class Answer:
    """One HTTP answer: status, headers (besides NO_CACHE and x-request-id, which the ingress adds), body."""

    status: int
    headers: dict[str, str]
    body: bytes
    # the worker failed the request's batch (not a status its handler set): a workflow sends the request again
    failed: bool = False


def error(status: int, kind: str, message: str) -> Answer:
    """NettyUtils.sendError: ErrorResponse as GSON's pretty JSON (two spaces, no HTML escaping) and a newline."""
    body = json.dumps({"code": status, "type": kind, "message": message}, indent=2, ensure_ascii=False) + "\n"
    return Answer(status, {"content-type": "application/json"}, body.encode())


def json_answer(value, status: int = 200) -> Answer:
    """NettyUtils.sendJsonResponse: GSON's pretty JSON and a newline."""
    return Answer(status, {"content-type": "application/json"}, (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode())


def status_json(status: str, code: int = 200) -> Answer:
    """NettyUtils.sendJsonResponse(StatusResponse): only its exposed field, `status`."""
    return Answer(code, {"content-type": "application/json"}, (json.dumps({"status": status}, indent=2) + "\n").encode())


def key_refused(authorization: str | None, key: str, expires: str | None = None) -> Answer | None:
    """TorchServe's answer when the Authorization header does not carry `key`, or carries it after `expires` (the
    key file's "expiration time"; None: never, as the token API's key); None: it does."""
    match = BEARER.match(authorization or "")
    if match and secrets.compare_digest(match.group(1), key) and (expires is None or datetime.now(UTC) < expiry(expires)):
        return None
    return error(400, "InvalidKeyException", TOKEN_FAILED)


def expiry(text: str) -> datetime:
    """A key file's "expiration time" (Instant.toString: 2026-12-05T16:22:27.013Z, 0 to 9 digits of fraction)."""
    day_time, _, fraction = text.rstrip("Z").partition(".")
    return datetime.fromisoformat(day_time).replace(tzinfo=UTC) + timedelta(seconds=float(f"0.{fraction or 0}"))


class InferenceKey:
    """The key file's inference key, read again whenever the file changed (the management API's /token renews it):
    the ingress and every model's replica check it on each request."""

    def __init__(self, key_file: str):
        self.key_file = key_file
        self.stamp, self.key, self.expires = None, "", None

    def refused(self, authorization: str | None) -> Answer | None:
        stat = os.stat(self.key_file)
        if (stat.st_mtime_ns, stat.st_ino) != self.stamp:
            with open(self.key_file) as file:
                entry = json.load(file)["inference"]
            self.stamp, self.key, self.expires = (stat.st_mtime_ns, stat.st_ino), entry["key"], entry.get("expiration time")
        return key_refused(authorization, self.key, self.expires)


@dataclass(frozen=True)
class Route:
    """What an inference path asks for: `ping`, `predictions` (model, version, url_path), `wfpredict` (model: the
    workflow), or nothing (404)."""

    kind: str
    model: str = ""
    version: str | None = None
    url_path: str = ""


def route(path: str) -> Route | None:
    """The route of a path as InferenceRequestHandler splits it (Java's split drops trailing empty segments)."""
    segments = path.split("/")
    while segments and segments[-1] == "":
        segments.pop()
    if len(segments) >= 2 and segments[1] == "ping":
        return Route("ping")
    if len(segments) >= 3 and segments[1].lower() == "wfpredict":  # WorkflowInferenceRequestHandler: any case
        return Route("wfpredict", segments[2])
    if len(segments) >= 3 and segments[1] == "predictions":
        return Route("predictions", segments[2], segments[3] if len(segments) >= 4 else None, "/".join(segments[4:]))
    return None


def model_missing(name: str, version: str | None, versions: dict[str, str]) -> Answer | None:
    """ModelManager.getModel's refusal, as HttpRequestHandler answers it (None: the model serves that version).
    `versions`: each served model's version (its manifest's modelVersion)."""
    if name not in versions:
        return error(404, "ModelNotFoundException", f"Model not found: {name}")
    if version is not None and version != versions[name]:
        return error(404, "ModelVersionNotFoundException", f"Model version: {version} does not exist for model: {name}")
    return None


def queue_full(name: str, version: str | None) -> Answer:
    """ApiUtils.addRESTInferenceJob when the model's job queue is full (Ray: max_queued_requests reached)."""
    named = f'Model "{name}' + (f'" Version {version}' if version is not None else "")
    message = (
        f'{named}" has no worker to serve inference request. Please use scale workers API to add workers. '
        "If this is a sequence inference, please check if it is closed, or expired; or exceeds maxSequenceJobQueueSize"
    )
    return error(503, "ServiceUnavailableException", message)


def request_headers(headers: list[tuple[bytes, bytes]], url_path: str) -> list[tuple[bytes, bytes]]:
    """The headers a handler sees: the request's, then the two handlePredictions adds (RequestInput keeps the last
    of a name)."""
    return [*headers, (b"url_path", url_path.encode()), (b"explain", b"False")]


def answers(reply: PredictReply, count: int) -> list[Answer]:
    """Each request's answer to a batch of `count`: its own status, content type and headers where the batch's code
    is 200 (RestJob.responseInference: the content type first, then every header the handler set), else the
    batch's code and message for all (RestJob.sendError)."""
    if reply.code != 200:
        status = 507 if reply.code == 413 else reply.code
        return [replace(error(status, "InternalServerException", reply.message), failed=True)] * count
    given = []
    for row in reply.rows:
        headers = {"content-type": row.content_type} if row.content_type else {}
        headers |= {name.lower(): value for name, value in row.headers.items()}
        given.append(Answer(row.status, headers, row.body))
    return given


def _key() -> str:
    return urlsafe_b64encode(secrets.token_bytes(6)).decode()


def _expires(expiry_min: float) -> str:
    return (datetime.now(UTC) + timedelta(minutes=expiry_min)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def new_keys(expiry_min: float = 60) -> dict:
    """A key file's content as TorchServe 0.12 writes key_file.json: a key each for management, inference and the
    token API (six random bytes, URL-safe base64), the first two with an expiration time (Instant.toString);
    `expiry_min`: config.properties' token_expiration_min (TorchServe's default 60)."""
    return {
        "management": {"key": _key(), "expiration time": _expires(expiry_min)},
        "inference": {"key": _key(), "expiration time": _expires(expiry_min)},
        "API": {"key": _key()},
    }


def renewed_keys(keys: dict, api: str, expiry_min: float = 60) -> dict:
    """The key file after TorchServe's /token?type=<api>: that API's key and expiration new, the others kept."""
    return {**keys, api: {"key": _key(), "expiration time": _expires(expiry_min)}}
