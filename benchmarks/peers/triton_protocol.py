"""One JPEG as a Triton (KServe v2) HTTP inference request with the binary-tensor extension, and the JPEG out of
its answer. Standard library only: the benchmark and the tests import it from the project venv.

Request: POST /v2/models/seg_jpeg/infer, header `Inference-Header-Content-Length: 256`, body = a JSON header padded
with spaces to exactly 256 bytes, then the input's binary data: one BYTES element, a 4-byte little-endian length
then the JPEG. The input `image` is [1, 1]: a batch of one [1]-shaped element (the model's max_batch_size > 0 adds
the batch dimension). The answer's output `jpeg` comes back binary the same way.
"""

import json
import struct

MODEL = "seg_jpeg"
INFER_PATH = f"/v2/models/{MODEL}/infer"
READY_PATH = "/v2/health/ready"
HEADER_BYTES = 256  # fixed, so that a client can send the header as a constant prefix
LENGTH_HEADER = "Inference-Header-Content-Length"


def triton_request(jpeg: bytes) -> tuple[dict, bytes]:
    """(HTTP headers, body) of one inference request carrying `jpeg` as the `image` input."""
    element = struct.pack("<I", len(jpeg)) + jpeg
    header = {
        "inputs": [{"name": "image", "shape": [1, 1], "datatype": "BYTES", "parameters": {"binary_data_size": len(element)}}],
        "outputs": [{"name": "jpeg", "parameters": {"binary_data": True}}],
    }
    text = json.dumps(header, separators=(",", ":")).encode()
    if len(text) > HEADER_BYTES:
        raise ValueError(f"the JSON header is {len(text)} bytes, more than the {HEADER_BYTES} it is padded to")
    headers = {LENGTH_HEADER: str(HEADER_BYTES), "Content-Type": "application/octet-stream"}
    return headers, text.ljust(HEADER_BYTES, b" ") + element


def triton_answer(body: bytes, headers) -> bytes:
    """The JPEG of an inference answer: its `jpeg` output, sent binary (a JSON header of the length the response's
    Inference-Header-Content-Length names, then the elements) or, without that header, as JSON."""
    length = _header(headers, LENGTH_HEADER)
    if length is None:
        answer, binary = json.loads(body), b""
    else:
        answer, binary = json.loads(body[: int(length)]), body[int(length) :]
    offset = 0
    for output in answer.get("outputs", []):
        size = (output.get("parameters") or {}).get("binary_data_size")
        if output["name"] != "jpeg":
            offset += size or 0
            continue
        if size is None:  # JSON data: the BYTES element as a string
            return output["data"][0].encode("latin-1")
        element = binary[offset : offset + size]
        (jpeg_length,) = struct.unpack_from("<I", element)
        return element[4 : 4 + jpeg_length]
    raise ValueError(f"no output 'jpeg' in the answer: {answer.get('error') or sorted(o['name'] for o in answer.get('outputs', []))}")


def _header(headers, name: str) -> str | None:
    """A header's value from a dict or an http.client/requests/urllib3 headers object, case-insensitively."""
    getter = getattr(headers, "get", None)
    value = getter(name) if getter else None
    if value is None and isinstance(headers, dict):
        value = next((v for k, v in headers.items() if k.lower() == name.lower()), None)
    return value
