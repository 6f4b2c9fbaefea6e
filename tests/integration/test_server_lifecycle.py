"""Finding, refusing and stopping a TorchServe by its processes, not by a pid file; bounded logs."""

import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from segserve.cli import main
from segserve.errors import RuntimeFailure
from segserve.serving import processes
from segserve.serving.server import TorchServe
from segserve.serving.ts_config import free_port_base, release_ports
from tests.conftest import ROOT, TEST_VMARGS

CONFIG = ROOT / "config.properties"


def cli_args(run_dir, model_store) -> list[str]:
    return ["--run-dir", str(run_dir), "--model-store", str(model_store), "--config", str(CONFIG)]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def pids_by_role(run_dir) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for process in processes.server_processes(run_dir):
        found.setdefault(processes.role(process), []).append(process.pid)
    return found


def marked(run_dir, command: list[str]) -> subprocess.Popen:
    """A stand-in server process: its own session, the run-folder marker in its environment."""
    env = {**os.environ, processes.MARKER: str(run_dir.resolve())}
    return subprocess.Popen(command, env=env, start_new_session=True)


def wait_for(condition, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not true within {timeout_s} s"  # not a later, misleading assertion
        time.sleep(0.1)


# Without TorchServe -----------------------------------------------------------------
def test_stop_ends_only_the_processes_of_its_run_folder(tmp_path):
    ours, theirs = marked(tmp_path / "a", ["sleep", "60"]), marked(tmp_path / "b", ["sleep", "60"])
    try:
        wait_for(lambda: len(processes.server_processes(tmp_path / "a")) == 1)
        assert [p.pid for p in processes.server_processes(tmp_path / "a")] == [ours.pid]
        stopped = processes.stop(tmp_path / "a", timeout_s=5)
        assert f"process group {ours.pid}" in stopped
        assert not psutil.pid_exists(ours.pid)  # and reaped: stop() waits for its caller's children
        assert theirs.poll() is None and processes.server_processes(tmp_path / "b")
        assert processes.stop(tmp_path / "a", timeout_s=5) == ""
    finally:
        theirs.kill()
        theirs.wait()


def test_a_server_without_a_readable_marker_is_found_by_its_port_and_folder(tmp_path):
    """A frontend whose environment cannot be read (another user's, or started before the marker) still
    runs in its run folder and listens on its config's port: stop() ends its process group."""
    run_dir, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run_dir.mkdir()
    elsewhere.mkdir()
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    number = port.getsockname()[1]
    port.close()
    (run_dir / "config.properties").write_text(f"inference_address=http://127.0.0.1:{number}\nenable_grpc=false\n")
    listen = f"import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {number})); s.listen(); time.sleep(60)"
    frontend = subprocess.Popen([sys.executable, "-c", listen], cwd=run_dir, start_new_session=True)  # no marker
    bystander = subprocess.Popen(["sleep", "60"], cwd=elsewhere, start_new_session=True)
    try:
        server = TorchServe(run_dir, tmp_path, run_dir / "config.properties")
        wait_for(lambda: server.process_ids() == [frontend.pid])
        assert server.process_ids() == [frontend.pid]
        assert f"process group {frontend.pid}" in server.stop(timeout_s=5)
        assert frontend.poll() is not None and bystander.poll() is None
        assert server.stop(timeout_s=5) == ""
    finally:
        for process in (frontend, bystander):
            process.kill()
            process.wait()


def test_a_second_start_from_the_same_folder_while_one_is_starting_is_refused(tmp_path):
    import fcntl

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    server = TorchServe(run_dir, tmp_path, CONFIG)
    with open(run_dir / "start.lock", "w") as held:  # as a `segserve serve` in progress holds it
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(RuntimeFailure, match="another `segserve serve` is starting TorchServe from"):
            server.start(log=lambda _: None)
    assert not (run_dir / "config.properties").exists()  # refused before touching anything


def test_a_group_shared_with_unmarked_processes_is_not_signalled_as_a_group(tmp_path):
    # sh (unmarked) starts a marked sleep in its own process group, then an unmarked one.
    script = f'env {processes.MARKER}="{(tmp_path / "a").resolve()}" sleep 60 & sleep 60'
    shell = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    try:
        wait_for(lambda: len(processes.server_processes(tmp_path / "a")) == 1)
        (sleeper,) = processes.server_processes(tmp_path / "a")
        assert os.getpgid(sleeper.pid) == shell.pid
        assert processes.stop(tmp_path / "a", timeout_s=5)
        wait_for(lambda: gone(sleeper.pid))
        assert gone(sleeper.pid)
        assert shell.poll() is None  # the unmarked shell and its sleep were never signalled
    finally:
        shell.kill()
        shell.wait()


def test_a_taken_port_is_one_line_naming_the_port_and_its_holder(tmp_path, capsys):
    store = tmp_path / "store"
    store.mkdir()
    for archive in ("seg.mar", "jpeg.mar", "seg_jpeg.war", "seg_jpeg_fused.mar"):
        (store / archive).write_bytes(b"")  # never opened: the port check comes first
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert main(["serve", "--port-base", str(port), *cli_args(tmp_path / "run", store)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: port {port} (inference_address")
    assert f"taken by pid {os.getpid()} (" in err
    assert not processes.server_processes(tmp_path / "run")


def test_captured_output_rotates_and_stays_under_its_cap(tmp_path):
    log = tmp_path / "torchserve.out"
    log.write_bytes(b"x" * 900)  # an earlier run's output counts toward the cap
    writer = "import sys\nfor i in range(500): sys.stdout.write(f'line {i:04d}\\n'); sys.stdout.flush()\nsys.exit(3)"
    command = [sys.executable, "-m", "segserve.serving.processes", "capture", str(log), "1000", "2", sys.executable, "-c", writer]
    assert subprocess.run(command, timeout=60).returncode == 3  # the command's exit code comes back
    files = sorted(tmp_path.glob("torchserve.out*"))
    assert [f.name for f in files] == ["torchserve.out", "torchserve.out.1", "torchserve.out.2"]
    assert all(f.stat().st_size <= 1000 for f in files)
    written = b"x" * 900 + b"".join(f"line {i:04d}\n".encode() for i in range(500))
    kept = b"".join(f.read_bytes() for f in reversed(files))  # oldest first
    assert kept == written[-len(kept) :] and len(kept) == 2900  # two full files and the current one, nothing lost between


# With TorchServe --------------------------------------------------------------------
def test_a_port_taken_while_torchserve_starts_is_one_line(tmp_path, monkeypatch):
    checks, real_check = [], TorchServe._check_ports

    def check_after_the_first(self):  # the check before the start passes, as if the port were taken just after it
        checks.append(self)
        if len(checks) > 1:
            real_check(self)

    monkeypatch.setattr(TorchServe, "_check_ports", check_after_the_first)
    # five ports outside the kernel's ephemeral range, claimed by this process: the others stay free for the server
    # (a port beside one bound to 0 was once another process's outgoing connection: the inference port was taken)
    base = free_port_base(5)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", base + 1))
        holder.listen()
        port = holder.getsockname()[1]
        server = TorchServe(tmp_path / "run", tmp_path, CONFIG, port_base=port - 1)  # the management port is taken
        try:
            with pytest.raises(RuntimeFailure) as failure:
                server.start(log=lambda _: None)
        finally:
            server.stop()
            release_ports(range(base, base + 5))
    assert len(checks) == 2  # TorchServe started, failed, and the failure was checked again
    assert str(failure.value) == (
        f"port {port} (management_address in {server.config_path}) is taken by {processes.describe_pid(os.getpid())}: "
        "stop it, or choose other ports with --port-base N"
    )
    assert processes.server_processes(server.run_dir) == []


def test_free_ports_taken_before_the_jvm_bound_them_are_chosen_again_once(tmp_path, monkeypatch):
    """Free ports are bound by TorchServe seconds after they are chosen; another process can take one meanwhile
    (it did in CI, beside a benchmark). A server on free ports then starts again on other ones."""
    from segserve.serving import server as server_module

    real_choice, calls, lines = server_module.loopback_ports, [], []
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]

        def taken_the_first_time(port_base):
            chosen = real_choice(port_base)
            calls.append(chosen)
            return {**chosen, "management_address": f"http://127.0.0.1:{taken}"} if len(calls) == 1 else chosen

        monkeypatch.setattr(server_module, "loopback_ports", taken_the_first_time)
        server = TorchServe(tmp_path / "run", tmp_path, CONFIG, free_ports=True)
        try:
            server.start(log=lines.append)
            assert server.call("inference", "GET", "/ping").status == 200
            assert server.url("management") == calls[1]["management_address"] != f"http://127.0.0.1:{taken}"
        finally:
            server.stop()
    assert len(calls) == 2
    assert any(line.startswith(f"port {taken} (management_address") and "starting again on other free ports" in line for line in lines), (
        lines
    )


def test_a_start_that_never_logged_says_why(tmp_path, monkeypatch):
    """The output capture that starts TorchServe failing before anything logs (segserve not importable where it
    runs, say): its error is the reason given (it used to be an empty one)."""
    shadow = tmp_path / "shadow" / "segserve"  # a segserve that cannot start the capture, first on the path
    (shadow / "serving").mkdir(parents=True)
    (shadow / "__init__.py").write_text("")
    (shadow / "serving" / "__init__.py").write_text("")
    (shadow / "serving" / "processes.py").write_text("raise ImportError('the capture cannot start (on purpose)')\n")
    monkeypatch.setenv("PYTHONPATH", str(shadow.parent))
    server = TorchServe(tmp_path / "run", tmp_path, CONFIG, free_ports=True)
    with pytest.raises(RuntimeFailure) as failure:
        server.start(log=lambda _: None)
    lines = str(failure.value).splitlines()
    assert lines[0] == "TorchServe exited with code 1 while starting:"
    assert lines[-1] == "ImportError: the capture cannot start (on purpose)"


def test_stop_ends_frontend_and_workers_after_the_launcher_died(model_store, tmp_path, capsys):
    server = TorchServe(tmp_path / "run", model_store, CONFIG, free_ports=True)
    server.start(log=lambda _: None)
    try:
        server.register_model("jpeg.mar", "jpeg", log=lambda _: None)
        server.scale("jpeg", 2)  # the archive's model config caps workers at registration
        server.wait_ready("jpeg")
        workers = [int(w["pid"]) for w in server.describe("jpeg")["workers"]]
        assert len(workers) == 2
        roles = pids_by_role(server.run_dir)
        (launcher,), (frontend,) = roles["launcher"], roles["frontend"]
        assert sorted(roles["worker"]) == sorted(workers)
        # the frontend's JVM options come from SEGSERVE_TS_VMARGS (the tests' TEST_VMARGS), through config.properties
        java = psutil.Process(frontend).cmdline()
        assert java[0].endswith("java") and set(TEST_VMARGS.split()) <= set(java), java
        assert f"vmargs={TEST_VMARGS}" in server.config_path.read_text().splitlines()
        os.kill(launcher, signal.SIGKILL)
        wait_for(lambda: gone(launcher))
        assert not gone(frontend) and server.call("inference", "GET", "/ping").status == 200
        assert main(["serve", "--stop", *cli_args(server.run_dir, model_store)]) == 0
        out = capsys.readouterr().out
        assert f"TorchServe stopped from {server.run_dir.resolve()}: frontend pid {frontend}, 2 workers" in out
        assert processes.server_processes(server.run_dir) == []
        assert all(gone(pid) for pid in [frontend, *workers])
        assert main(["serve", "--stop", *cli_args(server.run_dir, model_store)]) == 0
        assert capsys.readouterr().out.strip() == f"no TorchServe running from {server.run_dir.resolve()}"
    finally:
        server.stop()


def test_serve_refuses_to_start_beside_a_live_server_and_keeps_its_key(model_store, tmp_path, capsys):
    cap_bytes, kept = 512, 2
    server = TorchServe(tmp_path / "run", model_store, CONFIG, free_ports=True, log_file_max_bytes=cap_bytes, log_files_kept=kept)
    server.start(log=lambda _: None)
    try:
        key_file = server.key_file.read_bytes()
        roles = pids_by_role(server.run_dir)
        (launcher,), (frontend,) = roles["launcher"], roles["frontend"]
        os.kill(launcher, signal.SIGKILL)  # the reported case: an orphaned frontend still serving
        wait_for(lambda: gone(launcher))
        assert main(["serve", *cli_args(server.run_dir, model_store)]) == 1
        err = capsys.readouterr().err
        running = f"error: TorchServe already runs from {server.run_dir.resolve()} at {server.url('inference')}: "
        assert err.count("\n") == 1 and err.startswith(running)
        assert f"frontend pid {frontend}" in err and "segserve serve --stop" in err
        assert server.key_file.read_bytes() == key_file
        assert main(["token", *cli_args(server.run_dir, model_store)]) == 0
        assert capsys.readouterr().out.strip() == server.token("inference")
        assert server.call("inference", "GET", "/ping").status == 200

        # TorchServe's own log files rotate at the cap (its start alone writes about 3 KB to ts_log).
        logs = sorted((server.run_dir / "logs").glob("ts_log.log*"))
        assert [f.name for f in logs] == ["ts_log.log", *[f"ts_log.log.{i}" for i in range(1, kept + 1)]]
        assert all(f.stat().st_size < cap_bytes + 2048 for f in logs)  # a file rolls after the event that crosses the cap
    finally:
        server.stop()


def test_serve_clears_the_workers_a_killed_frontend_left_and_starts(model_store, tmp_path):
    server = TorchServe(tmp_path / "run", model_store, CONFIG, free_ports=True)
    server.start(log=lambda _: None)
    try:
        server.register_model("jpeg.mar", "jpeg", log=lambda _: None)
        (worker,) = [int(w["pid"]) for w in server.describe("jpeg")["workers"]]
        (frontend,) = pids_by_role(server.run_dir)["frontend"]
        os.kill(frontend, signal.SIGKILL)
        wait_for(lambda: gone(frontend) and "launcher" not in pids_by_role(server.run_dir))
        assert not gone(worker)  # TorchServe 0.12's workers outlive their frontend, unreachable
        said = []
        server.start(log=said.append)
        assert said[0].startswith("stopped what was left of a TorchServe whose frontend died: 1 worker")
        assert gone(worker) and server.call("inference", "GET", "/ping").status == 200
    finally:
        server.stop()


def test_a_start_ended_by_sigterm_before_the_server_is_up_leaves_no_process(tmp_path):
    """`with TorchServe(...)` never reaches __exit__ when the start itself is interrupted; the start stops what it
    began (a GPU bundle step whose timeout came while TorchServe started left it running: make test, 2026-12-04)."""
    run_dir = tmp_path / "ts"
    script = (
        "import signal, sys\n"
        "from pathlib import Path\n"
        "from segserve.serving.server import TorchServe\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))\n"
        f"with TorchServe(run_dir=Path({str(run_dir)!r}), model_store=Path({str(tmp_path)!r}), "
        f"config_template=Path({str(CONFIG)!r}), free_ports=True):\n"
        "    print('up', flush=True)\n"
    )
    env = {**os.environ, "SEGSERVE_TS_VMARGS": TEST_VMARGS}
    parent = subprocess.Popen([sys.executable, "-c", script], env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not pids_by_role(run_dir).get("frontend") and time.monotonic() < deadline:  # Java started, not yet up
        time.sleep(0.05)
    assert pids_by_role(run_dir).get("frontend"), "TorchServe's frontend never started"
    parent.send_signal(signal.SIGTERM)
    out, _ = parent.communicate(timeout=60)
    assert parent.returncode == 143 and "up" not in out
    assert processes.server_processes(run_dir) == []
