"""The one engine interface: what `segserve serve`, `scale`, `token` and `predict` ask of a server, whichever engine
runs it. TorchServe (segserve/serving/server.py) and Ray Serve (segserve/engines/ray/engine.py) are its two
implementations; which one a command gets is decided here, and only here: by `--engine` where a command takes it
(serve), else by the run folder's `engine` file that `segserve serve` writes (a run folder without one is
TorchServe's, as every run folder before the Ray engine was).

Both speak TorchServe's management API over HTTP (ManagementClient: register, scale, describe, unregister, through
the management address and key), so the interface is small: start and stop, the addresses and keys, the archives'
registration, which catalog targets an engine cannot serve yet, and which segserve commands it refuses.
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from segserve.errors import UsageError
from segserve.serving.http import Response

ENGINES = ("torchserve", "ray")
DEFAULT_ENGINE = "torchserve"
ENGINE_FILE = "engine"  # in the run folder: the engine that `segserve serve` started there


class Engine(Protocol):
    engine: str  # its name in ENGINES
    title: str  # as a sentence names it: "TorchServe", "the Ray engine"
    run_dir: Path
    model_store: Path | None
    # segserve commands that read what only another engine has (its processes, logs, metrics), each with why:
    # "autoscale" → "moves ...". TorchServe: none; the Ray engine: segserve/engines/ray/commands.py
    refused_commands: Mapping[str, str]

    def start(self, startup_timeout_s: float = ..., log=print): ...

    def stop(self) -> str: ...  # what it stopped, by process id; "" when nothing ran

    def url(self, api: str) -> str: ...  # "inference" or "management": http://host:port

    def token(self, api: str) -> str: ...  # the key of TorchServe's key_file.json for that API

    @property
    def key_file(self) -> Path: ...

    def register_model(self, archive: str, name: str, workers: int = 1, *, log=print, **registration) -> None: ...

    def register_workflow(self, archive: str, name: str, log=print) -> None: ...

    def scale(self, model: str, workers: int) -> Response: ...

    def describe(self, model: str) -> dict: ...

    def unregister(self, kind: str, name: str) -> None: ...

    def models(self) -> list[str]: ...

    def wait_ready(self, model: str, timeout_s: float = ...) -> None: ...

    def refusal(self, target, autoscale: bool = False) -> str | None: ...  # why it cannot serve a target (autoscaled) yet

    def process_ids(self) -> list[int]: ...

    def server_processes(self) -> list[tuple[str, int]]: ...  # (role, pid) of each process that is no worker: `pin --show`


def recorded(run_dir: Path) -> str:
    """The engine `segserve serve` started from run_dir (TorchServe where none is recorded)."""
    try:
        name = (Path(run_dir) / ENGINE_FILE).read_text().strip()
    except OSError:
        return DEFAULT_ENGINE
    return name if name in ENGINES else DEFAULT_ENGINE


def refuse_command(engine: Engine, command: str) -> None:
    """One line naming the command and why, where `command` reads what this engine does not have."""
    if why := engine.refused_commands.get(command):
        raise UsageError(f"segserve {command} {why}: not on {engine.title} of {engine.run_dir} (docs/ray.md)")


def record(engine: Engine) -> None:
    """Write which engine serves from its run folder (before it starts: `serve --stop` finds a half-started one)."""
    engine.run_dir.mkdir(parents=True, exist_ok=True)
    (engine.run_dir / ENGINE_FILE).write_text(engine.engine + "\n")


# Serve's HTTP front of the Ray engine: HAProxy (its stats and metrics on loopback, haproxy_loopback.py) answered
# 4-8x the default proxy's requests at a fraction of its CPU (docs/measurements.md, "each model its own route")
RAY_PROXIES = ("haproxy", "default")
RAY_PROXY_DEFAULT = "haproxy"


def open_engine(
    name: str | None,
    run_dir: Path,
    model_store: Path,
    config: Path,
    port_base: int | None = None,
    core_plan: Path | None = None,
    ray_proxy: str | None = None,
    ray_cluster=None,
) -> Engine:
    """The engine `name` (None: the one recorded in run_dir, with the Ray cluster it was deployed onto) for these
    server options; TorchServe-only options refused by name on another engine. `ray_cluster`: a running Ray
    cluster to deploy onto (engines/ray/cluster.py's Cluster, `serve --ray-address`)."""
    from_record, name = name is None, name or recorded(run_dir)
    if ray_cluster is not None and name != "ray":
        raise UsageError("--ray-address deploys the Ray engine onto a running Ray cluster: add --engine ray")
    if name == "torchserve":
        from segserve.serving.server import TorchServe

        return TorchServe(run_dir=run_dir, model_store=model_store, config_template=config, port_base=port_base, core_plan=core_plan)
    if name == "ray":
        from segserve.engines.ray import cluster
        from segserve.engines.ray.engine import RayServe

        if from_record:
            ray_cluster = cluster.recorded(run_dir)
        # on a cluster, HAProxy mode is each node's own setting (docs/ray.md): Serve's proxy unless asked otherwise
        haproxy = (ray_proxy or ("default" if ray_cluster else RAY_PROXY_DEFAULT)) == "haproxy"
        options = {"model_store": model_store, "config_template": config, "port_base": port_base, "haproxy": haproxy}
        options["core_plan"] = core_plan
        return RayServe(run_dir=run_dir, cluster=ray_cluster, **options)
    raise UsageError(f"unknown engine {name!r}: one of {', '.join(ENGINES)}")
