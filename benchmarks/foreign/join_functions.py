"""The function node of the join workflow (never imports segserve): the start node TorchServe's DAG needs, handing
the request's body on unchanged to both of its children (as TorchServe's dog-breed example's pre_processing does)."""


def pre_processing(data, context):
    if data is None:  # TorchServe's load-time call
        return None
    return [bytes(row.get("data") or row.get("body")) for row in data]
