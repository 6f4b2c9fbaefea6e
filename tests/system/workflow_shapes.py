"""Workflows of the shapes TorchServe's own examples use, written here (tests/system/test_fuse.py builds them with
the official archivers; nothing of pytorch/serve is copied): each a spec, its function file and its models' handlers.

dogbreed: a function node first, a join of it and a model node (`pre_processing → [animal, breed]`,
`animal → [breed]`), the join's handler keeping per-batch state on self between preprocess and postprocess and
answering text for some rows and a JSON dict for others; `animal` refuses a row in the middle, `breed` one at the leaf.

aggregate: fan-out from a function node to two models and an aggregating function node last, with a function node
in the middle (`split → [left, right]`, `left → [middle]`, `middle → [combine]`, `right → [combine]`); `right`
answers one row too many for the row "many", which fails its batch (batch size 1 there: stock TorchServe's batch-mates
of a failed row fail with it, or not, as they happen to batch with it when it is sent again).
"""

DOGBREED_SPEC = """
models:
  min-workers: 1
  max-workers: 1
  batch-size: 4
  max-batch-delay: 100
  # TorchServe 0.12 drops a fast node's answer now and then (docs/torchserve_workflows.md): asked again after 2 s
  timeout-ms: 2000
  retry-attempts: 2
  animal: {url: animal.mar}
  breed: {url: breed.mar}
dag:
  pre_processing: [animal, breed]
  animal: [breed]
"""

DOGBREED_FUNCTIONS = """
def pre_processing(data, context):
    if data is None:
        return None
    return [bytes(row.get("data") or row.get("body")).strip() for row in data]
"""

ANIMAL = """
def handle(data, context):
    if data is None:
        return None
    answers = []
    for i, row in enumerate(data):
        text = bytes(row["body"])
        if text == b"refuse":  # refused in the middle of the DAG
            context.set_response_status(400, "Bad Request", i)
            answers.append({"error": "not an animal"})
        else:
            answers.append("dog" if text.startswith(b"dog") else "cat")
    return answers
"""

BREED = '''
import hashlib


class DogBreed:
    """A join: one parameter per parent; which rows are dogs is kept on self from preprocess to postprocess."""

    def initialize(self, context):
        self.context = context

    def handle(self, data, context):
        return self.postprocess(self.inference(self.preprocess(data)))

    def preprocess(self, data):
        self.is_dogs = [bytes(row.get("animal")) == b"dog" for row in data]
        self.parents = [list(row) for row in data]
        self.animals = [bytes(row.get("animal")).decode() for row in data]
        self.dogs = [bytes(row.get("pre_processing")) for row, dog in zip(data, self.is_dogs) if dog]
        return self.dogs

    def inference(self, dogs):
        return [hashlib.sha256(dog).hexdigest()[:8] for dog in dogs]

    def postprocess(self, breeds):
        answers, dogs = [], iter(zip(self.dogs, breeds))
        for i, is_dog in enumerate(self.is_dogs):
            if not is_dog:
                answers.append(f"It's not a dog: {self.animals[i]}")
                continue
            dog, breed = next(dogs)
            if b"mutt" in dog:  # refused at the leaf
                self.context.set_response_status(422, "Unprocessable Entity", i)
                answers.append({"error": f"breed {breed} unknown"})
            else:
                length = self.context.get_request_header(i, "Content-Length")  # as the client spelled it
                headers = {"request_length": length, "animal": self.context.get_request_header(i, "animal")}
                answers.append({"breed": breed, "parents": self.parents[i], "headers": headers})
        return answers
'''

AGGREGATE_SPEC = """
models:
  min-workers: 1
  max-workers: 1
  batch-size: 4
  max-batch-delay: 100
  # TorchServe 0.12 drops a fast node's answer now and then (docs/torchserve_workflows.md): asked again after 2 s
  timeout-ms: 2000
  retry-attempts: 2
  left: {url: left.mar}
  right: {url: right.mar, batch-size: 1}
dag:
  split: [left, right]
  left: [middle]
  middle: [combine]
  right: [combine]
"""

AGGREGATE_FUNCTIONS = """
import json


def split(data, context):
    if data is None:
        return None
    return [bytes(row["body"]) for row in data]


def middle(data, context):
    if data is None:
        return None
    return [{"via": "middle", "left": json.loads(bytes(row["body"]))} for row in data]


def combine(data, context):
    if data is None:
        return None
    return [{"middle": json.loads(bytes(row["middle"])), "right": bytes(row["right"]).decode()} for row in data]
"""

LEFT = """
def handle(data, context):
    if data is None:
        return None
    return [{"upper": bytes(row["body"]).decode().upper(), "batch": len(data) > 0} for row in data]
"""

RIGHT = """
def handle(data, context):
    if data is None:
        return None
    answers = [bytes(row["body"])[::-1] for row in data]
    return answers + [b"one too many"] if b"many" in [bytes(row["body"]) for row in data] else answers
"""

# a model whose handler imports a module no environment has: fuse refuses it, naming the node
MISSING = "import segserve_tests_no_such_module\n\n\ndef handle(data, context):\n    return data\n"
