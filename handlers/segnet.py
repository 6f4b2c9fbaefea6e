"""The segmentation network: a MobileNetV3 backbone with an LR-ASPP head.

Built from torchvision parts only, so an archive that carries a state_dict
can rebuild the network with nothing but torchvision installed.
"""

import handlers.light_torchvision  # noqa: F401 (first, before torchvision: see there)

# isort: split
import torch
from torch import nn
from torchvision.models import mobilenet_v3_large, mobilenet_v3_small
from torchvision.models._utils import IntermediateLayerGetter
from torchvision.models.segmentation.lraspp import LRASPP

BACKBONES = {"mobilenet_v3_small": mobilenet_v3_small, "mobilenet_v3_large": mobilenet_v3_large}
DEFAULT_BACKBONE = "mobilenet_v3_small"

# Inputs are normalised with the ImageNet statistics, as torchvision's backbones expect.
MEAN_RGB = (0.485, 0.456, 0.406)
STD_RGB = (0.229, 0.224, 0.225)


class SegNet(nn.Module):
    """Fully convolutional: logits [N, classes, H, W] for input [N, 3, H, W]."""

    def __init__(self, num_classes: int = 2, backbone: str = DEFAULT_BACKBONE):
        super().__init__()
        if backbone not in BACKBONES:
            raise ValueError(f"backbone {backbone!r} is not one of {sorted(BACKBONES)}")
        # dilated=True keeps the last stage at 1/16 resolution, as torchvision's LR-ASPP does.
        features = BACKBONES[backbone](weights=None, dilated=True).features
        stage_ends = [0] + [i for i, block in enumerate(features) if getattr(block, "_is_cn", False)]
        low_index, high_index = stage_ends[-3], len(features) - 1
        layers = IntermediateLayerGetter(features, return_layers={str(low_index): "low", str(high_index): "high"})
        self.lraspp = LRASPP(
            layers,
            low_channels=features[low_index].out_channels,
            high_channels=features[high_index].out_channels,
            num_classes=num_classes,
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.lraspp(images)["out"]
