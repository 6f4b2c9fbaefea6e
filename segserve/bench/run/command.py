"""A command target's inputs and facts: its request body in KServe v2's binary extension (Triton's), and the versions
of the packages its command runs with. Its server is segserve/serving/command_server.py."""

import json
import subprocess

from segserve.errors import RuntimeFailure


def package_versions(python: str, packages: list[str]) -> dict[str, str | None]:
    """{package: version} as `python` (a command target's command[0]) sees them; None for one not installed."""
    if not packages:
        return {}
    program = (
        "import importlib.metadata as m, json, sys\n"
        "def version(name):\n"
        "    try:\n"
        "        return m.version(name)\n"
        "    except m.PackageNotFoundError:\n"
        "        return None\n"
        "print(json.dumps({name: version(name) for name in sys.argv[1:]}))\n"
    )
    try:
        done = subprocess.run([python, "-c", program, *packages], capture_output=True, text=True, timeout=60)
    except OSError as error:
        raise RuntimeFailure(f"{python}: cannot run it to read package versions ({error.strerror})") from None
    if done.returncode != 0:
        raise RuntimeFailure(f"{python} could not read package versions: {done.stderr.strip()[-300:]}")
    return json.loads(done.stdout)


V2_HEADER_BYTES = 256  # the JSON header padded to this length, so one Inference-Header-Content-Length fits every body


def v2_binary_body(data: bytes, input_name: str, output_name: str) -> bytes:
    """A KServe v2 (Triton) inference request carrying `data` as the one BYTES element of a [1, 1] input in the
    binary tensor extension (a BYTES element is its 4-byte little-endian length, then its bytes), asking for the
    output in binary too. Sent with the header {"Inference-Header-Content-Length": V2_HEADER_BYTES}."""
    element = len(data).to_bytes(4, "little") + data
    header = {
        "inputs": [{"name": input_name, "shape": [1, 1], "datatype": "BYTES", "parameters": {"binary_data_size": len(element)}}],
        "outputs": [{"name": output_name, "parameters": {"binary_data": True}}],
    }
    text = json.dumps(header, separators=(",", ":")).encode()
    if len(text) > V2_HEADER_BYTES:
        raise RuntimeFailure(f"the KServe v2 header for tensors {input_name!r}, {output_name!r} is longer than {V2_HEADER_BYTES} bytes")
    return text.ljust(V2_HEADER_BYTES) + element
