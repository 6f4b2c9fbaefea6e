"""Put a point in place: the kind of its target (bench/run/targets/) deploys it, and the other kinds' servers are
stopped first (two servers would share the machine). The catalog's targets and a user's archives run on a
TorchServe of the bench's own, changed as little as possible; a command target's command is started, and started
again when its own values change; an http target is not ours: only checked and measured.
"""

from pathlib import Path

from segserve.archives.catalog import Catalog
from segserve.bench.run.measure import Endpoint
from segserve.bench.run.targets.command_targets import CommandTargets
from segserve.bench.run.targets.http_targets import HttpTargets
from segserve.bench.run.targets.kind import Kind
from segserve.bench.run.targets.torchserve_targets import TorchServeTargets
from segserve.bench.suite.plan import Point
from segserve.bench.suite.spec import Suite


class Deployment:
    """The suite's points deployed one after another, each by its target's kind."""

    def __init__(self, suite: Suite, catalog: Catalog, weights: Path, log=print, env: dict | None = None, port_base: int | None = None):
        self.suite, self.catalog, self.weights, self.log = suite, catalog, weights, log
        self.changes = {"restarts": 0, "registrations": 0, "scales": 0}  # what the points cost (a search reports it)
        # the bench's own TorchServe: also what bench ab warms, captures answer on and the baselines use (its
        # server, compile cache and archive recipe); asked for by that name, not passed through
        self.torchserve = TorchServeTargets(suite, catalog, weights, self.changes, log, env, port_base)
        self.kinds: list[Kind] = [HttpTargets(suite, self.changes), CommandTargets(suite, self.changes, log), self.torchserve]
        self.active: Kind | None = None

    def kind_of(self, name: str) -> Kind:
        return next(kind for kind in self.kinds if kind.owns(name))

    def deploy(self, point: Point) -> Endpoint:
        kind = self.kind_of(point.target)
        for other in self.kinds:
            if other is not kind:
                other.stop()
        self.active = kind
        kind.fresh_workers, kind.load_s = False, None
        return kind.deploy(point)

    @property
    def fresh_workers(self) -> bool:
        """The last deploy started workers (registered, scaled, or a command's server started)."""
        return self.active is not None and self.active.fresh_workers

    @property
    def load_s(self) -> float | None:
        return self.active.load_s if self.active is not None else None

    @property
    def archive_overrides(self) -> dict | None:
        """The spec values the deployed point's .war copy changed (registration.spec_overrides); None: not a .war."""
        return self.active.archive_overrides if self.active is not None else None

    def watched_processes(self, endpoint: Endpoint) -> dict[str, list[int]] | None:
        """The deployed point's processes by role, for their CPU and RSS; None for an http target (not ours)."""
        return self.active.watched_processes(endpoint) if self.active is not None else None

    def release(self) -> None:
        """What is registered unregistered, so that the next point starts fresh workers."""
        self.torchserve.release()

    def stop_servers(self) -> None:
        """Every kind's server: the next point starts clean."""
        for kind in self.kinds:
            kind.stop()

    def close(self) -> None:
        for kind in self.kinds:
            kind.close()

    def __enter__(self) -> "Deployment":
        """`with Deployment(...) as deployment:` stops every server its points started on the way out."""
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
