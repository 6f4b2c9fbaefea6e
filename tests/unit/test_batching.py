"""The batching machinery on the CPU: reused buffers, micro-batches, overlap, clean shutdown."""

import ctypes
import threading

import pytest
import torch
from torchvision.io import encode_jpeg, encode_png

from handlers.batching import StageRunner, StagingPool
from handlers.segmentation import SegmentationHandler
from segserve.model.synthetic import make_sample
from tests.conftest import make_context, status_of, with_rows


def segmenter(weights, **settings):
    handler = SegmentationHandler()
    handler.initialize(make_context(weights.parent, settings, weights.name))
    return handler


def mixed_batch() -> list[bytes]:
    """Seven requests of every kind, two of them bad, in one TorchServe batch."""
    image = make_sample(31)[0]
    raw = torch.randn(3, 256, 448, generator=torch.Generator().manual_seed(1)).half().numpy().tobytes()
    return [
        encode_jpeg(image).numpy().tobytes(),
        b"broken",
        encode_png(make_sample(32, 120, 200)[0]).numpy().tobytes(),
        raw,
        encode_jpeg(make_sample(33, 300, 500)[0]).numpy().tobytes(),
        encode_png(image).numpy().tobytes()[:500],
        encode_png(make_sample(34)[0]).numpy().tobytes(),
    ]


def handle(handler, bodies):
    context = with_rows(make_context(None, {}), len(bodies))
    out = handler.handle([{"body": b} for b in bodies], context)
    return out, [status_of(context, i) for i in range(len(bodies))]


def test_staging_buffers_are_allocated_once_and_reused(tiny_weights):
    handler = segmenter(tiny_weights)
    bodies = mixed_batch()
    handle(handler, bodies)
    buffer = handler.pool.get("input.0", (5, 3, 256, 448), torch.float32, memory_format=torch.channels_last)
    assert buffer.is_contiguous(memory_format=torch.channels_last)  # as the model takes it: no conversion per batch
    pointer, allocations = buffer.data_ptr(), handler.pool.allocations
    for _ in range(3):
        handle(handler, bodies)
    assert handler.pool.allocations == allocations == 1
    assert handler.pool.get("input.0", (5, 3, 256, 448), torch.float32, memory_format=torch.channels_last).data_ptr() == pointer


def test_micro_batched_overlapped_run_equals_the_sequential_one_bit_for_bit(tiny_weights):
    bodies = mixed_batch()
    plain, plain_status = handle(segmenter(tiny_weights), bodies)
    overlapped = segmenter(tiny_weights, micro_batch_size=2, overlap=True, decode_threads=2, encode_threads=2)
    for _ in range(2):  # and again, with every buffer reused
        out, status = handle(overlapped, bodies)
        assert out == plain and status == plain_status
    sequential_micro, _ = handle(segmenter(tiny_weights, micro_batch_size=3), bodies)
    assert sequential_micro == plain


def test_a_bad_row_in_a_micro_batch_does_not_disturb_the_others(tiny_weights):
    bodies = mixed_batch()
    _, status = handle(segmenter(tiny_weights, micro_batch_size=2, overlap=True), bodies)
    assert status == [200, 400, 200, 200, 200, 400, 200]
    alone = [handle(segmenter(tiny_weights), [b])[0][0] for b in (bodies[0], bodies[2])]
    out, _ = handle(segmenter(tiny_weights, micro_batch_size=2, overlap=True), bodies)
    assert [out[0], out[2]] == alone


def test_stage_threads_stop_on_close():
    def stage_threads():
        return {t for t in threading.enumerate() if t.name.startswith("segserve-")}

    before = stage_threads()  # threads of other tests' handlers may end meanwhile: compare only what this runner adds
    runner = StageRunner(lambda b: b, lambda items: items, lambda r: r, ValueError, micro_batch_size=1, overlap=True, decode_threads=2)
    assert runner.run([b"a", b"b", b"c"]) == [b"a", b"b", b"c"]
    ours = stage_threads() - before
    assert ours
    runner.close()
    assert not ours & stage_threads()


def test_pool_keys_by_shape_and_dtype():
    pool = StagingPool(torch.device("cpu"))
    a = pool.get("x", (2, 3), torch.float32)
    assert pool.get("x", (2, 3), torch.float32) is a
    assert pool.get("x", (4, 3), torch.float32) is not a and pool.get("x", (2, 3), torch.float16) is not a
    assert pool.allocations == 3 and not a.is_pinned()


@pytest.mark.gpu
def test_pool_pins_host_buffers_with_cuda():
    pool = StagingPool(torch.device("cuda"))
    assert pool.get("x", (2, 3), torch.float32).is_pinned()
    assert pool.get("x", (2, 3), torch.float32, on_device=True).device.type == "cuda"


@pytest.mark.gpu
def test_streams_order_copies_and_compute_with_events():
    from handlers.batching import Streams

    device = torch.device("cuda")
    streams = Streams(device)
    pool = StagingPool(device)
    host = pool.get("in", (64, 1024), torch.float32)
    for value in range(5):  # a race between the copies and the compute would show up as a stale value
        host.fill_(value)
        batch = streams.to_device(host, pool.get("in", (64, 1024), torch.float32, on_device=True))
        with streams.compute_context():
            result = (batch * 2).sum(1).to(torch.float32)
        out = streams.to_host(result, pool.get("out", (64,), torch.float32))
        assert torch.all(out == value * 2 * 1024)


def test_raw_bodies_are_read_in_place_not_copied(tiny_weights):
    """TorchServe hands a body over as a bytearray: decode views it, and fill copies it once, into the staging row."""
    handler = segmenter(tiny_weights)
    body = bytearray(torch.randn(3, 256, 448).half().numpy().tobytes())
    decoded = handler.decode(body)
    body_address = ctypes.addressof((ctypes.c_char * len(body)).from_buffer(body))
    assert decoded.is_raw and decoded.pixels.data_ptr() == body_address
    body[:2] = b"\x00\x3c"  # 1.0 in float16, written through the body: the view sees it
    assert float(decoded.pixels[0, 0, 0]) == 1.0


@pytest.mark.parametrize("overlap", [False, True])
def test_encode_many_takes_a_micro_batch_in_one_call_and_a_row_that_breaks_it_fails_alone(overlap):
    """The fused pipeline's leaves encode a micro-batch in one call; when that call raises, each row is encoded
    alone: the culprit gets its 500, its batch-mates their bodies, the rows that were already bad keep their 400."""

    class Bad(ValueError):
        pass

    calls = []

    def decode(body):
        if body == b"bad":
            raise Bad("bad row")
        return body

    def encode_many(results):
        calls.append(len(results))
        if b"poison" in results:
            raise RuntimeError("the batch call broke")
        return [result.upper() for result in results]

    def encode(result):
        if result == b"poison":
            raise RuntimeError("this row cannot be encoded")
        return result.upper()

    runner = StageRunner(decode, lambda items: list(items), encode, Bad, micro_batch_size=3, overlap=overlap, encode_many=encode_many)
    try:
        out = runner.run([b"a", b"bad", b"b", b"c", b"poison", b"d", b"e"])
    finally:
        runner.close()
    assert out[0] == b"A" and out[2] == b"B" and out[3] == b"C" and out[5] == b"D" and out[6] == b"E"
    assert isinstance(out[1], Bad)
    assert "this row cannot be encoded" in str(out[4])
    assert sorted(calls) == [2, 3]  # one call per micro-batch of two or more valid rows (the last has one)
