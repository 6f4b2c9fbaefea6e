"""Synthetic data and training: reproducible from seeds."""

import torch

from segserve.model.synthetic import make_sample


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
