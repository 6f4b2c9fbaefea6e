"""A command target: a peer server's command (LitServe, Ray Serve, Triton…), started for its points and started
again when its own values (the point's server level) change."""

import time

from segserve.bench.run.command import V2_HEADER_BYTES, package_versions
from segserve.bench.run.measure import Endpoint
from segserve.bench.run.targets.kind import Kind
from segserve.bench.suite.plan import Point
from segserve.bench.suite.spec import Suite
from segserve.errors import RuntimeFailure
from segserve.serving.command_server import CommandServer


class CommandTargets(Kind):
    def __init__(self, suite: Suite, changes: dict, log=print):
        super().__init__(changes)
        self.suite, self.log = suite, log
        self.command: CommandServer | None = None  # the running server
        self.command_key = None
        self.versions: dict[str, dict] = {}  # each target's package versions, read once

    def owns(self, name: str) -> bool:
        return name in self.suite.command_targets

    def record_keys(self, name: str) -> dict:
        """A peer server (side by side with segserve's best in the analysis) and its own packages, as its interpreter sees them."""
        if name not in self.versions:
            spec = self.suite.command_targets[name]
            try:
                self.versions[name] = package_versions(spec.command[0], spec.packages)
            except RuntimeFailure as failure:  # its points still run: they fail on their own
                self.log(f"{spec.name}: {failure}")
                self.versions[name] = {"error": str(failure)}
        return {"target_kind": "command", "peer_server": True, "server_versions": self.versions[name]}

    def deploy(self, point: Point) -> Endpoint:
        """The point's command running and healthy (started again when its own values changed)."""
        spec = self.suite.command_targets[point.target]
        if self.command is None or self.command_key != (point.target, point.server):
            self.stop()
            values = dict(point.server)
            self.command = CommandServer(spec.name, lambda port: spec.argv(port, values), spec.env, spec.health, self.log)
            self.command_key = (point.target, point.server)
            started = time.monotonic()
            try:
                self.command.start(spec.start_timeout_s)
            except RuntimeFailure:
                self.stop()
                raise
            self.fresh_workers, self.load_s = True, round(time.monotonic() - started, 2)
            self.changes["restarts"] += 1
        headers = {"Inference-Header-Content-Length": str(V2_HEADER_BYTES)} if spec.protocol == "kserve-v2-binary" else {}
        return Endpoint(self.command.url, spec.path, None, headers, None, ())

    def watched_processes(self, endpoint: Endpoint) -> dict[str, list[int]] | None:
        """Its processes as one group (what it spawned too: they carry its run folder)."""
        return self.command.process_groups() if self.command is not None and endpoint.url == self.command.url else None

    def stop(self) -> None:
        if self.command is not None:
            self.command.close()
        self.command = self.command_key = None
