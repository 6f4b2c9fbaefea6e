"""The function node of the vision join (never imports segserve): the start node TorchServe's DAG needs. As
TorchServe's dog-breed example's pre_processing does, it base64-encodes each request's image, so that its answer is
text the frontend hands on to both children."""

import base64


def pre_processing(data, context):
    if data is None:  # TorchServe's load-time call
        return None
    return [base64.b64encode(bytes(row.get("data") or row.get("body"))).decode() for row in data]
