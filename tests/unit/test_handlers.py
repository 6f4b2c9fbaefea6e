"""Both handlers in process, through TorchServe's own Context."""

import io
import json
import struct
import subprocess
import sys

import pytest
import torch
from PIL import Image
from torchvision.io import decode_jpeg, encode_jpeg, encode_png

from handlers import classmap
from handlers.base import BATCH_SIZE_HEADER
from handlers.jpeg import JpegHandler, voc_palette
from handlers.segmentation import SegmentationHandler, image_size
from segserve import ROOT
from segserve.model.synthetic import make_sample
from tests.conftest import make_context, status_of, with_rows

RAW_FP16_BYTES = 3 * 256 * 448 * 2  # the seed's body: FP16 [3, 256, 448]


@pytest.fixture(scope="module")
def seg(tiny_weights):
    handler = SegmentationHandler()
    handler.initialize(make_context(tiny_weights.parent, {"max_image_pixels": 2_000_000}, tiny_weights.name))
    return handler


@pytest.fixture(scope="module")
def jpeg(tmp_path_factory):
    handler = JpegHandler()
    handler.initialize(make_context(tmp_path_factory.mktemp("jpeg"), {"quality": 95, "palette": [[0, 0, 0], [255, 255, 255]]}))
    return handler


def jpeg_bytes(height=256, width=448, seed=1) -> bytes:
    return encode_jpeg(make_sample(seed, height, width)[0], quality=90).numpy().tobytes()


def png_bytes(height=100, width=150, seed=2) -> bytes:
    return encode_png(make_sample(seed, height, width)[0]).numpy().tobytes()


def run(handler, bodies):
    context = with_rows(make_context(None, {}), len(bodies))
    out = handler.handle([{"body": b} for b in bodies], context)
    return out, context


def test_segmentation_answers_a_class_map_per_row_with_the_original_size(seg):
    raw = torch.randn(3, 256, 448, dtype=torch.float16).numpy().tobytes()
    out, context = run(seg, [jpeg_bytes(300, 500), png_bytes(100, 150), raw])
    assert len(out) == 3
    sizes = [(m.original_height, m.original_width, tuple(m.labels.shape)) for m in map(classmap.unpack, out)]
    assert sizes == [(300, 500, (256, 448)), (100, 150, (256, 448)), (256, 448, (256, 448))]
    assert [status_of(context, i) for i in range(3)] == [200, 200, 200]
    assert all(context.get_response_content_type(i) == "application/octet-stream" for i in range(3))
    assert context.get_response_headers(0)[BATCH_SIZE_HEADER] == "3"
    # ~1 byte per model pixel crosses to the next node, never logits.
    assert len(out[0]) == classmap.HEADER.size + 256 * 448


@pytest.mark.parametrize(
    "body, message",
    [
        (b"not an image", "expected a JPEG or PNG image, or a raw float16 tensor of shape [3, 256, 448] (688128 bytes)"),
        (b"\x00" * (RAW_FP16_BYTES - 2), "got 688126 bytes that are neither"),
        (b"\xff\xd8\xff\xe0\x00\x10JFIF", "JPEG is truncated or corrupt"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "PNG is truncated"),
        (b"", "got 0 bytes"),
    ],
)
def test_a_bad_row_gets_its_own_400_and_its_batch_mates_are_served(seg, body, message):
    out, context = run(seg, [jpeg_bytes(), body, png_bytes()])
    assert [status_of(context, i) for i in range(3)] == [200, 400, 200]
    assert message in json.loads(out[1])["error"]
    assert context.get_response_content_type(1) == "application/json"
    assert classmap.unpack(out[0]).original_height == 256 and classmap.unpack(out[2]).original_width == 150


def test_truncated_jpeg_body_is_refused_with_the_decoder_message(seg):
    whole = jpeg_bytes()
    out, context = run(seg, [whole[: len(whole) // 3]])
    assert status_of(context, 0) == 400
    assert "could not decode the jpeg image" in json.loads(out[0])["error"]


def test_decompression_bomb_is_refused_before_decoding(seg):
    # A valid PNG header declaring 40000 x 40000 pixels, with no pixel data behind it.
    ihdr = struct.pack(">II", 40000, 40000) + b"\x08\x02\x00\x00\x00"
    bomb = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + b"\x00" * 4
    out, context = run(seg, [bomb])
    assert status_of(context, 0) == 400
    assert "40000x40000 pixels is refused: the limit is 2000000 pixels" in json.loads(out[0])["error"]


def test_json_body_is_refused_with_a_hint(seg):
    context = with_rows(make_context(None, {}), 1)
    out = seg.handle([{"body": {"image": "x"}}], context)
    assert status_of(context, 0) == 400
    assert "Content-Type: application/octet-stream" in json.loads(out[0])["error"]


@pytest.mark.parametrize("progressive", [False, True])
def test_image_size_reads_jpeg_and_png_headers(progressive):
    buffer = io.BytesIO()
    Image.new("RGB", (321, 123), (10, 20, 30)).save(buffer, "JPEG", progressive=progressive)
    assert image_size(buffer.getvalue()) == ("jpeg", 123, 321)
    assert image_size(png_bytes(77, 99)) == ("png", 77, 99)
    assert image_size(b"GIF89a") is None


def test_jpeg_handler_colours_the_class_map_at_the_original_size(jpeg):
    labels = torch.zeros(64, 112, dtype=torch.uint8)
    labels[16:48, 28:84] = 1
    out, context = run(jpeg, [classmap.pack(labels, 2, 256, 448), classmap.pack(labels, 2, 64, 112)])
    assert [status_of(context, i) for i in range(2)] == [200, 200]
    assert context.get_response_content_type(0) == "image/jpeg"
    big = decode_jpeg(torch.frombuffer(bytearray(out[0]), dtype=torch.uint8))
    assert big.shape == (3, 256, 448)
    expected = torch.zeros(256, 448, dtype=torch.bool)
    expected[64:192, 112:336] = True
    assert ((big.float().mean(0) > 127) == expected).float().mean() > 0.99


def test_jpeg_handler_refuses_bad_class_maps_and_passes_upstream_errors_on(jpeg):
    good = classmap.pack(torch.ones(8, 8, dtype=torch.uint8), 2, 8, 8)
    upstream = json.dumps({"error": "could not decode the png image"}).encode()
    out, context = run(jpeg, [good[:-1], upstream, good])
    assert [status_of(context, i) for i in range(3)] == [400, 400, 200]
    assert "needs 82 bytes, got 81" in json.loads(out[0])["error"]
    assert json.loads(out[1])["error"] == "could not decode the png image"


def test_classmap_round_trip_and_voc_palette():
    labels = torch.randint(0, 5, (7, 9), dtype=torch.uint8)
    unpacked = classmap.unpack(classmap.pack(labels, 5, 70, 90))
    assert torch.equal(unpacked.labels, labels) and unpacked[1:4] == (5, 70, 90) and unpacked.ready is None
    assert voc_palette()[:3] == [[0, 0, 0], [128, 0, 0], [0, 128, 0]]
    assert len({tuple(c) for c in voc_palette()}) == 256


def test_unknown_handler_setting_is_refused_with_a_suggestion(tiny_weights):
    with pytest.raises(ValueError, match="handler.precison: unknown setting — did you mean 'precision'"):
        SegmentationHandler().initialize(make_context(tiny_weights.parent, {"precison": "fp16"}, tiny_weights.name))


def test_bf16_precision_runs(tiny_weights):
    handler = SegmentationHandler()
    handler.initialize(make_context(tiny_weights.parent, {"precision": "bf16"}, tiny_weights.name))
    out, context = run(handler, [jpeg_bytes()])
    assert status_of(context, 0) == 200 and classmap.unpack(out[0]).labels.shape == (256, 448)


@pytest.mark.gpu
def test_handlers_on_cuda_match_the_cpu(tiny_weights, seg, jpeg, tmp_path):
    """nvJPEG decode, the network and argmax on the device, nvJPEG encode; same labels as the CPU."""

    def on_gpu(handler_class, model_dir, settings, serialized=None):
        handler = handler_class()
        handler.initialize(make_context(model_dir, settings, serialized, gpu_id=0))
        assert handler.device.type == "cuda"
        return handler

    seg_gpu = on_gpu(SegmentationHandler, tiny_weights.parent, {"max_image_pixels": 2_000_000}, tiny_weights.name)
    jpeg_gpu = on_gpu(JpegHandler, tmp_path, {"quality": 95, "palette": [[0, 0, 0], [255, 255, 255]]})
    bodies = [jpeg_bytes(seed=21), png_bytes(seed=22)]
    maps_gpu, maps_cpu = run(seg_gpu, bodies)[0], run(seg, bodies)[0]
    for gpu_map, cpu_map in zip(maps_gpu, maps_cpu, strict=True):
        agreement = (classmap.unpack(gpu_map).labels == classmap.unpack(cpu_map).labels).float().mean()
        assert agreement > 0.99  # nvJPEG and libjpeg-turbo may differ in the last bit of a few pixels
    jpegs, context = run(jpeg_gpu, maps_gpu)
    assert all(status_of(context, i) == 200 for i in range(2))
    assert decode_jpeg(torch.frombuffer(bytearray(jpegs[0]), dtype=torch.uint8)).shape == (3, 256, 448)


def test_fused_pipeline_orders_chains_and_fan_outs_and_refuses_joins_and_cycles():
    from handlers.dag import parse_dag

    assert parse_dag({"seg": ["jpeg"]}) == (["seg", "jpeg"], {"seg": ["jpeg"]}, "seg", ["jpeg"])
    assert parse_dag({"a": ["b"], "b": ["c"]}).order == ["a", "b", "c"]
    fan_out = parse_dag({"seg": ["areas", "jpeg"], "jpeg": ["thumb"]})
    assert fan_out.order == ["seg", "areas", "jpeg", "thumb"] and fan_out.leaves == ["areas", "thumb"]
    with pytest.raises(ValueError, match="several parents"):
        parse_dag({"a": ["c"], "b": ["c"]})
    with pytest.raises(ValueError, match="exactly one root"):
        parse_dag({"a": ["b"], "b": ["a"]})
    with pytest.raises(ValueError, match="cycle"):
        parse_dag({"r": ["x"], "a": ["b"], "b": ["a"]})


def test_areas_counts_pixels_and_scales_boxes_to_the_original_image():
    from handlers.areas import areas

    labels = torch.zeros(4, 8, dtype=torch.uint8)
    labels[1:3, 2:6] = 1  # 8 pixels, columns 2–5, rows 1–2
    result = areas(classmap.ClassMap(labels, 3, 40, 80))
    assert result["pixels"] == [24, 8, 0]
    assert result["boxes"] == {"0": [0, 0, 80, 40], "1": [20, 10, 60, 30]}  # ×10 to 40×80; class 2 is absent
    assert result["map_size"] == [4, 8] and result["original_size"] == [40, 80]


def test_a_one_node_dag_is_refused_with_the_reason():
    from handlers.dag import parse_dag

    with pytest.raises(ValueError, match="register that model itself"):
        parse_dag({"seg": []})


@pytest.mark.gpu
def test_jpeg_node_on_cuda_draws_the_same_image_as_on_the_cpu(jpeg, tmp_path):
    """A real class map (shapes, not one class): nvJPEG's image matches libjpeg-turbo's within JPEG noise."""
    jpeg_gpu = JpegHandler()
    jpeg_gpu.initialize(make_context(tmp_path, {"quality": 95, "palette": [[0, 0, 0], [255, 255, 255]]}, gpu_id=0))
    maps = [classmap.pack(make_sample(seed, 300, 520)[1], 2, 300, 520) for seed in (41, 42, 43)]
    on_gpu, on_cpu = run(jpeg_gpu, maps)[0], run(jpeg, maps)[0]
    for gpu_bytes, cpu_bytes in zip(on_gpu, on_cpu, strict=True):
        gpu_image = decode_jpeg(torch.frombuffer(bytearray(gpu_bytes), dtype=torch.uint8)).float()
        cpu_image = decode_jpeg(torch.frombuffer(bytearray(cpu_bytes), dtype=torch.uint8)).float()
        assert gpu_image.shape == cpu_image.shape == (3, 300, 520)
        assert (gpu_image - cpu_image).abs().mean() < 3 and cpu_image.std() > 50  # not one flat colour


def test_a_16_bit_png_is_segmented_like_its_8_bit_version(seg):
    image = make_sample(61, 120, 200)[0]
    wide = image.to(torch.int32) * 257  # the same picture on the 16-bit scale
    png16 = io.BytesIO()
    Image.fromarray(wide[0].numpy().astype("uint16")).save(png16, format="PNG")  # grey, 16 bits per sample
    grey8 = image[0:1].expand(3, -1, -1).contiguous()
    decoded = seg.decode(png16.getvalue()).pixels
    assert decoded.dtype == torch.uint8 and torch.equal(decoded, grey8)  # 65535 → 255, each value back exactly
    out, context = run(seg, [png16.getvalue(), encode_png(grey8).numpy().tobytes()])
    assert status_of(context, 0) == status_of(context, 1) == 200
    assert torch.equal(classmap.unpack(out[0]).labels, classmap.unpack(out[1]).labels)


def test_the_test_slowdown_spins_for_its_share_of_the_handlers_time_and_is_off_by_default(tmp_path, monkeypatch):
    import handlers.testing_seam

    spun = []
    monkeypatch.setattr(handlers.testing_seam, "spin", spun.append)
    config = {"quality": 95, "palette": [[0, 0, 0], [255, 255, 255]]}
    maps = [classmap.pack(make_sample(70, 64, 96)[1], 2, 64, 96)]
    plain = JpegHandler()
    plain.initialize(make_context(tmp_path, config))
    run(plain, maps)
    assert spun == []
    monkeypatch.setenv(handlers.testing_seam.SLOWDOWN_ENV, "0.5")
    slowed = JpegHandler()
    slowed.initialize(make_context(tmp_path, config))
    out, context = run(slowed, maps)
    assert status_of(context, 0) == 200 and len(spun) == 1 and 0 < spun[0] < 5
    monkeypatch.setenv(handlers.testing_seam.SLOWDOWN_ENV, "-1")
    with pytest.raises(ValueError, match="between 0 and 10"):
        JpegHandler().initialize(make_context(tmp_path, config))


# as in an archive: TorchServe imports the handler file as a top-level module (segmentation, jpeg), the package beside it
IMPORT_CHECK = """
import sys
sys.path[:0] = ["handlers", "."]
import segmentation, jpeg, pipeline
print("dynamo after the handlers:", "torch._dynamo" in sys.modules, "sympy" in sys.modules)
import torch
from torchvision.ops import roi_align
print("compiles:", torch.compile(lambda x: x * 2 + 1, backend="eager")(torch.ones(2)).tolist())
print("torchvision's helper:", roi_align.__globals__["is_compile_supported"]("cpu"))
"""


def test_a_worker_imports_the_handlers_without_torch_dynamo_and_can_still_compile():
    """The handlers import torchvision without torch._dynamo (about 2 s of a worker's start); compiling later works."""
    done = subprocess.run([sys.executable, "-c", IMPORT_CHECK], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [
        "dynamo after the handlers: False False",
        "compiles: [3.0, 3.0]",
        "torchvision's helper: True",
    ], done.stdout + done.stderr[-2000:]
    # the network alone, as the bare forward imports it
    check = "import sys, handlers.segnet; print('torch._dynamo' in sys.modules, 'torchvision' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.stdout.split() == ["False", "True"], done.stdout + done.stderr[-2000:]
