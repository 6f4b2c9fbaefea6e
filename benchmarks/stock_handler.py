"""A stock TorchServe handler for segserve's segmentation model: the baseline segserve is compared against.

Written the way TorchServe's own examples write a handler (a BaseHandler subclass with
initialize / preprocess / inference / postprocess, PIL for decoding and encoding,
torchvision transforms), with none of segserve's optimisations: one request at a time
in use (batch size 1, though any batch works), TorchServe's default worker count and
torch's default thread count. It serves the same weights (weights/seg.pt) and answers
with a JPEG class map (class 0 black, class 1 white) at the request image's size, as segserve does.

The archive carries only this file and the weights, so the network definition is copied
from handlers/segnet.py below. Start it with `python benchmarks/stock_server.py`, which
archives this handler with torch-model-archiver and serves it on stock TorchServe; compare
with `segserve bench benchmarks/stock.yaml`.
"""

import io
import logging
import os
import zipfile

import numpy as np
import torch
import torchvision.transforms.functional as F
from PIL import Image
from torch import nn
from torchvision.models import mobilenet_v3_large, mobilenet_v3_small
from torchvision.models._utils import IntermediateLayerGetter
from torchvision.models.segmentation.lraspp import LRASPP
from ts.torch_handler.base_handler import BaseHandler

logger = logging.getLogger(__name__)

# The network's input size, as segserve serves it.
INPUT_WIDTH, INPUT_HEIGHT = 448, 256
MEAN_RGB = (0.485, 0.456, 0.406)
STD_RGB = (0.229, 0.224, 0.225)
# One RGB colour per class: background black, foreground white.
PALETTE = np.array([[0, 0, 0], [255, 255, 255]], dtype=np.uint8)

# --- copied from handlers/segnet.py -------------------------------------------------------------
# TorchServe takes the one class defined at module level in a handler file as the handler, so the
# network class is defined inside a function here.

BACKBONES = {"mobilenet_v3_small": mobilenet_v3_small, "mobilenet_v3_large": mobilenet_v3_large}
DEFAULT_BACKBONE = "mobilenet_v3_small"


def build_segnet(num_classes: int = 2, backbone: str = DEFAULT_BACKBONE) -> nn.Module:
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

    return SegNet(num_classes, backbone)


# --- end of copy ---------------------------------------------------------------------------------


class StockSegmentationHandler(BaseHandler):
    """JPEG/PNG in, JPEG class map out, one response per request in the batch."""

    def initialize(self, context):
        properties = context.system_properties
        if torch.cuda.is_available() and properties.get("gpu_id") is not None:
            self.map_location = "cuda"
            self.device = torch.device(f"cuda:{properties.get('gpu_id')}")
        else:
            self.map_location = "cpu"
            self.device = torch.device("cpu")
        self.manifest = context.manifest
        model_dir = properties.get("model_dir")
        self.model_pt_path = os.path.join(model_dir, self.manifest["model"]["serializedFile"])

        # A TorchScript archive holds constants.pkl; a state_dict saved with torch.save does not.
        with zipfile.ZipFile(self.model_pt_path) as archive:
            is_torchscript = any(name.endswith("constants.pkl") for name in archive.namelist())
        if is_torchscript:
            self.model = torch.jit.load(self.model_pt_path, map_location=self.device)
        else:
            self.model = build_segnet(num_classes=2, backbone="mobilenet_v3_small")
            self.model.load_state_dict(torch.load(self.model_pt_path, map_location=self.device, weights_only=True))
        self.model.to(self.device)
        self.model.eval()
        logger.info("Loaded %s (%s) on %s", self.model_pt_path, "TorchScript" if is_torchscript else "state_dict", self.device)
        self.initialized = True

    def preprocess(self, data):
        images = []
        self.original_sizes = []  # (width, height) of each request's image: the answer has its size
        for row in data:
            image = row.get("data") or row.get("body")
            image = Image.open(io.BytesIO(image)).convert("RGB")
            self.original_sizes.append(image.size)
            image = image.resize((INPUT_WIDTH, INPUT_HEIGHT))
            tensor = F.to_tensor(image)
            tensor = F.normalize(tensor, mean=MEAN_RGB, std=STD_RGB)
            images.append(tensor)
        return torch.stack(images).to(self.device)

    def inference(self, data, *args, **kwargs):
        with torch.no_grad():
            logits = self.model(data)
        return logits.argmax(dim=1).to(torch.uint8)

    def postprocess(self, data):
        responses = []
        for index, class_map in enumerate(data.cpu().numpy()):
            buffer = io.BytesIO()
            mask = Image.fromarray(PALETTE[class_map]).resize(self.original_sizes[index], Image.NEAREST)
            mask.save(buffer, "JPEG", quality=90)
            responses.append(buffer.getvalue())
            self.context.set_response_content_type(index, "image/jpeg")
        return responses
