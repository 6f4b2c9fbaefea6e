"""Synthetic data and training: reproducible from seeds."""

import json

import torch

from segserve.model.synthetic import make_sample
from segserve.model.train import TrainSettings, train


def test_samples_are_a_pure_function_of_the_seed():
    image, mask = make_sample(7)
    again_image, again_mask = make_sample(7)
    other_image, _ = make_sample(8)
    assert image.dtype == torch.uint8 and image.shape == (3, 256, 448) and mask.shape == (256, 448)
    assert torch.equal(image, again_image) and torch.equal(mask, again_mask)
    assert not torch.equal(image, other_image)
    assert 0 < mask.float().mean() < 1


def test_foreground_is_saturated_and_background_is_not():
    image, mask = make_sample(11)
    rgb = image.float()
    saturation = (rgb.max(0).values - rgb.min(0).values) / rgb.max(0).values.clamp(min=1)
    assert saturation[mask == 1].median() > 0.4 > saturation[mask == 0].median()


def test_training_is_deterministic_and_reports_held_out_iou(tmp_path):
    tiny = TrainSettings(train_images=4, steps=3, batch_size=2, crop_height=64, crop_width=64, held_out_images=2)
    first = train(tmp_path / "a.pt", tiny, log=lambda _: None)
    second = train(tmp_path / "b.pt", tiny, log=lambda _: None)
    a, b = torch.load(tmp_path / "a.pt"), torch.load(tmp_path / "b.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    report = json.loads((tmp_path / "a.pt").with_suffix(".json").read_text())
    assert 0 <= report["held_out_foreground_iou"] <= 1
    assert report["held_out_foreground_iou"] == first["held_out_foreground_iou"] == second["held_out_foreground_iou"]
