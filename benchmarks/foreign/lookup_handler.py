"""A user's node that waits, not computes (never imports segserve): per row, a call to another service, stood in for
by a 25 ms sleep, then a small JSON answer about the seg node's FP16 logits [classes, 256, 448]. Such a node needs
many workers to keep up, and each of them costs little in a workflow: what `segserve fuse` cannot give it alone."""

import json
import time

import numpy as np

CLASSES, HEIGHT, WIDTH = 2, 256, 448
REMOTE_CALL_S = 0.025


def handle(data, context):
    if data is None:  # TorchServe's load-time call
        return None
    answers = []
    for row in data:
        logits = np.frombuffer(bytes(row.get("data") or row.get("body")), dtype=np.float16).reshape(CLASSES, HEIGHT, WIDTH)
        time.sleep(REMOTE_CALL_S)  # the call to another service, one row at a time
        answers.append(json.dumps({"foreground": round(float((logits.argmax(0) == 1).mean()), 4)}))
    return answers
