"""Build image_segmenter.mar: TorchServe's own built-in `image_segmenter` handler (ts/torch_handler/image_segmenter.py,
named by the archive, no handler file of ours) around torchvision's LR-ASPP MobileNetV3-Large as TorchScript, with
random weights (weights=None, weights_backbone=None: nothing is downloaded). A user's archive made the documented way
(torch-model-archiver --handler image_segmenter); the handler imports captum, which segserve's install_requires
brings, so it serves after `make setup` alone:

    .venv/bin/python benchmarks/foreign/build_image_segmenter.py /tmp/segmenter_archive && cd /tmp/segmenter_archive
    <repo>/.venv/bin/segserve bench <repo>/benchmarks/foreign/image_segmenter.yaml --results <repo>/results
"""

import subprocess
import sys
import tempfile
from pathlib import Path

BIN = Path(sys.executable).parent


def main(out: Path) -> Path:
    import torch
    from torchvision.models.segmentation import lraspp_mobilenet_v3_large

    # torch-model-archiver stages an archive's files in <temp dir>/<model name> and deletes that folder after
    if out.resolve() == (Path(tempfile.gettempdir()) / "image_segmenter").resolve():
        raise SystemExit(f"{out}: torch-model-archiver stages image_segmenter.mar's files there and deletes it: choose another folder")
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    network = lraspp_mobilenet_v3_large(weights=None, weights_backbone=None).eval()
    # the handler's postprocess reads the model's answer as a dict's "out" entry: scripting keeps it one
    torch.jit.script(network).save(str(out / "lraspp.pt"))
    archiver = [str(BIN / "torch-model-archiver"), "--model-name", "image_segmenter", "--version", "1.0", "--handler", "image_segmenter"]
    archiver += ["--serialized-file", str(out / "lraspp.pt"), "--export-path", str(out), "--force"]
    subprocess.run(archiver, check=True, capture_output=True)
    print(f"built {out / 'image_segmenter.mar'} (TorchServe's image_segmenter handler, LR-ASPP MobileNetV3 as TorchScript)")
    return out / "image_segmenter.mar"


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("segmenter_archive"))
