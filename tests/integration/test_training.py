"""Synthetic data and training: reproducible from seeds."""

import json

import torch

from segserve.model.train import TrainSettings, train


def test_training_is_deterministic_and_reports_held_out_iou(tmp_path):
    tiny = TrainSettings(train_images=4, steps=3, batch_size=2, crop_height=64, crop_width=64, held_out_images=2)
    first = train(tmp_path / "a.pt", tiny, log=lambda _: None)
    second = train(tmp_path / "b.pt", tiny, log=lambda _: None)
    a, b = torch.load(tmp_path / "a.pt"), torch.load(tmp_path / "b.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    report = json.loads((tmp_path / "a.pt").with_suffix(".json").read_text())
    assert 0 <= report["held_out_foreground_iou"] <= 1
    assert report["held_out_foreground_iou"] == first["held_out_foreground_iou"] == second["held_out_foreground_iou"]
