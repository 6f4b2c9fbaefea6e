"""Build vision_join.war, a workflow of TorchServe's dog-breed shape through TorchServe's own vision handlers, with
the official archivers, into a folder: the function node pre_processing (vision_functions.py) → [cat_dog, dog_breed],
cat_dog → [dog_breed]. cat_dog.mar and dog_breed.mar are torchvision's MobileNetV3-Small as TorchScript with random
weights (weights=None: nothing is downloaded; 2 and 133 classes) behind ImageClassifier subclasses
(vision_cat_dog_handler.py, vision_breed_handler.py: dog_breed joins pre_processing's image and cat_dog's answer).
The spec is the example's (batch 4, 100 ms, 5 retries, timeout-ms 300000). Beside them, JPEG photos to send
(photo_*.jpg: a few sizes, two of them grayscale), generated here. The handlers import captum (TorchServe's
vision_handler.py does, at module level), which segserve's install_requires brings:

    .venv/bin/python benchmarks/foreign/build_vision_join.py /tmp/vision_join_archives && cd /tmp/vision_join_archives
    <repo>/.venv/bin/segserve fuse vision_join.war --model-store .
    <repo>/.venv/bin/segserve bench <repo>/benchmarks/foreign/vision_join.yaml --rounds 3 --results <repo>/results
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent

# TorchServe's examples/Workflows/dog_breed_classification spec, with our node names
SPEC = """models:
  min-workers: 1
  max-workers: 1
  batch-size: 4
  max-batch-delay: 100
  retry-attempts: 5
  timeout-ms: 300000
  cat_dog: {url: cat_dog.mar}
  dog_breed: {url: dog_breed.mar}
dag:
  pre_processing: [cat_dog, dog_breed]
  cat_dog: [dog_breed]
"""

# (width, height, PIL mode): photo-like sizes, two grayscale
PHOTOS = [(640, 480, "RGB"), (1024, 768, "RGB"), (320, 240, "RGB"), (500, 375, "L"), (800, 600, "L"), (224, 224, "RGB")]
BREEDS = 133
SEED = 3  # its cat_dog calls three photos dogs (one RGB, two grayscale), by margins of 0.002 or more


def photo(index: int, width: int, height: int, mode: str):
    """A smooth colour field with a few ellipses and a little noise: JPEG-compressible like a photo."""
    import numpy as np
    from PIL import Image, ImageDraw, ImageFilter

    rng = np.random.default_rng(index)
    field = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize((width, height), Image.BICUBIC)
    draw = ImageDraw.Draw(field)
    for _ in range(5):
        x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
        size = int(rng.integers(min(width, height) // 8, min(width, height) // 2))
        draw.ellipse((x - size, y - size // 2, x + size, y + size // 2), fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
    pixels = np.asarray(field.filter(ImageFilter.GaussianBlur(2)), dtype=np.int16) + rng.integers(-8, 9, (height, width, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).convert(mode)


def calibrated(network, batch):
    """Random weights with their BatchNorm statistics taken from the photos: freshly initialised, MobileNetV3's
    logits are about 1e-10 and the same class for every input; calibrated, they differ by photo."""
    import torch

    for module in network.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.momentum = None  # the batch's own mean and variance
    with torch.no_grad():
        network.train()(batch)
    return network.eval()


def run(command: list[str]) -> None:
    subprocess.run(command, check=True, capture_output=True)


def main(out: Path) -> Path:
    import torch
    from PIL import Image
    from torchvision.models import mobilenet_v3_small
    from ts.torch_handler.image_classifier import ImageClassifier

    # torch-model-archiver and torch-workflow-archiver stage an archive's files in <temp dir>/<name> and delete that folder after
    for name in ("cat_dog", "dog_breed", "vision_join"):
        if out.resolve() == (Path(tempfile.gettempdir()) / name).resolve():
            raise SystemExit(f"error: {out}: the archivers stage {name}'s files there and delete it: choose another folder")
    out.mkdir(parents=True, exist_ok=True)
    for index, (width, height, mode) in enumerate(PHOTOS):
        photo(index, width, height, mode).save(out / f"photo_{index}.jpg", format="JPEG", quality=90)
    # what the handlers make of the JPEGs as they are sent
    photos = [Image.open(out / f"photo_{index}.jpg").convert("RGB") for index in range(len(PHOTOS))]
    batch = torch.stack([ImageClassifier.image_processing(image) for image in photos])
    torch.manual_seed(SEED)
    cat_dog = calibrated(mobilenet_v3_small(weights=None, num_classes=2), batch)
    with torch.inference_mode():
        dogs = cat_dog(batch).argmax(1).tolist()
    # random weights: the join classifies only the rows cat_dog calls dogs, so both answers must occur
    if len(set(dogs)) < 2:
        raise SystemExit(f"error: cat_dog calls every photo a {'dog' if dogs[0] else 'cat'}: the join's model would not run")
    torch.jit.script(cat_dog).save(str(out / "cat_dog.pt"))
    torch.jit.script(calibrated(mobilenet_v3_small(weights=None, num_classes=BREEDS), batch)).save(str(out / "dog_breed.pt"))
    (out / "index_to_name.json").write_text(json.dumps({str(i): f"breed_{i:03d}" for i in range(BREEDS)}))
    archiver = [str(BIN / "torch-model-archiver"), "--version", "1.0", "--export-path", str(out), "--force"]
    cat_dog_files = ["--handler", str(HERE / "vision_cat_dog_handler.py"), "--serialized-file", str(out / "cat_dog.pt")]
    run([*archiver, "--model-name", "cat_dog", *cat_dog_files])
    breed_files = ["--handler", str(HERE / "vision_breed_handler.py"), "--serialized-file", str(out / "dog_breed.pt")]
    run([*archiver, "--model-name", "dog_breed", *breed_files, "--extra-files", str(out / "index_to_name.json")])
    (out / "vision_join.yaml").write_text(SPEC)
    workflow = [str(BIN / "torch-workflow-archiver"), "--workflow-name", "vision_join", "--spec-file", str(out / "vision_join.yaml")]
    run([*workflow, "--handler", str(HERE / "vision_functions.py"), "--export-path", str(out), "--force"])
    print(f"built cat_dog.mar, dog_breed.mar, vision_join.war and {len(PHOTOS)} photos ({sum(dogs)} of them dogs) in {out}")
    return out / "vision_join.war"


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("vision_join"))
