"""What every kind of target does for a point (targets/__init__.py lists the kinds)."""

from segserve.bench.run.measure import Endpoint
from segserve.bench.suite.plan import Point


class Kind:
    """The targets of one kind: whether a target is one of them, deploying a point of one, and what runs for it."""

    def __init__(self, changes: dict):
        self.changes = changes  # what the points cost, shared by the kinds: restarts, registrations, scales
        self.fresh_workers = False  # the last deploy started workers (registered, scaled or a server started)
        self.load_s: float | None = None  # the last deploy's start or registration: until every worker was ready
        self.archive_overrides: dict | None = None  # what the registered .war's copy changed in its spec (None: not one)

    def owns(self, name: str) -> bool:
        raise NotImplementedError

    def deploy(self, point: Point) -> Endpoint:
        raise NotImplementedError

    def record_keys(self, name: str) -> dict:
        """What each record of this kind's target `name` carries besides its measurements (the kind, a peer's versions)."""
        return {}

    def watched_processes(self, endpoint: Endpoint) -> dict[str, list[int]] | None:
        """The deployed point's processes by role, for their CPU and RSS; None where they are not ours to watch."""
        return None

    def release(self) -> None:
        """Let the next point of this kind start fresh workers (`bench ab`'s and `--rounds`' rounds)."""

    def stop(self) -> None:
        """Stop what runs for this kind (another kind's point is next)."""

    def close(self) -> None:
        self.stop()
