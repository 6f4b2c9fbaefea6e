"""The worker's reader of the frontend's bytes (handlers/frontend_reader.py): the same bytes as TorchServe's own
`_retrieve_buffer`, however the socket hands them over, and the worker's exit when the frontend is gone."""

import os
import socket
import struct
import threading

import pytest
from ts.protocol import otf_message_handler

from handlers import frontend_reader


def sent_in_pieces(payload: bytes, piece: int) -> socket.socket:
    """The reading end of a socket pair whose other end sends `payload` in pieces of `piece` bytes, then closes."""
    reader, writer = socket.socketpair()

    def send():
        for start in range(0, len(payload), piece):
            writer.sendall(payload[start : start + piece])
        writer.close()

    threading.Thread(target=send, daemon=True).start()
    return reader


@pytest.mark.parametrize("piece", [1, 4093, 65536, 1 << 20])
def test_it_reads_what_torchserves_reader_reads_field_by_field(piece):
    fields = [b"", os.urandom(7), os.urandom(688_128), os.urandom(3)]
    message = b"".join(struct.pack("!i", len(field)) + field for field in fields)
    original = otf_message_handler._retrieve_buffer
    for read in (original, frontend_reader.read_exactly):
        conn = sent_in_pieces(message, piece)
        got = [bytes(read(conn, struct.unpack("!i", read(conn, 4))[0])) for _ in fields]
        assert got == fields
        assert isinstance(read(conn, 0), bytearray) and read(conn, -1) == bytearray()  # as TorchServe's: nothing read
        conn.close()


def test_a_frontend_gone_mid_field_ends_the_worker_as_torchserves_reader_does():
    conn = sent_in_pieces(b"x" * 10, 3)
    with pytest.raises(SystemExit) as ended:
        frontend_reader.read_exactly(conn, 11)
    assert ended.value.code == 0
    conn.close()


def test_install_puts_it_where_the_worker_protocol_looks_it_up(monkeypatch):
    monkeypatch.setattr(otf_message_handler, "_retrieve_buffer", otf_message_handler._retrieve_buffer)  # undone after
    assert frontend_reader.install()
    assert otf_message_handler._retrieve_buffer is frontend_reader.read_exactly
    conn = sent_in_pieces(struct.pack("!i", 1234567), 2)
    assert otf_message_handler._retrieve_int(conn) == 1234567  # TorchServe's own caller, through the new reader
    conn.close()
