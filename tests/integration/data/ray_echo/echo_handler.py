"""A handler that answers what TorchServe's worker hands it (for the Ray engine's tests): each row's parameters and
their decoded types, the context's system properties (but the model folder's path), the manifest's model name,
whether it runs from its model folder, and the request headers it was asked to show. Marker rows: `teapot` answers
418 with a header of its own, `fail` fails the whole batch (TorchServe's 503), `bytes` answers raw bytes; a request
with an x-show-batch header is told its batch's size."""

import json
import os
import sys


class Echo:
    def initialize(self, context):
        self.context = context

    def handle(self, data, context):
        props = dict(context.system_properties)
        model_dir = props.pop("model_dir")
        answers = []
        for idx, row in enumerate(data):
            body = row.get("body")
            if body in (b"fail", bytearray(b"fail"), "fail"):
                raise ValueError("asked to fail")
            if body in (b"bytes", bytearray(b"bytes")):
                context.set_response_content_type(idx, "application/octet-stream")
                answers.append(bytes(range(256)))
                continue
            if body in (b"teapot", bytearray(b"teapot")):
                context.set_response_status(418, "I'm a teapot", idx)
                context.set_response_header(idx, "x-marker", "teapot")
            headers = {k.lower(): v for k, v in context.get_all_request_header(idx).items()}
            shown = [name.strip().lower() for name in headers.get("x-show", "").split(",") if name.strip()]
            answers.append(
                {
                    "row": {
                        name: [type(value).__name__, value if isinstance(value, (str, dict, list, int)) else bytes(value).hex()]
                        for name, value in row.items()
                    },
                    "properties": props,
                    "model_name": context.manifest["model"]["modelName"],
                    "from_model_dir": os.getcwd() == model_dir and model_dir in sys.path,
                    "request_id_set": bool(context.get_request_id(idx)),
                    "headers": {name: headers.get(name) for name in shown},
                }
            )
            if "x-show-batch" in headers:  # how many rows came with it (the batching test; timing makes it vary)
                answers[-1]["batch"] = len(data)
            context.set_response_content_type(idx, "application/json")
        return [json.dumps(a, sort_keys=True) if isinstance(a, dict) else a for a in answers]
