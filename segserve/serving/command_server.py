"""A command target's server (a peer: LitServe, Ray Serve, Triton…): started for a point, measured once its health
path answers, stopped by its processes' groups.

Every process it starts carries SEGSERVE_RUN_DIR=<its own run folder>, as a TorchServe of ours does, so that what
the server spawned (Ray's raylet and workers, Triton's binary) is found and stopped even where it left the
command's process group or outlived the command.
"""

import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

from segserve.errors import RuntimeFailure
from segserve.serving import processes
from segserve.serving.ts_config import free_port, release_ports

STOP_TIMEOUT_S = 30.0
LOG_TAIL_LINES = 5  # of a failed start's log, in its point's error


class CommandServer:
    """One run of a command target's command, on a free loopback port."""

    def __init__(self, name: str, argv_for_port, env: dict[str, str], health: str, log=print):
        self.name, self.health, self.log = name, health, log
        self.run_dir = Path(tempfile.mkdtemp(prefix=f"segserve-peer-{name}-"))
        self.log_path = self.run_dir / "server.log"
        self.port = free_port()
        self.argv = argv_for_port(self.port)
        self.env = {**os.environ, **env, processes.MARKER: str(self.run_dir.resolve()), "PYTHONUNBUFFERED": "1"}
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float) -> float:
        """Start the command and wait until its health path answers 200; the seconds that took. A command that
        exits or does not get healthy in time fails with its log's last lines, and what it left is stopped."""
        started = time.monotonic()
        with self.log_path.open("wb") as out:
            try:
                self.process = subprocess.Popen(
                    self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env, start_new_session=True
                )
            except OSError as error:  # e.g. a peer's venv not made yet (make setup-peers)
                release_ports([self.port])
                raise RuntimeFailure(f"{self.name}: cannot run {self.argv[0]} ({error.strerror})") from None
        try:
            self._wait_healthy(started + timeout_s)
        except RuntimeFailure as failure:
            left = self.stop()
            raise RuntimeFailure(f"{failure}{left}; {self.log_tail()}") from None
        finally:
            release_ports([self.port])
        return time.monotonic() - started

    def _wait_healthy(self, deadline: float) -> None:
        url = self.url + self.health
        while True:
            code = self.process.poll()
            if code is not None:
                raise RuntimeFailure(f"{self.name}: its command exited with {code} before {self.health} answered")
            try:
                with urllib.request.urlopen(url, timeout=5) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass  # not listening yet, or not ready (a 503)
            if time.monotonic() > deadline:
                raise RuntimeFailure(f"{self.name}: {self.health} did not answer 200 within the target's start_timeout_s")
            time.sleep(0.5)

    def process_groups(self) -> dict[str, list[int]]:
        """Its processes by executable name ("tritonserver", "raylet", "python3.11" …): where its CPU goes."""
        groups: dict[str, list[int]] = {}
        for process in processes.server_processes(self.run_dir):
            try:
                groups.setdefault(process.name(), []).append(process.pid)
            except psutil.Error:  # gone meanwhile
                continue
        return groups

    def stop(self) -> str:
        """SIGTERM to its processes' groups, SIGKILL after STOP_TIMEOUT_S; "" when the command had ended alone
        with nothing left, else a sentence saying what was left running and stopped."""
        exited = self.process is not None and self.process.poll() is not None
        left = [processes.describe_pid(p.pid) for p in processes.server_processes(self.run_dir)]
        try:
            processes.stop(self.run_dir, STOP_TIMEOUT_S)
        finally:
            if self.process is not None:
                try:
                    self.process.wait(timeout=5)  # reaped: no zombie
                except subprocess.TimeoutExpired:
                    pass
        if exited and left:  # the command had ended, what it started had not
            stopped = ", ".join(left)
            self.log(f"{self.name}: left processes running after its command exited; stopped: {stopped}")
            return f" ({self.name} left processes running after its command exited; stopped: {stopped})"
        return ""

    def log_tail(self) -> str:
        """Its log's last lines, on one line (a point's error is one line)."""
        lines = self.log_path.read_text(errors="replace").splitlines() if self.log_path.exists() else []
        kept = [line.strip() for line in lines if line.strip()][-LOG_TAIL_LINES:]
        return f"its log ends: {' | '.join(kept)}" if kept else "its log is empty"

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def __enter__(self) -> "CommandServer":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
