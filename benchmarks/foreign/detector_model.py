"""The model file of object_detector.mar (build_builtin_vision.py builds it). TorchServe's `object_detector` handler
loads an eager model the documented way: the one class this file defines, built with no arguments, then the
archive's state dict. torchvision's Faster R-CNN MobileNetV3-Large 320 FPN for classes of our own (the archive's
index_to_name.json), nothing downloaded (weights=None, weights_backbone=None)."""

import torch
from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

# background and the three shapes of segserve/model/synthetic.py (index_to_name.json names them)
NAMES = ("background", "ellipse", "rectangle", "triangle")


class ShapeDetector(torch.nn.Module):
    def __init__(self):
        super().__init__()
        # torchvision's own thresholds (box_score_thresh 0.05): the handler keeps the boxes scored 0.5 or more
        self.network = fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None, num_classes=len(NAMES))

    def forward(self, images):
        return self.network(images)
