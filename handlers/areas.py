"""Class areas: class map in, a JSON object out — pixels per class and each class's bounding box.

A second leaf beside the JPEG node in a fan-out DAG (workflows/seg_fanout.yaml). TorchServe
answers a DAG with several leaves with one JSON object keyed by leaf, which it builds by parsing
each leaf's output as a JSON object: so this node, like every leaf of such a DAG, answers JSON.
Counts are integers (no float formatting to differ between the workflow and the fused pipeline).
"""

import json
from dataclasses import dataclass

import torch

from handlers import classmap
from handlers.base import SegserveHandler, entry_point
from handlers.jpeg import ClassMapInput
from handlers.settings import parse_settings


@dataclass
class AreasSettings:
    max_image_pixels: int = 25_000_000


class AreasHandler(ClassMapInput, SegserveHandler):
    content_type = "application/json"

    def load(self, model_dir: str, settings: dict, manifest: dict) -> None:
        self.settings = parse_settings(AreasSettings, settings)

    @torch.inference_mode()
    def predict(self, items: list[classmap.ClassMap]) -> list[dict]:
        return [areas(item) for item in items]

    def encode(self, result: dict) -> bytes:
        return json.dumps(result).encode()


def areas(class_map: classmap.ClassMap) -> dict:
    """Pixels per class at the map's resolution; boxes [x0, y0, x1, y1) scaled to the original image.
    One pass over the pixels whatever the number of classes (a pass per class took 12 s on a 4000×4000 map)."""
    labels = classmap.labels_for(class_map, torch.device("cpu")).long()  # one copy if on the GPU, then CPU counting
    height, width = labels.shape
    counts = torch.bincount(labels.flatten(), minlength=class_map.num_classes).tolist()
    in_row = torch.zeros(len(counts), height, dtype=torch.bool)
    in_column = torch.zeros(len(counts), width, dtype=torch.bool)
    in_row[labels, torch.arange(height)[:, None]] = True
    in_column[labels, torch.arange(width)[None, :]] = True
    boxes = {}
    for label in range(len(counts)):
        if counts[label] == 0:
            continue
        rows, cols = in_row[label].nonzero().flatten(), in_column[label].nonzero().flatten()
        x0, x1 = int(cols[0]), int(cols[-1]) + 1
        y0, y1 = int(rows[0]), int(rows[-1]) + 1
        scale_x, scale_y = class_map.original_width, class_map.original_height
        boxes[str(label)] = [x0 * scale_x // width, y0 * scale_y // height, -(-x1 * scale_x // width), -(-y1 * scale_y // height)]
    return {
        "map_size": [height, width],
        "original_size": [class_map.original_height, class_map.original_width],
        "pixels": counts,
        "boxes": boxes,
    }


handle = entry_point(AreasHandler)
