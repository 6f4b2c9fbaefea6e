"""The weights in weights/ are shipped so that `make run` needs no training: `segserve train` with the settings
their report records reproduces them. Bit for bit on a machine whose float kernels match the one they were trained on;
anywhere, the same answers: the retrained network agrees with the shipped one on nearly every held-out pixel."""

import json

import pytest
import torch

from handlers.segnet import SegNet
from segserve.model.accuracy import held_out
from segserve.model.train import TrainSettings, train
from tests.conftest import ROOT

SHIPPED = ROOT / "weights" / "seg.pt"


def network(path, settings: TrainSettings) -> torch.nn.Module:
    model = SegNet(settings.num_classes, settings.backbone)
    model.load_state_dict(torch.load(path, map_location="cpu"))
    return model.eval()


@pytest.mark.long
def test_segserve_train_reproduces_the_shipped_weights(tmp_path):
    report = json.loads(SHIPPED.with_suffix(".json").read_text())
    settings = TrainSettings(**{k: v for k, v in report.items() if k in TrainSettings.__dataclass_fields__})
    again = train(tmp_path / "seg.pt", settings, log=lambda _: None)
    assert again["held_out_foreground_iou"] == pytest.approx(report["held_out_foreground_iou"], abs=0.01)
    shipped, retrained = network(SHIPPED, settings), network(tmp_path / "seg.pt", settings)
    with torch.inference_mode():
        for images, _ in held_out(16, 256, 448):  # normalised, in batches
            agreement = (shipped(images).argmax(1) == retrained(images).argmax(1)).float().mean().item()
            assert agreement >= 0.99
