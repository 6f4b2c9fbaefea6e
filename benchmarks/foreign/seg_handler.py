"""A user's segmentation handler (never imports segserve): raw FP16 [3, 256, 448] in, FP16 logits out, as the
seed's clients and its JPEG node exchanged them."""

import torch
from ts.torch_handler.base_handler import BaseHandler

SHAPE = (3, 256, 448)


class RawSegmenter(BaseHandler):
    def preprocess(self, data):
        rows = [torch.frombuffer(bytearray(row.get("data") or row.get("body")), dtype=torch.float16) for row in data]
        return torch.stack([row.reshape(SHAPE) for row in rows]).float()

    def inference(self, data, *args, **kwargs):
        with torch.inference_mode():
            return self.model(data)

    def postprocess(self, logits):
        return [row.half().contiguous().view(torch.uint8).numpy().tobytes() for row in logits]
