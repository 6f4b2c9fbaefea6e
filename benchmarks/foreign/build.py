"""Build the seed-style archives a TorchServe user would have, with the official archivers, into a folder:
seg.mar (a TorchScript network with random weights behind seg_handler.py), jpeg.mar (jpeg_handler.py),
seed.war (seg → jpeg), and the bodies to send: raw FP16 images, and FP16 logits for jpeg.mar alone. Beside them
lookup.mar (lookup_handler.py: waits 25 ms a row on a stand-in remote call) and lookup.war (seg → lookup, 2 seg
workers and 8 lookup workers): a slow node that needs more workers than the others (docs/serving.md, when
fusing helps and when it does not). And seed_join.war, a join in TorchServe's dog-breed shape: the function node
pre_processing (join_functions.py) → [seg, overlay], seg → [overlay]; overlay.mar (overlay_handler.py) gets each
row's image and seg's logits, one entry per parent.

    .venv/bin/python benchmarks/foreign/build.py /tmp/seed_archives
    cd /tmp/seed_archives && segserve bench <repo>/benchmarks/foreign/seed.yaml --results <repo>/results
"""

import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent


# the seed's registration: one worker each, batch 8, 5 ms
SEED_SPEC = """models:
  min-workers: 1
  max-workers: 1
  batch-size: 8
  max-batch-delay: 5
  seg: {url: seg.mar}
  jpeg: {url: jpeg.mar}
dag:
  seg: [jpeg]
"""


# a slow node that needs more workers than the others: 8 lookup workers (they wait), 2 seg workers (they compute)
LOOKUP_SPEC = """models:
  min-workers: 1
  max-workers: 1
  batch-size: 8
  max-batch-delay: 5
  seg: {url: seg.mar, min-workers: 2, max-workers: 2}
  lookup: {url: lookup.mar, min-workers: 8, max-workers: 8}
dag:
  seg: [lookup]
"""


# a join (TorchServe's dog-breed shape): a function node first, seg, and overlay joining both (image + logits)
JOIN_SPEC = """models:
  min-workers: 1
  max-workers: 1
  batch-size: 8
  max-batch-delay: 5
  seg: {url: seg.mar}
  overlay: {url: overlay.mar}
dag:
  pre_processing: [seg, overlay]
  seg: [overlay]
"""


def network() -> torch.nn.Module:
    """About the cost of segserve's SegNet: a strided encoder, a 1×1 head, upsampled back to the input size."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, stride=2, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(32, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(32, 2, 1),
        torch.nn.Upsample(scale_factor=4, mode="bilinear"),
    ).eval()


def run(command: list[str]) -> None:
    subprocess.run(command, check=True, capture_output=True)


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model = network()
    torch.jit.script(model).save(str(out / "seg.pt"))
    archiver = [str(BIN / "torch-model-archiver"), "--version", "1.0", "--export-path", str(out), "--force"]
    run([*archiver, "--model-name", "seg", "--handler", str(HERE / "seg_handler.py"), "--serialized-file", str(out / "seg.pt")])
    run([*archiver, "--model-name", "jpeg", "--handler", str(HERE / "jpeg_handler.py")])
    run([*archiver, "--model-name", "lookup", "--handler", str(HERE / "lookup_handler.py")])
    run([*archiver, "--model-name", "overlay", "--handler", str(HERE / "overlay_handler.py")])
    spec = out / "seed.yaml"
    spec.write_text(SEED_SPEC)
    (out / "seed_functions.py").write_text("")
    workflow = [str(BIN / "torch-workflow-archiver"), "--workflow-name", "seed", "--spec-file", str(spec)]
    run([*workflow, "--handler", str(out / "seed_functions.py"), "--export-path", str(out), "--force"])
    (out / "lookup.yaml").write_text(LOOKUP_SPEC)
    lookup = [str(BIN / "torch-workflow-archiver"), "--workflow-name", "lookup", "--spec-file", str(out / "lookup.yaml")]
    run([*lookup, "--handler", str(out / "seed_functions.py"), "--export-path", str(out), "--force"])
    (out / "seed_join.yaml").write_text(JOIN_SPEC)
    join = [str(BIN / "torch-workflow-archiver"), "--workflow-name", "seed_join", "--spec-file", str(out / "seed_join.yaml")]
    run([*join, "--handler", str(HERE / "join_functions.py"), "--export-path", str(out), "--force"])
    # what jpeg.mar gets inside the workflow: seg's answers for the same images (the bench sends these alone)
    for index in range(4):
        image = torch.randn((3, 256, 448), generator=torch.Generator().manual_seed(index)).half()
        (out / f"image_{index}.bin").write_bytes(image.view(torch.uint8).numpy().tobytes())
        with torch.inference_mode():
            logits = model(image.float()[None])[0].half()
        (out / f"logits_{index}.bin").write_bytes(logits.contiguous().view(torch.uint8).numpy().tobytes())
    print(f"built seg.mar, jpeg.mar, seed.war, lookup.mar, lookup.war, overlay.mar, seed_join.war and the bodies in {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("seed_archives"))
