"""An http target: an endpoint segserve did not deploy (a stock TorchServe, Triton, …), checked to answer and
measured as it is; its processes are not ours to watch."""

import socket
from urllib.parse import urlsplit

from segserve.bench.run.measure import Endpoint
from segserve.bench.run.targets.kind import Kind
from segserve.bench.suite.plan import Point
from segserve.bench.suite.spec import Suite
from segserve.errors import RuntimeFailure


class HttpTargets(Kind):
    def __init__(self, suite: Suite, changes: dict):
        super().__init__(changes)
        self.suite = suite

    def owns(self, name: str) -> bool:
        return name in self.suite.http_targets

    def record_keys(self, name: str) -> dict:
        return {"target_kind": "http"}

    def deploy(self, point: Point) -> Endpoint:
        http = self.suite.http_targets[point.target]
        parts = urlsplit(http.url)
        try:  # a point of an endpoint that does not answer fails with the reason; the suite goes on
            socket.create_connection((parts.hostname, parts.port or 80), timeout=5).close()
        except OSError as error:
            raise RuntimeFailure(f"{http.url} does not answer ({error.strerror or error})") from None
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return Endpoint(f"{parts.scheme}://{parts.netloc}", path, None, http.headers, None, ())
