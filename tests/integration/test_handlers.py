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


@pytest.mark.parametrize("gpu_id", [None, pytest.param(0, marks=pytest.mark.gpu)], ids=["cpu", "cuda"])
def test_fused_pipeline_overlapped_equals_sequential(model_store, tmp_path, gpu_id):
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
    for _ in range(3):  # and again, with every buffer reused
        assert run(overlapped, bodies)[0] == sequential


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
