"""The vision join's join node (never imports segserve): TorchServe's own ImageClassifier, as the dog-breed
example's dog_breed_classification node uses it. TorchServe hands it one entry per parent, read as
row.get("<parent name>"): pre_processing's base64 image and cat_dog's "cat" or "dog". It classifies the dogs (the
class's top 5 of index_to_name.json, as JSON) and answers "It's a cat!" for the cats; which rows are dogs is kept on
self from preprocess to postprocess, as the example keeps it."""

import base64
import io

import torch
from PIL import Image
from ts.torch_handler.image_classifier import ImageClassifier


class BreedClassifier(ImageClassifier):
    def preprocess(self, data):
        self.is_dogs = [bytes(row.get("cat_dog")).decode() == "dog" for row in data]
        images = []
        for row, is_dog in zip(data, self.is_dogs, strict=True):
            if is_dog:
                image = Image.open(io.BytesIO(base64.b64decode(bytes(row.get("pre_processing")))))
                images.append(self.image_processing(image.convert("RGB")))
        return torch.stack(images).to(self.device) if images else None

    def inference(self, data, *args, **kwargs):
        return None if data is None else super().inference(data, *args, **kwargs)

    def postprocess(self, data):
        breeds = iter([] if data is None else super().postprocess(data))
        return [next(breeds) if is_dog else "It's a cat!" for is_dog in self.is_dogs]
