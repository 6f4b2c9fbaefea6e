"""Build object_detector.mar and image_classifier.mar: TorchServe's own built-in `object_detector` and
`image_classifier` handlers (ts/torch_handler/, named by each archive, no handler file of ours), made the documented
way (torch-model-archiver --handler object_detector / --handler image_classifier), random weights, nothing downloaded:

- object_detector.mar: an eager model, the handler's way for a detector: detector_model.py (--model-file, torchvision's
  Faster R-CNN MobileNetV3-Large 320 FPN, four classes of ours) and its state dict (--serialized-file);
- image_classifier.mar: torchvision's MobileNetV3-Small (ten classes of ours) as TorchScript.

Each has an index_to_name.json of ours. Random weights with their BatchNorm statistics taken from the project's
calibration images (segserve/model/synthetic.py, segserve/model/quantize.py's seeds) as each handler prepares them
(build_vision_join.py's calibrated()): freshly initialised, the networks answer alike whatever the image (the
detector scores every box 1/4, under the handler's fixed threshold of 0.5 that torchvision's box_score_thresh cannot
lower: no detection at all); calibrated, with the detector's class logits sharpened (SHARPER), the detector finds
boxes in the sample JPEGs and the classifier's top five differ by image. The handlers import captum, which
segserve's install_requires brings. Not into <temp dir>/object_detector or <temp dir>/image_classifier:

    .venv/bin/python benchmarks/foreign/build_builtin_vision.py /tmp/builtin_vision_archives
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
sys.path.insert(0, str(HERE))  # detector_model.py and build_vision_join.py beside this file, as a script has them

from build_vision_join import calibrated  # noqa: E402
from detector_model import NAMES as SHAPES  # noqa: E402

ARCHIVES = ("object_detector", "image_classifier")  # each archive's model name and TorchServe handler
CALIBRATION_IMAGES = 16
# the detector's class logits ×4: calibrated, its scores still sit near 1/4 and few boxes reach the handler's 0.5;
# so sharpened (and seeded 1), it finds 30 boxes of two classes in samples/shapes_1.jpg and 12 in test_fanout's PNG
SHARPER = 4.0
DETECTOR_SEED = 1
COLOURS = ("red", "orange", "yellow", "green", "cyan", "blue", "purple", "pink", "brown", "grey")  # the classifier's


def calibration_images() -> list:
    """The calibration images of segserve/model/quantize.py (seeds of their own), as PIL images: a handler's input."""
    from torchvision.transforms.functional import to_pil_image

    from segserve.model.quantize import CALIBRATION_SEED_BASE
    from segserve.model.synthetic import make_sample

    return [to_pil_image(make_sample(CALIBRATION_SEED_BASE + i)[0]) for i in range(CALIBRATION_IMAGES)]


def detector(work: Path) -> list[str]:
    """The detector's state dict and the archiver's arguments for it."""
    import torch
    from detector_model import ShapeDetector
    from ts.torch_handler.object_detector import ObjectDetector

    torch.manual_seed(DETECTOR_SEED)
    model = ShapeDetector().eval()
    images = [ObjectDetector.image_processing(image) for image in calibration_images()]
    network = model.network
    # the backbone's BatchNorm layers see what they see when serving: the images as the network resizes and normalises them
    calibrated(network.backbone.body, network.transform(images)[0].tensors)
    classes = network.roi_heads.box_predictor.cls_score
    with torch.no_grad():
        classes.weight.mul_(SHARPER)
        classes.bias.mul_(SHARPER)
    torch.save(model.state_dict(), work / "detector.pt")
    names = work / "index_to_name.json"
    names.write_text(json.dumps({str(i): name for i, name in enumerate(SHAPES)}))
    files = ["--model-file", str(HERE / "detector_model.py"), "--serialized-file", str(work / "detector.pt")]
    return [*files, "--extra-files", str(names)]


def classifier(work: Path) -> list[str]:
    """The classifier as TorchScript and the archiver's arguments for it."""
    import torch
    from torchvision.models import mobilenet_v3_small
    from ts.torch_handler.image_classifier import ImageClassifier

    torch.manual_seed(0)
    batch = torch.stack([ImageClassifier.image_processing(image) for image in calibration_images()])
    network = calibrated(mobilenet_v3_small(weights=None, num_classes=len(COLOURS)), batch)
    torch.jit.script(network).save(str(work / "classifier.pt"))
    names = work / "index_to_name.json"
    names.write_text(json.dumps({str(i): name for i, name in enumerate(COLOURS)}))
    return ["--serialized-file", str(work / "classifier.pt"), "--extra-files", str(names)]


def main(out: Path) -> list[Path]:
    # torch-model-archiver stages an archive's files in <temp dir>/<model name> and deletes that folder after
    for name in ARCHIVES:
        if out.resolve() == (Path(tempfile.gettempdir()) / name).resolve():
            raise SystemExit(f"error: {out}: torch-model-archiver stages {name}.mar's files there and deletes it: choose another folder")
    out.mkdir(parents=True, exist_ok=True)
    for name, files in (("object_detector", detector), ("image_classifier", classifier)):
        with tempfile.TemporaryDirectory() as work:  # each archive's own index_to_name.json
            archiver = [str(BIN / "torch-model-archiver"), "--model-name", name, "--version", "1.0", "--handler", name]
            archiver += [*files(Path(work)), "--export-path", str(out), "--force"]
            subprocess.run(archiver, check=True, capture_output=True)
    print(f"built {', '.join(f'{name}.mar' for name in ARCHIVES)} in {out} (TorchServe's handlers of those names, random weights)")
    return [out / f"{name}.mar" for name in ARCHIVES]


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("builtin_vision_archives"))
