"""How a worker reads a request's bytes from TorchServe's frontend: into one buffer, in place.

TorchServe's worker reads every field of a message with `_retrieve_buffer` (ts/protocol/otf_message_handler.py):
`conn.recv(length)` allocates the whole remaining length on each call, and `data += pkt` copies each piece again.
A 688 KB raw body arrives in pieces of about 64 KB, so one request costs a dozen allocations of up to 688 KB and two
copies of every byte: 24% of a seg worker's samples on the serving path (py-spy, `segserve bench
benchmarks/serving_path.yaml` with `profile: best`). `read_exactly` allocates the field once and fills it with
`recv_into`: one copy, the kernel's. It returns what `_retrieve_buffer` returns (a bytearray of `length` bytes)
and ends the worker as it does when the frontend is gone. TorchServe is archived at 0.12.0: the function it stands
in for will not change under it. Imports nothing of torch: a worker installs it as it loads (handlers/base.py).
"""

import logging
import sys


def read_exactly(conn, length: int) -> bytearray:
    """`length` bytes from the frontend's socket, in one bytearray (none for length ≤ 0, as TorchServe's reader)."""
    data = bytearray(max(length, 0))
    with memoryview(data) as view:  # released before returning: a bytearray with a live view cannot be resized
        got = 0
        while got < length:
            received = conn.recv_into(view[got:], length - got)
            if received == 0:
                logging.info("Frontend disconnected.")
                sys.exit(0)
            got += received
    return data


def install() -> bool:
    """Make this worker's protocol read every later message with read_exactly; False where TorchServe's reader is
    not there to stand in for (a process that is no TorchServe worker)."""
    try:
        from ts.protocol import otf_message_handler
    except ImportError:
        return False
    if not callable(getattr(otf_message_handler, "_retrieve_buffer", None)):
        return False
    otf_message_handler._retrieve_buffer = read_exactly  # looked up as a module global at every call
    return True
