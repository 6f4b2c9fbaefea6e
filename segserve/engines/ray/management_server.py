"""The Ray engine's management API on a port of its own (Serve has one HTTP port, the inference API's), served by
the driver (driver.py) with the standard library's threading HTTP server: each request read, answered by
management_api.answer against the driver's registry, with the headers every TorchServe answer carries. Bound to
the management address of config.properties (127.0.0.1 by default); every call needs the management key (or, for
/token, the token API's), as on TorchServe.
"""

import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from segserve.engines.ray import management_api
from segserve.engines.ray.torchserve_api import NO_CACHE, Answer, error


def start(host: str, port: int, key_file: Path, models, store: Path, defaults) -> ThreadingHTTPServer:
    """The server, answering in a thread of its own until shutdown()."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as netty's

        def handle_one(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            call = management_api.parse(self.command, self.path)
            if self.headers.get_content_type() == "application/json" and body:
                # RegisterModelRequest from a JSON body, as the frontend reads one (its keys as the query's)
                try:
                    call.query |= {key: [str(value)] for key, value in json.loads(body).items()}
                except (ValueError, AttributeError):
                    pass
            try:
                keys = json.loads(key_file.read_text())
                answer = management_api.answer(call, self.headers.get("Authorization"), keys, models, store, defaults)
            except Exception as failed:  # an answer, never a dropped connection (netty's catch-all: 500)
                answer = error(500, "InternalServerException", " ".join(str(failed).split())[:300])
            self.send(answer)

        def send(self, answer: Answer) -> None:
            self.send_response(answer.status)
            for name, value in {**answer.headers, "x-request-id": str(uuid.uuid4()), **NO_CACHE}.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(answer.body)))
            if answer.status >= 400:  # NettyUtils.sendError closes the connection
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(answer.body)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD = handle_one

        def log_message(self, format, *args) -> None:  # the driver's log has Ray's; an access log is not kept
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="management", daemon=True).start()
    return server
