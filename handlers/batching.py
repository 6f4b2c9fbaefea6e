"""Batching machinery shared by the handlers: reused staging buffers, CUDA streams, overlapped micro-batches.

- StagingPool: one buffer per (name, shape, dtype), allocated on first use and reused for every later
  batch; pinned (page-locked) when CUDA is available so host→device copies can be asynchronous.
- Streams: a host→device copy stream, the compute stream and a device→host copy stream, ordered with
  CUDA events (never a device-wide synchronize). On the CPU every method is a no-op pass-through.
- StageRunner: splits a TorchServe batch into micro-batches and runs decode → predict → encode so that
  decoding of micro-batch k+1 and encoding of k-1 happen while k is in the model. Results come back in
  request order; a row whose decode raised BadRequest gets that error and its micro-batch goes on, and a row
  that raised anything else (a bug, a codec surprise) gets a RowFailure (500) of its own.
"""

import logging
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

logger = logging.getLogger(__name__)

# Overlapped micro-batches on a CUDA worker: off (with a warning) until a device run has shown the same bytes as one
# micro-batch at a time (the GPU test test_fused_pipeline_overlapped_equals_sequential[cuda]). The first device
# run, 2026-12 on an H200, gave other bytes: torchvision's nvJPEG encoder read images still being written
# (handlers/jpeg.py encode_jpegs).
OVERLAP_CHECKED_ON_CUDA = False


def view_bytes(body: bytes | bytearray, dtype: torch.dtype = torch.uint8, offset: int = 0) -> torch.Tensor:
    """A tensor over a request body without copying it. TorchServe hands bodies over as bytearrays
    (writable, so torch can view them); immutable bytes, from tests or other callers, are copied once."""
    buffer = body if isinstance(body, bytearray) else bytearray(body)
    return torch.frombuffer(buffer, dtype=dtype, offset=offset)


class StagingPool:
    """Reusable tensors keyed by (name, shape, dtype): the same storage for every batch of that shape."""

    def __init__(self, device: torch.device, pin: bool | None = None):
        self.device = device
        self.pin = device.type == "cuda" if pin is None else pin  # a CPU worker on a GPU machine needs no pinned memory
        self.buffers: dict[tuple, torch.Tensor] = {}
        self.allocations = 0  # how many buffers were ever made: steady state means this stops growing

    def get(
        self, name: str, shape: tuple[int, ...], dtype: torch.dtype, on_device: bool = False, memory_format=torch.contiguous_format
    ) -> torch.Tensor:
        """The buffer for this key, made on first use; in the model's memory format, so no per-batch conversion."""
        key = (name, tuple(shape), dtype, on_device, memory_format)
        buffer = self.buffers.get(key)
        if buffer is None:
            if on_device:
                buffer = torch.empty(shape, dtype=dtype, device=self.device, memory_format=memory_format)
            else:
                buffer = torch.empty(shape, dtype=dtype, pin_memory=self.pin, memory_format=memory_format)
            self.buffers[key] = buffer
            self.allocations += 1
        return buffer


class Streams:
    """Copy in, compute and copy out on three CUDA streams; plain synchronous code on the CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.h2d, self.compute, self.d2h = (torch.cuda.Stream(device) for _ in range(3))

    def to_device(self, host: torch.Tensor, device_buffer: torch.Tensor) -> torch.Tensor:
        """Copy a pinned host batch into a device buffer on the copy stream; the compute stream waits for it."""
        if not self.cuda:
            return host
        with torch.cuda.stream(self.h2d):
            device_buffer.copy_(host, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(self.h2d)
        self.compute.wait_event(copied)
        return device_buffer

    def compute_context(self):
        return torch.cuda.stream(self.compute) if self.cuda else _NullContext()

    def done_event(self):
        """An event on the compute stream after the work queued so far (None on the CPU): a consumer on another
        stream waits for it, not for the whole stream or device."""
        if not self.cuda:
            return None
        event = torch.cuda.Event()
        event.record(self.compute)
        return event

    def to_host(self, device_tensor: torch.Tensor, host_buffer: torch.Tensor) -> torch.Tensor:
        """Copy a device result into a pinned host buffer on the d2h stream and wait for that copy only."""
        if not self.cuda:
            return device_tensor  # already in host memory: no copy
        computed = torch.cuda.Event()
        computed.record(self.compute)
        self.d2h.wait_event(computed)
        with torch.cuda.stream(self.d2h):
            device_tensor.record_stream(self.d2h)  # the compute stream's allocator must not reuse it before the copy
            host_buffer.copy_(device_tensor, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(self.d2h)
        copied.synchronize()
        return host_buffer


class _NullContext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@dataclass
class StageTimes:
    """Cumulative per-stage wall time and bytes moved, read (and reset) by the handler's metrics."""

    decode_ms: float = 0.0  # each row's decode hook: read its header, check it, decode it
    predict_ms: float = 0.0  # the model's stage: copies to and from the device and the forward pass (forward_ms)
    encode_ms: float = 0.0
    # read_ms (rows from TorchServe's batch), stage_ms (the prepare hook), answer_ms (statuses and content types),
    # forward_ms and copy_ms (the segmentation node), bytes moved
    extra: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, name: str, value: float) -> None:
        with self.lock:
            if hasattr(self, name) and name != "extra":
                setattr(self, name, getattr(self, name) + value)
            else:
                self.extra[name] = self.extra.get(name, 0.0) + value

    def drain(self) -> dict[str, float]:
        with self.lock:
            values = {"decode_ms": self.decode_ms, "predict_ms": self.predict_ms, "encode_ms": self.encode_ms, **self.extra}
            self.decode_ms = self.predict_ms = self.encode_ms = 0.0
            self.extra = {}
        return values


class RowFailure(Exception):
    """An unexpected error while serving one row: that row is answered 500, its batch-mates are served."""

    @classmethod
    def of(cls, stage: str, error: Exception) -> "RowFailure":
        logger.exception("%s a request failed; its batch-mates are served", stage, exc_info=error)
        return cls(f"internal error while {stage} this request: {type(error).__name__}: {error}")


class StageRunner:
    """decode → predict → encode over micro-batches, overlapped in threads (or sequential when overlap=False)."""

    def __init__(
        self,
        decode: Callable,
        predict: Callable,
        encode: Callable,
        bad_request: type[Exception],
        micro_batch_size: int = 0,
        decode_threads: int = 1,
        encode_threads: int = 1,
        overlap: bool = True,
        prepare: Callable | None = None,
        encode_many: Callable | None = None,
    ):
        self.decode, self.predict, self.encode, self.bad_request = decode, predict, encode, bad_request
        # encode_many(valid results of a micro-batch) → their bodies, in one call (the fused pipeline's leaves encode a
        # micro-batch in one nvJPEG call); when it raises, each row is encoded alone so only the culprit fails.
        self.encode_many = encode_many
        # prepare(valid items of a micro-batch, its position in the batch) → what predict takes: runs in the
        # decode stage, so writing a micro-batch into its staging buffer overlaps the model too.
        self.prepare = prepare or (lambda items, position: items)
        self.micro_batch_size = micro_batch_size  # 0: the whole TorchServe batch is one micro-batch
        self.overlap = overlap
        self.times = StageTimes()
        self.pools: list[ThreadPoolExecutor] = []
        if overlap:
            # One predict thread: the model runs one micro-batch at a time, in order.
            self.pools = [
                ThreadPoolExecutor(decode_threads, thread_name_prefix="segserve-decode"),
                ThreadPoolExecutor(1, thread_name_prefix="segserve-predict"),
                ThreadPoolExecutor(encode_threads, thread_name_prefix="segserve-encode"),
            ]
            # Stop the threads when the runner goes away or the worker process exits.
            self._finalizer = weakref.finalize(self, _shutdown, self.pools)

    def close(self) -> None:
        if self.pools:
            self._finalizer()

    def run(self, bodies: list) -> list:
        """One result per body: encoded bytes, or the BadRequest raised for it (bodies may already be BadRequest)."""
        size = self.micro_batch_size or max(len(bodies), 1)
        chunks = [list(range(start, min(start + size, len(bodies)))) for start in range(0, len(bodies), size)]
        results: list = [None] * len(bodies)
        if not self.overlap:
            for position, chunk in enumerate(chunks):
                self._store(results, chunk, self._encode_chunk(self._predict_chunk(self._decode_chunk(bodies, chunk, position))))
            return results
        decode_pool, predict_pool, encode_pool = self.pools
        decoded = [decode_pool.submit(self._decode_chunk, bodies, chunk, position) for position, chunk in enumerate(chunks)]
        predicted = [predict_pool.submit(lambda d: self._predict_chunk(d.result()), d) for d in decoded]
        encoded = [encode_pool.submit(lambda p: self._encode_chunk(p.result()), p) for p in predicted]
        for chunk, future in zip(chunks, encoded, strict=True):
            self._store(results, chunk, future.result())
        return results

    # Stages: each takes and returns a list aligned with its chunk; errors travel as values (BadRequest, RowFailure).
    def _failed(self, value) -> bool:
        return isinstance(value, (self.bad_request, RowFailure))

    def _decode_chunk(self, bodies: list, chunk: list[int], position: int) -> tuple[list, object]:
        """(per row: the decoded item or its error, the valid rows prepared for predict or None)."""
        started, out = time.perf_counter(), []
        for idx in chunk:
            body = bodies[idx]
            try:
                out.append(body if self._failed(body) else self.decode(body))
            except self.bad_request as error:
                out.append(error)
            except Exception as error:  # a bug or a codec surprise: this row's 500, not its batch-mates'
                out.append(RowFailure.of("decoding", error))
        decoded = time.perf_counter()
        self.times.add("decode_ms", (decoded - started) * 1000)
        try:
            prepared = self._prepare_valid(out, position)
        except Exception:  # which row cannot be staged? each alone, then the others together
            for i, item in enumerate(out):
                if self._failed(item):
                    continue
                try:
                    self.prepare([item], position)
                except Exception as error:
                    out[i] = RowFailure.of("preparing", error)
            prepared = self._prepare_valid(out, position)
        self.times.add("stage_ms", (time.perf_counter() - decoded) * 1000)
        return out, (prepared, position)

    def _prepare_valid(self, items: list, position: int):
        valid = [item for item in items if not self._failed(item)]
        return self.prepare(valid, position) if valid else None

    def _predict_chunk(self, decoded: tuple[list, object]) -> list:
        started = time.perf_counter()
        items, (prepared, position) = decoded
        valid = [i for i, item in enumerate(items) if not self._failed(item)]
        out = list(items)
        if valid:
            try:
                results = self.predict(prepared)
            except Exception as error:
                if len(valid) == 1:
                    results = [RowFailure.of("predicting", error)]
                else:  # which row broke the batch? each alone: the others are served, the culprit gets its 500
                    results = [self._predict_alone(items[i], position) for i in valid]
            for i, result in zip(valid, results, strict=True):
                out[i] = result
        self.times.add("predict_ms", (time.perf_counter() - started) * 1000)
        return out

    def _predict_alone(self, item, position: int):
        try:
            return self.predict(self.prepare([item], position))[0]
        except self.bad_request as error:
            return error
        except Exception as error:
            return RowFailure.of("predicting", error)

    def _encode_chunk(self, results: list) -> list:
        started = time.perf_counter()
        valid = [i for i, result in enumerate(results) if not self._failed(result)]
        if self.encode_many is not None and len(valid) > 1:
            try:
                encoded = self.encode_many([results[i] for i in valid])
                out = list(results)
                for i, body in zip(valid, encoded, strict=True):
                    out[i] = body
                self.times.add("encode_ms", (time.perf_counter() - started) * 1000)
                return out
            except Exception:  # which row? each alone below: the others are served, the culprit gets its error
                logger.warning("encoding a micro-batch of %d failed; encoding its rows one by one", len(valid), exc_info=True)
        out = []
        for result in results:
            try:
                out.append(result if self._failed(result) else self.encode(result))
            except self.bad_request as error:
                out.append(error)
            except Exception as error:
                out.append(RowFailure.of("encoding", error))
        self.times.add("encode_ms", (time.perf_counter() - started) * 1000)
        return out

    @staticmethod
    def _store(results: list, chunk: list[int], values: list) -> None:
        for idx, value in zip(chunk, values, strict=True):
            results[idx] = value


def _shutdown(pools: list[ThreadPoolExecutor]) -> None:
    for pool in pools:
        pool.shutdown(wait=True, cancel_futures=True)
