"""One TorchServe instance: start it, wait until healthy, register archives, stop it by process id.

Each instance has its own run folder, used as the server's working directory
(key_file.json and logs/ land there) and as TMPDIR (TorchServe's pid file),
and its own ports and worker-socket range, so several can run side by side.
The server runs in its own process group. Its processes are found by the run
folder in their environment (segserve/serving/processes.py), not by a pid file, so
`stop()` ends them even when the launcher is gone; nothing is ever killed by name.
"""

import fcntl
import os
import re
import shutil
import site
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from urllib.parse import urlsplit

from segserve.archives.build import tool
from segserve.errors import RuntimeFailure, UsageError
from segserve.serving import processes
from segserve.serving.http import request
from segserve.serving.management import ManagementClient
from segserve.serving.ts_config import ADDRESS_KEYS, free_worker_port_base, loopback_ports, read_properties, release_ports, render_config

# JVM options for the frontend of every TorchServe started here (config.properties' vmargs, which it replaces; a
# config_overrides vmargs wins). The tests set it (tests/conftest.py, TEST_VMARGS): their frontends live a minute.
VMARGS_ENV = "SEGSERVE_TS_VMARGS"


class PortTaken(RuntimeFailure):
    """A port of the server's config was in use when it started."""


# The environment segserve starts TorchServe with, unless the caller's own sets these; a stock `torchserve --start`
# gets the same with them exported first (docs/serving.md). Workers, the frontend and their children inherit it.
SERVER_ENV = {
    # Idle OpenMP threads sleep instead of spinning on cores the frontend and decoders need;
    # measured here: 85 vs 73 req/s for seg at batch 16, 48 vs 8–14 with a busy neighbour.
    "OMP_WAIT_POLICY": "PASSIVE",
    # glibc's malloc keeps blocks up to 16 MiB in its heap and 64 MiB of freed memory before trimming it, where its
    # defaults map each large block afresh (a worker's 688 KB request bodies, read in pieces, and a batch's tensors)
    # and the kernel zeroes its pages on first touch again. `bench ab --b-env` (#49): the fused pipeline, eager, 2
    # workers, 128 connections of the seed's raw body, +12.1% [+1.0%, +23.1%] req/s, the workers 14.2-15.3 against
    # 16.7-17.3 CPU-ms a request; the serving path alone +2.7% [+0.7%, +4.7%], its workers -7%.
    "MALLOC_MMAP_THRESHOLD_": str(16 * 2**20),
    "MALLOC_TRIM_THRESHOLD_": str(64 * 2**20),
}

# What a server for a user's archive takes of the caller's environment, besides SERVER_ENV's names and the names its
# suite lists (TorchServe.worker_env): what TorchServe, Java and a Python worker need to start, nothing more. An
# archive is code, and every worker inherits the frontend's environment whole (TorchServe 0.12's
# EnvironmentUtils.getEnvString): segserve's own holds credentials (AWS_*, tokens) that a user's handler has no
# business reading. Not HOME: archive_environment gives a scratch one (boto3 and the like read ~/.aws/credentials).
ARCHIVE_BASE_ENV = (
    "PATH",
    "USER",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "JAVA_HOME",
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
)


def archive_environment(worker_env, home: Path) -> dict[str, str]:
    """Of this process's environment, what a user's archive's code gets (its server's frontend and workers, a .war's
    function nodes run for `members: true`, the import checks of `segserve fuse` and of a failed registration):
    ARCHIVE_BASE_ENV, SERVER_ENV's names and the names its suite lists, with `home` (a scratch_home) as its HOME and
    its caches' folder. A name the suite lists (HOME, TORCH_HOME, ...) wins: the user asked for it."""
    kept = {*ARCHIVE_BASE_ENV, *SERVER_ENV, *worker_env}
    caches = home / ".cache"
    scratch = {
        # the user's ~ holds credentials that tools find by themselves (~/.aws/credentials, ~/.netrc, ~/.config/...)
        "HOME": str(home),
        "XDG_CACHE_HOME": str(caches),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "TORCH_HOME": str(caches / "torch"),  # torch.hub's downloads (its default is under XDG_CACHE_HOME, ~)
        "MPLCONFIGDIR": str(home / ".config" / "matplotlib"),
        "PIP_CACHE_DIR": str(caches / "pip"),  # TorchServe's pip install of a requirements file (install_requirements)
        # a Python installed with `pip install --user` (torchserve too) keeps finding its packages without the user's ~
        "PYTHONUSERBASE": site.getuserbase(),
    }
    return scratch | {name: value for name, value in os.environ.items() if name in kept}


def scratch_home(folder: Path) -> Path:
    """`folder` made afresh, empty, with mode 0700: the HOME of a user's archive's processes (archive_environment),
    where its tools keep their caches and find none of the user's files. Whoever makes it removes it."""
    shutil.rmtree(folder, ignore_errors=True)  # a stale one of an earlier start in the same run folder
    folder.mkdir(mode=0o700, parents=True)
    os.chmod(folder, 0o700)  # mkdir's mode passes through the umask: exact, whatever the umask
    return folder


@dataclass
class TorchServe(ManagementClient):
    run_dir: Path
    model_store: Path
    config_template: Path
    port_base: int | None = None  # None: the ports in config_template
    free_ports: bool = False  # pick free ports and a free worker-socket range (tests, benchmarks)
    config_overrides: dict[str, str] = field(default_factory=dict)  # more config.properties keys
    env: dict[str, str] = field(default_factory=dict)  # extra environment (workers inherit it), e.g. OMP_NUM_THREADS
    core_plan: Path | None = None  # a core plan YAML (segserve/serving/cores.py)
    venv: Path | None = None  # run TorchServe (and so its workers) from this Python environment; None: segserve's own
    # A server for a user's archive: of the caller's environment only ARCHIVE_BASE_ENV, SERVER_ENV's names and these
    # reach it and its workers (`env` and segserve's own variables as ever). None: the caller's whole environment.
    worker_env: tuple[str, ...] | None = None
    # Each log file under logs/ (torchserve.out and TorchServe's log4j files) rotates at this size,
    # keeping this many older files: at most (kept + 1) × max_bytes each.
    log_file_max_bytes: int = 10 * 2**20
    log_files_kept: int = 3

    # the engine interface's (segserve/engines/engine_interface.py): its name and how a sentence names it
    engine = "torchserve"
    title = "TorchServe"
    refused_commands = MappingProxyType({})  # every segserve command acts on a TorchServe

    def refusal(self, target, autoscale: bool = False) -> str | None:
        """Why it cannot serve a catalog target (the engine interface's): TorchServe serves every kind."""
        return None

    # Lifecycle ----------------------------------------------------------------
    @property
    def config_path(self) -> Path:
        return self.run_dir / "config.properties"

    @property
    def pid_path(self) -> Path:
        return self.run_dir / "server.pid"

    def url(self, api: str) -> str:
        return read_properties(self.config_path)[f"{api}_address"]

    def start(self, startup_timeout_s: float = 120, log=print) -> None:
        """Start TorchServe from run_dir and wait until it answers /ping. Holds run_dir/start.lock meanwhile:
        two `segserve serve` at once would both pass the checks below, and the second would delete the
        first's key file."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir / "start.lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise RuntimeFailure(f"another `segserve serve` is starting TorchServe from {self.run_dir}: let it finish") from None
            # the lock goes with the file when this returns or raises
            for attempt in (1, 2):
                try:
                    return self._start(startup_timeout_s, log)
                except PortTaken as taken:
                    # free ports of our choosing, taken before the JVM bound them: choose again, once
                    if not self.free_ports or attempt == 2:
                        raise
                    log(f"{taken}; starting again on other free ports")
                finally:
                    release_ports(self._own_ports())  # listened on now, or given up

    def torchserve(self) -> str:
        """The torchserve launcher: its Python is the one every worker runs (TorchServe passes sys.executable on)."""
        if self.venv is None:
            return tool("torchserve")
        launcher = Path(self.venv) / "bin" / "torchserve"
        if not launcher.exists():
            hint = " (make setup-ipex)" if Path(self.venv).name == ".venv-ipex" else ""
            raise UsageError(f"venv {self.venv}: no {launcher} there: install torchserve in it{hint}")
        return str(launcher.absolute())  # the server starts from its run dir: a relative path would not resolve there

    def _start(self, startup_timeout_s: float, log) -> None:
        self._refuse_a_running_server(log)
        logs, log_config = self._write_run_config()
        command = self._command(log_config)
        log("$ " + " ".join(command))
        plan = self._load_core_plan()
        env = self._environment(logs)
        sizes = _sizes(logs)
        capture_process = self._launch(command, env, logs)
        # Whatever ends the wait (a failed start, the timeout, the caller's SIGTERM or Ctrl-C), nothing of this start
        # outlives it: `with TorchServe(...)` never reaches __exit__ when __enter__ raises, and the server runs in a
        # session of its own (a GPU bundle step stopped by its timeout while TorchServe started left it running).
        try:
            self._wait_until_up(capture_process, sizes, plan, startup_timeout_s, log)
        except BaseException:
            self.stop()
            raise

    def _refuse_a_running_server(self, log) -> None:
        """Clear the workers a dead frontend left; refuse to start beside a server that still runs from run_dir."""
        running = processes.server_processes(self.run_dir, self._own_ports())
        if running and not {processes.role(p) for p in running} & {"frontend", "launcher"}:
            # Workers outlive a killed frontend (kill -9 of Java leaves them waiting on their sockets): nothing
            # can reach them any more, and they hold their worker sockets and core slots.
            log(f"stopped what was left of a TorchServe whose frontend died: {processes.stop(self.run_dir, 10, self._own_ports())}")
            running = []
        if running:  # its key file and config are in use: leave them alone
            address = read_properties(self.config_path).get("inference_address") if self.config_path.exists() else None
            address = f" at {address}" if address else ""
            raise RuntimeFailure(
                f"TorchServe already runs from {self.run_dir}{address}: {processes.summary(running)}; "
                f"stop it first with `segserve serve --stop --run-dir {self.run_dir}`"
            )

    def _write_run_config(self) -> tuple[Path, Path]:
        """config.properties (its ports checked free) and log4j2.xml in run_dir, with tmp/ and logs/ beside them;
        (the logs folder, the log4j2.xml)."""
        if self.log_files_kept < 1 or self.log_file_max_bytes < 1:
            raise UsageError(f"log_files_kept and log_file_max_bytes must be ≥ 1 (got {self.log_files_kept}, {self.log_file_max_bytes})")
        (self.run_dir / "tmp").mkdir(parents=True, exist_ok=True)
        logs = self.run_dir / "logs"
        logs.mkdir(exist_ok=True)
        overrides = ({"vmargs": os.environ[VMARGS_ENV]} if os.environ.get(VMARGS_ENV) else {}) | self.config_overrides
        if self.free_ports or self.port_base:  # a second instance: move every port it opens
            overrides.update(loopback_ports(None if self.free_ports else self.port_base))
            overrides["initial_worker_port"] = str(free_worker_port_base())
        render_config(self.config_template, self.config_path, overrides)
        self._check_ports()
        self.key_file.unlink(missing_ok=True)  # a stale key file would pass the health check below
        log_config = self.run_dir / "log4j2.xml"
        log_config.write_text(processes.log4j2_xml(logs.resolve(), self.log_file_max_bytes, self.log_files_kept))
        return logs, log_config

    def _command(self, log_config: Path) -> list[str]:
        store = str(self.model_store.resolve())
        return [
            self.torchserve(),
            "--start",
            "--foreground",
            "--ncs",
            "--model-store",
            store,
            "--workflow-store",
            store,
            "--ts-config",
            str(self.config_path),
            "--log-config",
            str(log_config),
        ]

    def _load_core_plan(self):
        """The core plan (a cores.CorePlan), if any, written where the workers read it (their environment names the file)."""
        if self.core_plan is None:
            return None
        from segserve.serving.cores import load_plan, write_plan_json

        plan = load_plan(self.core_plan)
        self.env = {**self.env, "SEGSERVE_CORE_PLAN": str(write_plan_json(plan, self.run_dir))}
        return plan

    @property
    def archive_home(self) -> Path:
        """The scratch HOME of a user's archive's server (worker_env set): made at start, removed at stop."""
        return self.run_dir / "archive-home"

    def _environment(self, logs: Path) -> dict[str, str]:
        inherited = os.environ
        if self.worker_env is not None:
            inherited = archive_environment(self.worker_env, scratch_home(self.archive_home))
        return {
            **SERVER_ENV,
            **inherited,
            **self.env,
            "TMPDIR": str(self.run_dir / "tmp"),
            "LOG_LOCATION": str(logs),
            "METRICS_LOCATION": str(logs),
            processes.MARKER: str(self.run_dir.resolve()),  # inherited by Java and every worker: how stop() finds them
        }

    def _launch(self, command: list[str], env: dict[str, str], logs: Path) -> subprocess.Popen:
        """Start `command` under the output capture process; its pid goes to run_dir/server.pid."""
        # The capture process leads a new session and process group; the launcher, Java and the workers join it.
        capture = [sys.executable, "-m", "segserve.serving.processes", "capture", str(logs / "torchserve.out")]
        # The capture process's own errors (it cannot start, say) are the only trace of a start that never logged.
        with open(logs / "capture.err", "wb") as capture_errors:
            capture_process = subprocess.Popen(
                [*capture, str(self.log_file_max_bytes), str(self.log_files_kept), *command],
                cwd=self.run_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=capture_errors,
                start_new_session=True,
            )
        self.pid_path.write_text(str(capture_process.pid))  # for people and scripts; segserve finds the server by its processes
        return capture_process

    def _wait_until_up(self, capture_process: subprocess.Popen, sizes: dict[Path, int], plan, startup_timeout_s: float, log) -> None:
        """Poll /ping until it answers (then pin the frontend to the plan's cores); raise if the server exits first or
        the timeout passes."""
        deadline = time.monotonic() + startup_timeout_s
        while time.monotonic() < deadline:
            if capture_process.poll() is not None:
                raise self._startup_failure(capture_process.returncode, sizes)
            try:
                # /ping needs the inference key too, which exists once the frontend is up.
                if (
                    self.key_file.exists()
                    and request(self.url("inference"), "GET", "/ping", self.token("inference"), timeout_s=2).status == 200
                ):
                    if plan is not None:  # the frontend first: workers start from its affinity
                        from handlers.pinning import pin_all_threads  # the workers' own (imports torch: only with a plan)

                        for pid in self.process_ids():
                            pin_all_threads(pid, plan.frontend)
                    log(f"TorchServe is up: inference {self.url('inference')}, management {self.url('management')}")
                    return
            except (OSError, RuntimeFailure, KeyError):
                pass
            time.sleep(0.5)
        raise RuntimeFailure(f"TorchServe did not become healthy in {startup_timeout_s:.0f}s:\n{self.log_tail(20)}")

    def grpc_inference_url(self) -> str | None:
        """grpc://host:port of its gRPC inference API (None where enable_grpc=false)."""
        found = [(host, port) for key, host, port in self.ports() if key == "grpc_inference_port"]
        return f"grpc://{found[0][0]}:{found[0][1]}" if found else None

    def ports(self) -> list[tuple[str, str, int]]:
        """(config key, host, port) of each TCP port the server listens on, from run_dir/config.properties."""
        config = read_properties(self.config_path)
        found = []
        for key, default in zip(ADDRESS_KEYS, ("http://127.0.0.1:8080", "http://127.0.0.1:8081", "http://127.0.0.1:8082"), strict=True):
            address = urlsplit(config.get(key, default))
            if address.port:
                found.append((key, address.hostname or "0.0.0.0", address.port))
        if config.get("enable_grpc", "true").lower() != "false":
            for api, default_port in (("inference", 7070), ("management", 7071)):
                host = config.get(f"grpc_{api}_address", "0.0.0.0")
                found.append((f"grpc_{api}_port", host, int(config.get(f"grpc_{api}_port", default_port))))
        return found

    def _own_ports(self) -> tuple[int, ...]:
        """The ports of the server last started from this run folder (its rendered config), if any."""
        return tuple(port for _, _, port in self.ports()) if self.config_path.exists() else ()

    def _check_ports(self) -> None:
        for key, host, port in self.ports():
            holder = processes.port_holder(host, port)
            if holder:
                raise PortTaken(
                    f"port {port} ({key} in {self.config_path}) is taken by {holder}: stop it, or choose other ports with --port-base N"
                )

    def _startup_failure(self, code: int, sizes: dict[Path, int]) -> RuntimeFailure:
        """One line for a port taken while TorchServe started; the log tail for anything else."""
        added = _added_text(sizes)
        if "Address already in use" in added:
            try:
                self._check_ports()
            except RuntimeFailure as taken:
                return taken
            where = re.search(r"Failed to bind to address: (\S+)", added)
            where = where.group(1) if where else "one of ports " + ", ".join(str(port) for _, _, port in self.ports())
            return PortTaken(f"TorchServe could not listen on {where}: Address already in use (free again now)")
        capture_errors = (self.run_dir / "logs" / "capture.err").read_text(errors="replace").strip().splitlines()[-15:]
        tail = "\n".join(capture_errors) if capture_errors else self.log_tail(15)
        return RuntimeFailure(f"TorchServe exited with code {code} while starting:\n{tail}")

    def running_pid(self) -> int | None:
        """The server's process group (the pid of the process that leads it) while any of its processes lives."""
        return processes.process_group(processes.server_processes(self.run_dir, self._own_ports()))

    def stop(self, timeout_s: float = 30) -> str:
        """End every process of this run folder (launcher, frontend, workers, output capture); what it stopped,
        e.g. "frontend pid 12, 3 workers (process group 9)", or "" when nothing ran."""
        stopped = processes.stop(self.run_dir, timeout_s, self._own_ports())
        self.pid_path.unlink(missing_ok=True)
        if self.worker_env is not None:  # its processes are gone: what they kept in their HOME goes too
            shutil.rmtree(self.archive_home, ignore_errors=True)
        return stopped

    def __enter__(self) -> "TorchServe":
        """`with TorchServe(...) as server:` starts it (unless it runs already) and stops every process of it on the
        way out, whatever ends the block."""
        if self.running_pid() is None:
            self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def code_environment(self) -> dict[str, str] | None:
        """The environment a user's archive's code gets beside this server (management.py imports a handler that
        did not load in it): its workers' (worker_env, their scratch HOME); None: segserve's whole one."""
        return None if self.worker_env is None else archive_environment(self.worker_env, self.archive_home)

    def log_tail(self, lines: int = 40) -> str:
        chunks = []
        for name in ("torchserve.out", "ts_log.log", "model_log.log"):
            path = self.run_dir / "logs" / name
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                chunks.append(f"--- {path} (last {len(tail)} lines)\n" + "\n".join(tail))
        return "\n".join(chunks) or f"(no logs in {self.run_dir / 'logs'})"

    def process_ids(self) -> list[int]:
        """The output capture, the torchserve launcher, the Java frontend and every worker."""
        return sorted(p.pid for p in processes.server_processes(self.run_dir, self._own_ports()))

    def server_processes(self) -> list[tuple[str, int]]:
        """("frontend", pid) of the Java frontend (`pin --show`: its workers come from describe)."""
        found = processes.server_processes(self.run_dir, self._own_ports())
        return [("frontend", p.pid) for p in sorted(found, key=lambda p: p.pid) if processes.role(p) == "frontend"]


def _sizes(logs: Path) -> dict[Path, int]:
    return {path: path.stat().st_size if path.exists() else 0 for path in (logs / "torchserve.out", logs / "ts_log.log")}


def _added_text(sizes: dict[Path, int]) -> str:
    """What was written to these logs since `sizes` was taken (all of a file that rotated meanwhile)."""
    text = ""
    for path, size in sizes.items():
        data = path.read_bytes() if path.exists() else b""
        text += (data[size:] if len(data) >= size else data).decode(errors="replace")
    return text
