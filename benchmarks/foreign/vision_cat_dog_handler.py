"""The vision join's first model node (never imports segserve): TorchServe's own ImageClassifier
(ts.torch_handler.image_classifier) with the class's transforms, model loading and inference, as the dog-breed
example's cat_dog_classification node uses it: pre_processing's base64 text in, "cat" or "dog" out. Unlike the
example, each image is made RGB before the class's transforms: their Normalize takes 3 channels, so the example's
node fails a grayscale JPEG."""

import base64
import io

import torch
from PIL import Image
from ts.torch_handler.image_classifier import ImageClassifier

LABELS = ["cat", "dog"]


class CatDogClassifier(ImageClassifier):
    def preprocess(self, data):
        images = []
        for row in data:
            image = Image.open(io.BytesIO(base64.b64decode(bytes(row.get("data") or row.get("body")))))
            images.append(self.image_processing(image.convert("RGB")))
        return torch.stack(images).to(self.device)

    def postprocess(self, data):
        return [LABELS[int(scores.argmax())] for scores in data]
