"""A small HTTP client on http.client: keep-alive connections, bytes in and out."""

import http.client
import json
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass
class Response:
    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "")

    def json(self):
        return json.loads(self.body)

    def text(self) -> str:
        return self.body.decode(errors="replace")


class Connection:
    """One keep-alive connection to a base URL (http://host:port); reconnects when the server closes it."""

    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 120):
        parts = urlsplit(base_url)
        self.host, self.port = parts.hostname, parts.port or 80
        self.token, self.timeout_s = token, timeout_s
        self._conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: bytes | None = None, content_type: str = "application/octet-stream") -> Response:
        headers = {"Content-Type": content_type} if body is not None else {}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        while True:
            reused = self._conn is not None
            if not reused:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
            try:
                self._conn.request(method, path, body=body, headers=headers)
                reply = self._conn.getresponse()
                return Response(reply.status, {k.lower(): v for k, v in reply.getheaders()}, reply.read())
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                # A kept-alive connection the server had already closed: send once more on a new one.
                if not reused:
                    raise

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def request(base_url: str, method: str, path: str, token: str | None = None, body: bytes | None = None, timeout_s: float = 120) -> Response:
    connection = Connection(base_url, token, timeout_s)
    try:
        return connection.request(method, path, body)
    finally:
        connection.close()
