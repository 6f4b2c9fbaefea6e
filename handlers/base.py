"""The one `handle()` of segserve: per-row decode, batched predict, per-row encode.

Subclasses write hooks only:
    load(model_dir, settings)  once per worker
    decode(body) -> item       one request; raise BadRequest for bad input
    predict(items) -> results  the valid rows of a (micro-)batch, together
    encode(result) -> bytes    one response body
and, for the fused pipeline, optionally infer() (results kept in memory for
the next node) and accept() (take the previous node's in-memory result).

handle() runs the hooks through a StageRunner (handlers/batching.py), which
may split the batch into overlapped micro-batches. A bad row gets its own
400 with a JSON `{"error": ...}` body, a row that breaks a hook any other way
its own 500 ("internal error" and a request id; the detail only in the log); its batch-mates are served.
`len(output) == len(data)` always. A status line carries its status's fixed phrase only (status_phrase).
"""

import http
import json
import logging
import os
import time
import uuid
from dataclasses import dataclass, fields

import torch

from handlers import batching, frontend_reader, profiling, testing_seam
from handlers.batching import RowFailure, StageRunner
from handlers.pinning import SharedCores, claim_cores
from handlers.settings import parse_settings

logger = logging.getLogger(__name__)
BATCH_SIZE_HEADER = "x-segserve-batch-size"
MAX_HEADER_CHARS = 256  # the longest status phrase or header value a handler may set (ours are under 40)


@dataclass
class RunnerSettings:
    """Settings every handler takes (model-config.yaml `handler:`), besides its own."""

    threads: int = 0  # torch intra-op threads on the CPU; 0: torch's default (all cores)
    micro_batch_size: int = 0  # 0: the TorchServe batch is one micro-batch
    decode_threads: int = 1
    encode_threads: int = 1
    overlap: bool = False  # run decode / predict / encode of successive micro-batches in parallel threads
    device: str = "auto"  # "auto": the worker's GPU when it has one; "cpu": always the CPU (e.g. JPEG beside a GPU model)


RUNNER_KEYS = tuple(f.name for f in fields(RunnerSettings))


class BadRequest(ValueError):
    """The request's own fault: answered with 400 and the message, the batch goes on."""


def request_body(row: dict) -> bytes | bytearray:
    """The payload of one request row as bytes (multipart field `data`, or the raw `body`)."""
    body = row.get("data")
    if body is None:
        body = row.get("body")
    if isinstance(body, (bytes, bytearray)):
        return body  # TorchServe's bytearray as is: decoders view it (bytes(body) would copy every request)
    if body is None:
        raise BadRequest("empty request: send the payload as the request body or as form field 'data'")
    raise BadRequest(
        f"expected binary payload, got {type(body).__name__} (send it with Content-Type: application/octet-stream, not JSON or text)"
    )


def status_phrase(status: int) -> str:
    """The fixed reason phrase of a status ("Bad Request" for 400): what a status line carries, never text of a
    request, a handler or an exception. TorchServe's frontend (netty) refuses a phrase holding CR or LF, and its
    worker encodes the phrase after the handler's try block (create_predict_response): either way the worker died
    (a 31-byte upstream error `{"error": "x\\r\\n..."}` killed the JPEG worker). The message goes in the JSON body."""
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Unknown Status"


def safe_header_text(value) -> bool:
    """Whether a status phrase or header value passes TorchServe and netty unharmed: a str of printable ASCII
    (no CR, LF, NUL or other control character; nothing UTF-8 could fail on), at most MAX_HEADER_CHARS long."""
    return isinstance(value, str) and len(value) <= MAX_HEADER_CHARS and value.isascii() and value.isprintable()


def internal_error(context, idx: int, failure: RowFailure) -> bytes:
    """A 500's body: "internal error" and the request's id, nothing of the exception (a client learns no paths,
    versions or values from it); the detail goes to the worker's log under that id."""
    request_id = context.get_request_id(idx) or uuid.uuid4().hex  # TorchServe's id of the request, logged by it too
    logger.error("request %s answered 500: %s", request_id, failure)
    context.set_response_status(500, status_phrase(500), idx)
    return json.dumps({"error": f"internal error (request id {request_id})", "request_id": request_id}).encode()


def pick_device(context) -> torch.device:
    gpu_id = context.system_properties.get("gpu_id")
    if torch.cuda.is_available() and gpu_id is not None:
        return torch.device(f"cuda:{gpu_id}")
    return torch.device("cpu")


class SegserveHandler:
    """Base of every segserve handler; TorchServe instantiates a subclass per worker."""

    content_type = "application/octet-stream"

    def __init__(self):
        self.initialized = False
        self.device = torch.device("cpu")
        self.shared_cores = None
        self.profile_request = None

    def initialize(self, context) -> None:
        frontend_reader.install()  # the next requests' bytes read into one buffer each (frontend_reader.py)
        settings = dict((context.model_yaml_config or {}).get("handler") or {})
        common = parse_settings(RunnerSettings, {k: settings.pop(k) for k in RUNNER_KEYS if k in settings})
        if common.device not in ("auto", "cpu"):
            raise ValueError(f"handler.device must be 'auto' or 'cpu' (got {common.device!r})")
        self.device = pick_device(context) if common.device == "auto" else torch.device("cpu")
        # Threads: an explicit `threads` or SEGSERVE_THREADS, else a core plan's slot, else OMP_NUM_THREADS
        # (torch reads it), else the worker's cores shared evenly among its model's live workers.
        model_name = getattr(context, "model_name", "") or ""  # "" for the fused pipeline's inner nodes
        self.profile_request = profiling.request_file(model_name)
        self.cores = claim_cores(model_name)
        threads = common.threads or int(os.environ.get("SEGSERVE_THREADS", 0) or 0)
        if threads > 0 and self.device.type == "cpu":
            torch.set_num_threads(threads)
        elif self.cores is None and model_name and self.device.type == "cpu" and not os.environ.get("OMP_NUM_THREADS"):
            self.shared_cores = SharedCores(model_name)
        self.slowdown_fraction = testing_seam.slowdown_fraction()
        # the most rows the network runs at once: a compiled network is compiled for batch sizes up to it
        self.max_rows = common.micro_batch_size or int(context.system_properties.get("batch_size") or 1)
        self.load(context.system_properties["model_dir"], settings, context.manifest)
        overlap = common.overlap
        if overlap and self.device.type == "cuda" and not batching.OVERLAP_CHECKED_ON_CUDA and not testing_seam.cuda_overlap():
            logger.warning(
                "overlap is off on %s: overlapped micro-batches have not yet given the same bytes on a GPU (issue #48)", self.device
            )
            overlap = False
        self.stages = StageRunner(
            self.decode,
            self.predict,
            self.encode,
            BadRequest,
            micro_batch_size=common.micro_batch_size,
            decode_threads=common.decode_threads,
            encode_threads=common.encode_threads,
            overlap=overlap,
            prepare=self.prepare,
            encode_many=self.encode_many if type(self).encode_many is not SegserveHandler.encode_many else None,
        )
        self.initialized = True
        logger.info(
            "%s ready on %s, cores %s, %d threads (%s)", type(self).__name__, self.device, self.cores, torch.get_num_threads(), common
        )

    def handle(self, data: list, context) -> list:
        # `segserve profile` asked for this batch under torch.profiler: one stat per batch, the path made at load
        trace = profiling.claim(self.profile_request) if self.profile_request else None
        if trace is not None:
            return profiling.traced(lambda: self.handle_batch(data, context), trace)
        return self.handle_batch(data, context)

    def handle_batch(self, data: list, context) -> list:
        started = time.perf_counter()
        if self.shared_cores is not None:
            self.shared_cores.refresh()  # workers of this model may have come or gone
        output: list = [None] * len(data)
        bodies: list = []
        for idx, row in enumerate(data):
            # Which batch a request rode in: lets clients and tests see batching at work.
            context.set_response_header(idx, BATCH_SIZE_HEADER, str(len(data)))
            try:
                bodies.append(request_body(row))
            except BadRequest as error:
                bodies.append(error)
        self.stages.times.add("read_ms", (time.perf_counter() - started) * 1000)
        results = self.stages.run(bodies)
        answering = time.perf_counter()
        for idx, result in enumerate(results):
            if isinstance(result, BadRequest):
                output[idx] = json.dumps({"error": str(result)}).encode()
                context.set_response_status(400, status_phrase(400), idx)  # the message: in the body only
                context.set_response_content_type(idx, "application/json")
            elif isinstance(result, RowFailure):
                output[idx] = internal_error(context, idx, result)
                context.set_response_content_type(idx, "application/json")
            else:
                output[idx] = result
                context.set_response_content_type(idx, self.content_type)
        self.stages.times.add("answer_ms", (time.perf_counter() - answering) * 1000)
        self.report_metrics(context, sum(len(o) for o in output), len(data))
        if self.slowdown_fraction:
            testing_seam.spin(self.slowdown_fraction * (time.perf_counter() - started))
        return output

    def report_metrics(self, context, response_bytes: int, requests: int) -> None:
        """Cumulative per-stage times and bytes as TorchServe custom counters (Prometheus: Segserve*)."""
        metrics = getattr(context, "metrics", None)
        if metrics is None:
            return
        values = {**self.stages.times.drain(), "response_bytes": response_bytes, "requests": requests}
        for name, value in values.items():
            metrics.add_counter("Segserve" + "".join(part.title() for part in name.split("_")), value)

    def accept(self, upstream):
        """Take an upstream node's in-process result as this node's item (fused pipeline), or
        NotImplemented: then the pipeline passes the upstream's encoded bytes through decode()."""
        return NotImplemented

    def prepare(self, items: list, position: int):
        """What predict() takes for a micro-batch's valid rows; runs in the decode stage (position: the micro-batch's
        place in the TorchServe batch). By default the rows themselves; the segmentation node writes its staging buffer."""
        return items

    def encode_many(self, results: list) -> list:
        """Optional: the bodies of several rows' results in one call (a subclass that defines it gets it called
        with each micro-batch's valid results; a row it cannot encode is then encoded alone by encode())."""
        return [self.encode(result) for result in results]

    def infer(self, items: list):
        """(batch, per-row results) for an in-process successor; by default the results of predict()."""
        results = self.predict(items)
        return None, results

    # Hooks -----------------------------------------------------------------
    def load(self, model_dir: str, settings: dict, manifest: dict) -> None:
        raise NotImplementedError

    def decode(self, body: bytes):
        raise NotImplementedError

    def predict(self, items: list) -> list:
        raise NotImplementedError

    def encode(self, result) -> bytes:
        raise NotImplementedError


def entry_point(handler_class):
    """A TorchServe function entry point (`module:handle`) for a handler class.

    TorchServe accepts a class entry only when the module defines exactly one
    class; a function entry lets handler modules keep their settings and
    record types beside the handler. TorchServe first calls it with
    data=None to initialise.
    """
    service = handler_class()

    def handle(data, context):
        if data is None:
            service.initialize(context)
            return None
        return service.handle(data, context)

    handle.service = service
    return handle
