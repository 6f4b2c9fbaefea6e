"""A TorchServe's processes, found by what is true rather than by a pid file; the ports it needs; its captured output.

Every process of a server that segserve starts carries SEGSERVE_RUN_DIR=<its run folder> in its
environment: the capture process sets it, and the torchserve launcher, the Java frontend and every
worker inherit it. So a server is found from its run folder even after the launcher that started it
died, and two servers with different run folders never see each other's processes.

`python -m segserve.serving.processes capture LOG MAX_BYTES KEPT COMMAND...` runs COMMAND (the launcher) with
its stdout and stderr through a pipe into LOG, rotated at MAX_BYTES with KEPT older files. It leads
the server's process group, so it lives on after `segserve serve` exits and is stopped with the rest.
"""

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from xml.sax.saxutils import escape

import psutil

from segserve.errors import RuntimeFailure

MARKER = "SEGSERVE_RUN_DIR"


def server_processes(run_dir: Path, ports: tuple[int, ...] = ()) -> list[psutil.Process]:
    """Live processes started for this run folder (zombies are dead already: they only wait to be reaped).

    By the marker in their environment; failing that, by `ports` (the run folder's config): a frontend
    started from this folder runs in it and listens there, and its process group is the server's. That
    finds a server whose environment cannot be read, or one started without the marker."""
    wanted = str(run_dir.resolve())
    found = []
    for process in psutil.process_iter():
        if process.pid == os.getpid():
            continue
        try:
            if process.environ().get(MARKER) == wanted and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.Error:  # gone meanwhile, or another user's
            continue
    return found or _listening_from(wanted, ports)


def _listening_from(run_dir: str, ports: tuple[int, ...]) -> list[psutil.Process]:
    """The process groups of processes that listen on one of `ports` and run in `run_dir`."""
    if not ports:
        return []
    try:
        connections = psutil.net_connections("tcp")
    except psutil.Error:
        return []
    groups = set()
    for connection in connections:
        if connection.status != psutil.CONN_LISTEN or not connection.pid or not connection.laddr or connection.laddr.port not in ports:
            continue
        try:
            if psutil.Process(connection.pid).cwd() == run_dir and (group := _live_group(connection.pid)) is not None:
                groups.add(group)
        except psutil.Error:
            continue
    members = [pid for pid in psutil.pids() if pid != os.getpid() and _live_group(pid) in groups]
    return [psutil.Process(pid) for pid in members if _live_group(pid) is not None]


def role(process: psutil.Process) -> str:
    try:
        cmdline = " ".join(process.cmdline())
        if process.name() == "java":
            return "frontend"
    except psutil.Error:
        return "gone"
    if "model_service_worker" in cmdline:
        return "worker"
    if "segserve.serving.processes" in cmdline:  # before "torchserve": the launcher's command is part of its own
        return "log capture"
    if "autoscale" in cmdline:
        return "autoscaler"
    return "launcher" if "torchserve" in cmdline else "other"


def process_group(processes: list[psutil.Process]) -> int | None:
    """The group most of them share (a server segserve started has one: the capture process's pid)."""
    groups = [pgid for p in processes if (pgid := _live_group(p.pid)) is not None]
    return max(set(groups), key=groups.count) if groups else None


def summary(processes: list[psutil.Process]) -> str:
    """e.g. "frontend pid 12, 3 workers (process group 9)"."""
    roles = [(role(p), p.pid) for p in processes]
    parts = [f"frontend pid {pid}" for name, pid in roles if name == "frontend"]
    workers = sum(name == "worker" for name, _ in roles)
    parts.append(f"{workers} worker{'s' * (workers != 1)}")
    parts += [f"{name} pid {pid}" for name, pid in roles if name in ("launcher", "autoscaler", "other")]
    return f"{', '.join(parts)} (process group {process_group(processes)})"


def stop(run_dir: Path, timeout_s: float, ports: tuple[int, ...] = ()) -> str:
    """SIGTERM, then SIGKILL after timeout_s, every process of this run folder (found as server_processes
    finds them), by process group; what was stopped, or "" when nothing ran."""
    processes = server_processes(run_dir, ports)
    if not processes:
        return ""
    stopped, signalled = summary(processes), set()
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5)):
        signalled_now: set[int] = set()
        deadline = time.monotonic() + wait_s
        while processes and time.monotonic() < deadline:
            # Signal newcomers too: the frontend may restart a worker while it shuts down.
            _signal([p for p in processes if p.pid not in signalled_now], sig)
            signalled_now.update(p.pid for p in processes)
            time.sleep(0.2)
            processes = server_processes(run_dir, ports)
        signalled |= signalled_now
        if not processes:
            break
    for pid in signalled:  # reap those that are our children (a server this process started), as no zombie
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
    if processes:
        pids = ", ".join(str(p.pid) for p in processes)
        raise RuntimeFailure(f"the server started for {run_dir} outlived SIGKILL: pid(s) {pids}")
    return stopped


def _signal(processes: list[psutil.Process], sig: int) -> None:
    """The whole group with one call when every live member is ours (it also reaches a worker forked
    meanwhile); otherwise only our processes, each by its pid."""
    ours = {p.pid for p in processes}
    groups = {pgid for pid in ours if (pgid := _live_group(pid)) is not None}
    for pgid in groups:
        members = {pid for pid in psutil.pids() if _live_group(pid) == pgid}
        targets = [(os.killpg, pgid)] if members <= ours else [(os.kill, pid) for pid in members & ours]
        for kill, target in targets:
            try:
                kill(target, sig)
            except ProcessLookupError:
                pass


def _live_group(pid: int) -> int | None:
    """The process group of a live process; None for a zombie or a process gone."""
    try:
        fields = re.sub(r"^.*\) ", "", Path(f"/proc/{pid}/stat").read_text()).split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else int(fields[2])


# Ports ------------------------------------------------------------------------------
def port_holder(host: str, port: int) -> str | None:
    """None when port is free to listen on; else who holds it, e.g. "pid 12 (python3 -m http.server 8080)"."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as sock:
        # SO_REUSEADDR, as servers set it: a port with only TIME_WAIT connections left counts as free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            return None
        except OSError:
            pass
    try:
        connections = psutil.net_connections("tcp")
    except psutil.Error:
        connections = []
    for connection in connections:
        if connection.laddr and connection.laddr.port == port and connection.status == psutil.CONN_LISTEN and connection.pid:
            return describe_pid(connection.pid)
    return "a process this user cannot see"


def describe_pid(pid: int) -> str:
    try:
        process = psutil.Process(pid)
        command = " ".join(process.cmdline()) or process.name()
        owner = process.environ().get(MARKER)
    except psutil.Error:
        return f"pid {pid}"
    command = command if len(command) <= 80 else command[:77] + "..."
    return f"pid {pid} ({command}" + (f"; started for {owner})" if owner else ")")


# Output capture ---------------------------------------------------------------------
def capture(log: Path, max_bytes: int, kept: int, command: list[str]) -> int:
    """Run command with stdout and stderr into log, rotated (log.1 newest, up to log.<kept>); its exit code.

    A pipe read by this process rather than an open file: a file handed to the launcher grows
    for as long as the server runs, and only a reader can cut it."""
    child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    # Ignored after the spawn, so the launcher and Java keep the default. Stopping the server ends the
    # writers, and the pipe's end-of-file ends this process with their last words written.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    out = open(log, "ab", buffering=0)
    size = log.stat().st_size
    while chunk := os.read(child.stdout.fileno(), 65536):
        while chunk:
            if size >= max_bytes:
                out.close()
                rotate(log, kept)
                out, size = open(log, "wb", buffering=0), 0
            part, chunk = chunk[: max_bytes - size], chunk[max_bytes - size :]
            try:
                out.write(part)
            except OSError:
                pass  # a full disk: drop the text rather than block the server on a full pipe
            size += len(part)
    out.close()
    return child.wait()


def rotate(log: Path, kept: int) -> None:
    """log → log.1 → log.2 … → log.<kept>; the oldest is overwritten (kept 0: log is just emptied)."""
    for index in range(kept, 0, -1):
        newer = log.with_name(f"{log.name}.{index - 1}") if index > 1 else log
        if newer.exists():
            newer.replace(log.with_name(f"{log.name}.{index}"))


# TorchServe's own log4j2.xml (in model-server.jar) keeps 100 MB per file and sends every line of
# its loggers to the console as well: the access log, worker output and model metrics, each request
# again in torchserve.out and in ts_log.log. Here each line goes to one file, every file is rotated
# by size, and the console (torchserve.out) gets warnings and errors only.
LOG_FILES = {  # appender → pattern
    "access_log": "%d{ISO8601} - %m%n",
    "model_log": "%d{ISO8601} [%-5p] %t %c - %m%n",
    "model_metrics": "%d{ISO8601} - %m%n",
    "ts_log": "%d{ISO8601} [%-5p] %t %c - %m%n",
    "ts_metrics": "%d{ISO8601} - %m%n",
}
LOGGERS = {  # logger → (level, its only file, or None: the root's)
    "ACCESS_LOG": ("info", "access_log"),
    "MODEL_LOG": ("all", "model_log"),
    "MODEL_METRICS": ("all", "model_metrics"),
    "TS_METRICS": ("all", "ts_metrics"),
    # Stock logs DEBUG here, and a line per request from BatchAggregator ("Sending response for jobId"):
    # about 0.5 KB per request of the 2.5 KB left in ts_log (the rest: the handlers' metric lines echoed).
    "org.pytorch.serve": ("info", None),
    "org.pytorch.serve.wlm.BatchAggregator": ("warn", None),
    "io.netty": ("error", None),
    "org.apache": ("off", None),
}


def log4j2_xml(logs: Path, max_bytes: int, kept: int) -> str:
    """A log4j2 configuration (torchserve --log-config) that keeps at most (kept + 1) × max_bytes per file."""
    logs_attr = escape(str(logs), {'"': "&quot;"})
    appenders = ['    <Console name="STDOUT" target="SYSTEM_OUT"><PatternLayout pattern="%d{ISO8601} [%-5p] %t %c - %m%n"/></Console>']
    for name, pattern in LOG_FILES.items():
        appenders.append(
            f'    <RollingFile name="{name}" fileName="{logs_attr}/{name}.log" filePattern="{logs_attr}/{name}.log.%i">\n'
            f'      <PatternLayout pattern="{pattern}"/>\n'
            f'      <SizeBasedTriggeringPolicy size="{max_bytes}"/>\n'
            f'      <DefaultRolloverStrategy max="{kept}" fileIndex="min"/>\n'
            "    </RollingFile>"
        )
    loggers = []
    for name, (level, file) in LOGGERS.items():
        ref = f'<AppenderRef ref="{file}"/>' if file else ""
        additivity = ' additivity="false"' if file else ""
        loggers.append(f'    <Logger name="{name}" level="{level}"{additivity}>{ref}</Logger>')
    loggers.append('    <Root level="info"><AppenderRef ref="ts_log"/><AppenderRef ref="STDOUT" level="warn"/></Root>')
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n<!-- Written by segserve (segserve/serving/processes.py) for this run folder. -->\n'
        "<Configuration>\n  <Appenders>\n" + "\n".join(appenders) + "\n  </Appenders>\n"
        "  <Loggers>\n" + "\n".join(loggers) + "\n  </Loggers>\n</Configuration>\n"
    )


if __name__ == "__main__":
    if len(sys.argv) < 6 or sys.argv[1] != "capture":
        sys.exit("usage: python -m segserve.serving.processes capture LOG MAX_BYTES KEPT COMMAND...")
    sys.exit(capture(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]))
