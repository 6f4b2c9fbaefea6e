"""Both handlers in process, through TorchServe's own Context."""

import types

import pytest
import torch
import yaml

from handlers.segmentation import SegmentationHandler
from tests.conftest import make_context, status_of
from tests.unit.test_handlers import RAW_FP16_BYTES, jpeg, jpeg_bytes, png_bytes, run, seg  # noqa: F401 (fixtures among them)


def test_torchscript_and_state_dict_give_the_same_labels(tmp_path, tiny_weights, seg):
    from handlers.segnet import SegNet

    network = SegNet(2)
    network.load_state_dict(torch.load(tiny_weights))
    scripted = tmp_path / "scripted.pt"
    torch.jit.script(network.eval()).save(str(scripted))
    from_script = SegmentationHandler()
    from_script.initialize(make_context(tmp_path, {}, scripted.name))
    bodies = [jpeg_bytes(seed=5), png_bytes(seed=6)]
    assert run(from_script, bodies)[0] == run(seg, bodies)[0]


@pytest.fixture
def cuda_overlap_allowed(monkeypatch):
    """Overlap on a CUDA worker before a device run has checked it (handlers/testing_seam.py)."""
    monkeypatch.setenv("SEGSERVE_TEST_CUDA_OVERLAP", "1")


@pytest.mark.parametrize("gpu_id", [None, pytest.param(0, marks=pytest.mark.gpu)], ids=["cpu", "cuda"])
def test_fused_pipeline_overlapped_equals_sequential(model_store, tmp_path, gpu_id, cuda_overlap_allowed):
    """Micro-batches in flight together (own buffers; on the GPU, events between nodes): same bytes as one at a time."""
    import zipfile

    from handlers.pipeline import PipelineHandler

    with zipfile.ZipFile(model_store / "seg_jpeg_fused.mar") as archive:
        archive.extractall(tmp_path)

    def fused(**runner):
        handler = PipelineHandler()
        handler.initialize(make_context(tmp_path, {"spec": "seg_jpeg.yaml", **runner}, "seg.pt", gpu_id=gpu_id))
        assert handler.nodes["seg"].device.type == ("cpu" if gpu_id is None else "cuda")
        return handler

    bodies = [jpeg_bytes(seed=50 + i) if i % 2 else png_bytes(seed=50 + i) for i in range(8)]
    sequential, context = run(fused(), bodies)
    assert all(status_of(context, i) == 200 for i in range(8))
    overlapped = fused(micro_batch_size=2, overlap=True, decode_threads=2, encode_threads=2)
    assert overlapped.stages.overlap  # on CUDA: allowed by the test seam before a device run has checked it
    for _ in range(3):  # and again, with every buffer reused
        assert run(overlapped, bodies)[0] == sequential


# Sizes that differ from the model's input and from each other (resized on the device or on the host), odd sides.
MIXED_SIZES = [(256, 448), (97, 131), (600, 1000), (17, 9), (300, 520), (1080, 1920), (64, 48)]


@pytest.mark.parametrize("gpu_id", [None, pytest.param(0, marks=pytest.mark.gpu)], ids=["cpu", "cuda"])
def test_fused_pipeline_overlapped_equals_sequential_harder(model_store, tmp_path, gpu_id, cuda_overlap_allowed):
    """Many rounds, mixed image sizes and kinds, micro-batches that do not divide the batch (11 rows in 3s), batches of
    other sizes in between, three threads per stage: the same bytes as one micro-batch at a time, every time."""
    import zipfile

    from handlers.pipeline import PipelineHandler

    with zipfile.ZipFile(model_store / "seg_jpeg_fused.mar") as archive:
        archive.extractall(tmp_path)

    def fused(**runner):
        handler = PipelineHandler()
        handler.initialize(make_context(tmp_path, {"spec": "seg_jpeg.yaml", **runner}, "seg.pt", gpu_id=gpu_id))
        return handler

    def body(i: int) -> bytes:
        height, width = MIXED_SIZES[i % len(MIXED_SIZES)]
        return jpeg_bytes(height, width, seed=70 + i) if i % 3 else png_bytes(height, width, seed=70 + i)

    batches = [[body(i) for i in range(11)], [body(i) for i in range(11, 16)], [body(i) for i in range(16, 17)]]
    sequential = fused()
    expected = [run(sequential, bodies)[0] for bodies in batches]
    overlapped = fused(micro_batch_size=3, overlap=True, decode_threads=3, encode_threads=3)
    assert overlapped.stages.overlap
    rounds = 12 if gpu_id is not None else 3  # the CPU run checks the logic; the GPU's streams need the rounds
    for round_ in range(rounds):
        for bodies, want in zip(batches, expected, strict=True):
            got, context = run(overlapped, bodies)
            assert [status_of(context, i) for i in range(len(bodies))] == [200] * len(bodies)
            wrong = [i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b]
            assert not wrong, f"round {round_}: rows {wrong} of a batch of {len(bodies)} differ from the sequential run"


@pytest.mark.gpu
def test_overlap_is_off_on_cuda_until_a_device_run_checked_it(model_store, tmp_path, caplog):
    """Without the test seam, a CUDA worker asked to overlap runs one micro-batch at a time and says so in one line."""
    import zipfile

    from handlers import batching
    from handlers.pipeline import PipelineHandler

    if batching.OVERLAP_CHECKED_ON_CUDA:
        pytest.skip("overlap on CUDA has been checked on a device: nothing is switched off")
    with zipfile.ZipFile(model_store / "seg_jpeg_fused.mar") as archive:
        archive.extractall(tmp_path)
    handler = PipelineHandler()
    handler.initialize(make_context(tmp_path, {"spec": "seg_jpeg.yaml", "micro_batch_size": 2, "overlap": True}, "seg.pt", gpu_id=0))
    assert not handler.stages.overlap
    assert any("overlap is off on cuda" in record.getMessage() for record in caplog.records)


@pytest.mark.gpu
def test_nvjpeg_encode_waits_for_the_image_its_stream_is_still_writing():
    """The cause of #48's wrong bytes: the image is written on this thread's stream behind a long kernel, and the
    JPEG must still be of the finished image (torchvision's encoder runs on a stream of its own)."""
    import torch.cuda

    from handlers.jpeg import encode_jpegs

    image = torch.zeros(3, 512, 512, dtype=torch.uint8, device="cuda")
    expected = encode_jpegs([torch.full_like(image, 200)], 90)[0]
    for _ in range(5):
        image.zero_()
        torch.cuda.synchronize()
        torch.cuda._sleep(200_000_000)  # about 0.1 s of GPU time queued ahead of the write
        image.fill_(200)
        assert torch.equal(encode_jpegs([image], 90)[0], expected)


def test_the_fused_pipeline_reports_the_bytes_its_nodes_copied(model_store, tmp_path):
    """On the GPU the jpeg leaf counts the JPEG it copies to the host in its own counters: the pipeline reports them
    (its device→host bytes were always 0). Here the leaf's count is set by hand: a CPU copies nothing."""
    import zipfile

    from handlers.pipeline import PipelineHandler

    with zipfile.ZipFile(model_store / "seg_jpeg_fused.mar") as archive:
        archive.extractall(tmp_path)
    handler = PipelineHandler()
    handler.initialize(make_context(tmp_path, {"spec": "seg_jpeg.yaml"}, "seg.pt"))
    counters = {}
    context = types.SimpleNamespace(metrics=types.SimpleNamespace(add_counter=lambda name, value: counters.update({name: value})))
    handler.nodes["jpeg"].stages.times.add("device_to_host_bytes", 5022.0)
    handler.nodes["jpeg"].stages.times.add("encode_ms", 3.0)  # a node's own stage times stay out of the pipeline's
    handler.report_metrics(context, response_bytes=5100, requests=1)
    assert counters["SegserveDeviceToHostBytes"] == 5022.0 and counters["SegserveResponseBytes"] == 5100
    assert counters.get("SegserveEncodeMs", 0.0) == 0.0  # the pipeline's own encode time, not the leaf's 3 ms


def test_a_node_of_the_fused_pipeline_does_not_set_the_workers_torch_threads(model_store, tmp_path):
    """torch's intra-op thread count is per process: the areas node's `threads: 1` must not slow the seg node."""
    import zipfile

    from handlers.pipeline import PipelineHandler

    with zipfile.ZipFile(model_store / "seg_fanout_fused.mar") as archive:
        archive.extractall(tmp_path)
        assert yaml.safe_load(archive.read("nodes/areas.yaml"))["handler"]["threads"] == 1
    before = torch.get_num_threads()
    try:
        handler = PipelineHandler()
        handler.initialize(make_context(tmp_path, {"spec": "seg_fanout.yaml", "threads": 2}, "seg.pt"))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
