"""Train the segmentation network on synthetic data, deterministically, on the CPU.

Images are generated once at full size; training takes random half-size
crops (same pixel scale as serving) with flips, so a few hundred images are
enough. The held-out set uses seeds that training never sees.
"""

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from handlers.segnet import DEFAULT_BACKBONE, MEAN_RGB, STD_RGB, SegNet
from segserve.model.synthetic import HEIGHT, WIDTH, make_sample

HELD_OUT_SEED_BASE = 1_000_000


@dataclass
class TrainSettings:
    backbone: str = DEFAULT_BACKBONE
    num_classes: int = 2
    train_images: int = 480
    steps: int = 700
    batch_size: int = 16
    crop_height: int = HEIGHT // 2
    crop_width: int = WIDTH // 2
    learning_rate: float = 3e-3
    seed: int = 0
    threads: int = 2
    held_out_images: int = 64


def normalise(images_uint8: torch.Tensor) -> torch.Tensor:
    """uint8 [N, 3, H, W] → float input the network expects (the handler does the same)."""
    mean = torch.tensor(MEAN_RGB).view(1, 3, 1, 1)
    std = torch.tensor(STD_RGB).view(1, 3, 1, 1)
    return (images_uint8.float() / 255 - mean) / std


def _dataset(seeds: range) -> tuple[torch.Tensor, torch.Tensor]:
    pairs = [make_sample(s) for s in seeds]
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


def _random_batch(images, masks, settings: TrainSettings, gen: torch.Generator):
    idx = torch.randint(0, len(images), (settings.batch_size,), generator=gen)
    top = torch.randint(0, HEIGHT - settings.crop_height + 1, (settings.batch_size,), generator=gen)
    left = torch.randint(0, WIDTH - settings.crop_width + 1, (settings.batch_size,), generator=gen)
    flip = torch.rand(settings.batch_size, generator=gen) < 0.5
    xs, ys = [], []
    for i, y0, x0, mirror in zip(idx.tolist(), top.tolist(), left.tolist(), flip.tolist(), strict=True):
        x = images[i, :, y0 : y0 + settings.crop_height, x0 : x0 + settings.crop_width]
        y = masks[i, y0 : y0 + settings.crop_height, x0 : x0 + settings.crop_width]
        xs.append(x.flip(-1) if mirror else x)
        ys.append(y.flip(-1) if mirror else y)
    return normalise(torch.stack(xs)), torch.stack(ys).long()


@torch.inference_mode()
def foreground_iou(model: torch.nn.Module, images: torch.Tensor, masks: torch.Tensor, batch_size: int = 8) -> float:
    """Dataset-level IoU of class 1: total intersection over total union."""
    model.eval()
    inter = union = 0
    for start in range(0, len(images), batch_size):
        pred = model(normalise(images[start : start + batch_size])).argmax(1) == 1
        truth = masks[start : start + batch_size] == 1
        inter += int((pred & truth).sum())
        union += int((pred | truth).sum())
    return inter / max(union, 1)


def train(weights_path: Path, settings: TrainSettings = TrainSettings(), log=print) -> dict:
    """Train, evaluate on the held-out set, save a state_dict and a JSON report beside it."""
    torch.manual_seed(settings.seed)
    torch.set_num_threads(settings.threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    started = time.perf_counter()
    log(f"generating {settings.train_images} synthetic training images …")
    images, masks = _dataset(range(settings.seed * 100_000, settings.seed * 100_000 + settings.train_images))
    model = SegNet(settings.num_classes, settings.backbone).to(memory_format=torch.channels_last)
    optimiser = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, settings.learning_rate, total_steps=settings.steps, pct_start=0.1)
    gen = torch.Generator().manual_seed(settings.seed)
    model.train()
    for step in range(1, settings.steps + 1):
        x, y = _random_batch(images, masks, settings, gen)
        loss = F.cross_entropy(model(x.contiguous(memory_format=torch.channels_last)), y)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        schedule.step()
        if step % 50 == 0 or step == settings.steps:
            elapsed = time.perf_counter() - started
            eta = elapsed / step * (settings.steps - step)
            log(f"step {step}/{settings.steps}  loss {loss.item():.4f}  {elapsed:.0f}s elapsed, ~{eta:.0f}s left")
    held_out = _dataset(range(HELD_OUT_SEED_BASE, HELD_OUT_SEED_BASE + settings.held_out_images))
    iou = foreground_iou(model, *held_out)
    report = {**asdict(settings), "held_out_foreground_iou": round(iou, 4), "train_seconds": round(time.perf_counter() - started, 1)}
    weights_path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), weights_path)
    weights_path.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    log(f"held-out foreground IoU {iou:.4f}; weights saved to {weights_path}")
    return report
