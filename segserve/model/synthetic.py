"""Synthetic segmentation data: coloured shapes on textured backgrounds, with exact masks.

Foreground shapes are saturated colours with a mild texture of their own;
backgrounds are low-saturation textures (noise, stripes, checks, gradients).
Every image is a pure function of its seed, so a data set is reproducible
anywhere and a held-out set is simply a different range of seeds.
"""

import math

import torch

HEIGHT, WIDTH = 256, 448


def _value_noise(gen: torch.Generator, height: int, width: int, cells: int) -> torch.Tensor:
    """Smooth noise in [0, 1]: a coarse random grid upsampled bilinearly."""
    grid = torch.rand(1, 1, cells, max(2, cells * width // height), generator=gen)
    up = torch.nn.functional.interpolate(grid, size=(height, width), mode="bilinear", align_corners=False)
    return up[0, 0]


def _texture(gen: torch.Generator, height: int, width: int) -> torch.Tensor:
    """One of four texture kinds, values roughly in [-1, 1]."""
    ys, xs = torch.meshgrid(torch.arange(height, dtype=torch.float32), torch.arange(width, dtype=torch.float32), indexing="ij")
    kind = int(torch.randint(0, 4, (1,), generator=gen))
    if kind == 0:
        return _value_noise(gen, height, width, int(torch.randint(4, 40, (1,), generator=gen))) * 2 - 1
    angle = float(torch.rand(1, generator=gen)) * math.pi
    period = 4 + float(torch.rand(1, generator=gen)) * 28
    if kind == 1:
        return torch.sin((xs * math.cos(angle) + ys * math.sin(angle)) * 2 * math.pi / period)
    if kind == 2:
        cell = int(period)
        return (((ys // cell) + (xs // cell)) % 2) * 2 - 1
    return (xs * math.cos(angle) + ys * math.sin(angle)) / max(height, width) * 2 - 1


def _hsv_to_rgb(hue: float, sat: float, val: float) -> torch.Tensor:
    k = torch.tensor([5.0, 3.0, 1.0])
    k = (k + hue * 6) % 6
    return val - val * sat * torch.clamp(torch.minimum(k, 4 - k), 0, 1)


def _shape_mask(gen: torch.Generator, height: int, width: int) -> torch.Tensor:
    """A filled ellipse, rotated rectangle or triangle; size 25–110 px across half-axes."""
    ys, xs = torch.meshgrid(torch.arange(height, dtype=torch.float32) + 0.5, torch.arange(width, dtype=torch.float32) + 0.5, indexing="ij")
    r = lambda lo, hi: lo + float(torch.rand(1, generator=gen)) * (hi - lo)  # noqa: E731
    cy, cx = r(0, height), r(0, width)
    a, b, angle = r(25, 110), r(25, 90), r(0, math.pi)
    u = (xs - cx) * math.cos(angle) + (ys - cy) * math.sin(angle)
    v = -(xs - cx) * math.sin(angle) + (ys - cy) * math.cos(angle)
    kind = int(torch.randint(0, 3, (1,), generator=gen))
    if kind == 0:
        return (u / a) ** 2 + (v / b) ** 2 <= 1
    if kind == 1:
        return (u.abs() <= a) & (v.abs() <= b)
    # Triangle: inside all three half-planes of an isoceles triangle in (u, v).
    return (v >= -b) & (2 * b * u <= a * (b - v)) & (-2 * b * u <= a * (b - v))


def make_sample(seed: int, height: int = HEIGHT, width: int = WIDTH) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (image uint8 [3, H, W], mask uint8 [H, W] with 1 = foreground) for a seed."""
    gen = torch.Generator().manual_seed(seed)
    gray = 0.2 + 0.6 * float(torch.rand(1, generator=gen))
    tint = _hsv_to_rgb(float(torch.rand(1, generator=gen)), 0.15 * float(torch.rand(1, generator=gen)), 1.0)
    amplitude = 0.05 + 0.2 * float(torch.rand(1, generator=gen))
    image = (gray + amplitude * _texture(gen, height, width))[None] * tint[:, None, None]
    mask = torch.zeros(height, width, dtype=torch.bool)
    for _ in range(int(torch.randint(1, 4, (1,), generator=gen))):
        shape = _shape_mask(gen, height, width)
        colour = _hsv_to_rgb(
            float(torch.rand(1, generator=gen)),
            0.55 + 0.45 * float(torch.rand(1, generator=gen)),
            0.45 + 0.55 * float(torch.rand(1, generator=gen)),
        )
        shade = 1 + 0.15 * _texture(gen, height, width)
        image = torch.where(shape, colour[:, None, None] * shade, image)
        mask |= shape
    image = image + 0.02 * torch.randn(image.shape, generator=gen)
    return (image.clamp(0, 1) * 255).round().to(torch.uint8), mask.to(torch.uint8)
