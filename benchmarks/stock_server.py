"""Start (or stop) a stock TorchServe serving segserve's model: the baseline segserve is compared against.

What a TorchServe user would do by following TorchServe's own examples: archive a plain
handler (benchmarks/stock_handler.py) and the weights with torch-model-archiver, and run
`torchserve --start` with a config.properties that only puts every port on 127.0.0.1,
turns token authorization off and names the archive to load. Everything else stays at
TorchServe's defaults: one worker per CPU core, batch size 1, no batch delay, torch's
own thread count in every worker.

    python benchmarks/stock_server.py --port-base 18180 [--weights weights/seg.pt] [--run-dir DIR]
    segserve bench benchmarks/stock.yaml          # the comparison
    python benchmarks/stock_server.py --stop [--run-dir DIR]

The server listens on 127.0.0.1: inference at port-base (POST /predictions/stockseg with a
JPEG or PNG body answers a JPEG class map), management at +1, metrics at +2, gRPC at +3/+4.
The run folder (default /tmp/segserve-stock) holds the model store, config.properties,
TorchServe's logs/ and stock.pid (the frontend's pid). It is also TMPDIR for the launcher,
so TorchServe's pid file there does not stop another TorchServe on this machine. `--stop`
ends the frontend's process group and its workers, never anything by name.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
HANDLER = Path(__file__).resolve().parent / "stock_handler.py"
MODEL_NAME = "stockseg"
DEFAULT_RUN_DIR = Path("/tmp/segserve-stock")
# Set in the launcher's environment, so Java and every worker inherit it: how --stop finds
# workers that outlived their frontend.
MARKER = "SEGSERVE_STOCK_RUN_DIR"
FRONTEND_CLASS = "org.pytorch.serve.ModelServer"


class Failure(Exception):
    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def tool(name: str) -> str:
    """A console script installed beside this Python (the venv's bin/)."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise Failure(f"{name} is not installed beside {sys.executable}", 2)
    return str(path)


def ports(port_base: int) -> dict[str, int]:
    return {
        "inference": port_base,
        "management": port_base + 1,
        "metrics": port_base + 2,
        "grpc_inference": port_base + 3,
        "grpc_management": port_base + 4,
    }


def check_ports_free(port_base: int) -> None:
    for name, port in ports(port_base).items():
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TorchServe binds: TIME_WAIT is no clash
            try:
                sock.bind(("127.0.0.1", port))
            except OSError as error:
                raise Failure(f"port {port} ({name}) on 127.0.0.1 is taken ({error.strerror}); choose another --port-base", 2) from None


def worker_port_base(port_base: int) -> int:
    """A range of 100 worker ports (unix sockets /tmp/.ts.sock.<port>) that no other TorchServe uses now."""
    first = 30000 + (port_base % 300) * 100
    for offset in range(0, 30000, 100):
        base = 30000 + (first - 30000 + offset) % 30000
        if not any(Path(f"/tmp/.ts.sock.{base + i}").exists() for i in range(100)):
            return base
    raise Failure("no free worker port range: every /tmp/.ts.sock.30000-59999 range is in use")


def write_config(run_dir: Path, port_base: int, store: Path) -> Path:
    p = ports(port_base)
    lines = [
        "# Stock TorchServe for benchmarks/stock_server.py: loopback addresses, no token, one archive.",
        "# Nothing else is set, so TorchServe's defaults hold (workers = cores, batch size 1).",
        f"inference_address=http://127.0.0.1:{p['inference']}",
        f"management_address=http://127.0.0.1:{p['management']}",
        f"metrics_address=http://127.0.0.1:{p['metrics']}",
        "grpc_inference_address=127.0.0.1",
        "grpc_management_address=127.0.0.1",
        f"grpc_inference_port={p['grpc_inference']}",
        f"grpc_management_port={p['grpc_management']}",
        "disable_token_authorization=true",
        "enable_envvars_config=false",
        f"initial_worker_port={worker_port_base(port_base)}",
        f"model_store={store}",
        f"load_models={MODEL_NAME}.mar",
    ]
    path = run_dir / "config.properties"
    path.write_text("\n".join(lines) + "\n")
    return path


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def server_processes(run_dir: Path) -> list[psutil.Process]:
    """The frontend in run_dir/stock.pid, its descendants, and anything else started with this run folder's marker."""
    found: dict[int, psutil.Process] = {}
    frontend = recorded_frontend(run_dir)
    if frontend is not None:
        found[frontend.pid] = frontend
        for child in frontend.children(recursive=True):
            found[child.pid] = child
    marker = str(run_dir)
    for process in psutil.process_iter():
        try:
            if process.pid != os.getpid() and process.environ().get(MARKER) == marker:
                found[process.pid] = process
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return list(found.values())


def recorded_frontend(run_dir: Path) -> psutil.Process | None:
    """The TorchServe frontend whose pid is in run_dir/stock.pid, if that process is still it."""
    try:
        process = psutil.Process(int((run_dir / "stock.pid").read_text().strip()))
        return process if FRONTEND_CLASS in process.cmdline() else None
    except (OSError, ValueError, psutil.Error):
        return None


def stop(run_dir: Path, timeout_s: float = 20) -> str:
    frontend = recorded_frontend(run_dir)
    targets = server_processes(run_dir)
    if not targets:
        (run_dir / "stock.pid").unlink(missing_ok=True)
        return f"no stock TorchServe runs from {run_dir}"
    groups = set()
    for process in [frontend] if frontend is not None else targets:
        try:
            groups.add(os.getpgid(process.pid))
        except OSError:
            pass
    groups.discard(os.getpgrp())  # never our own group

    def signal_all(signum: int) -> None:
        for group in groups:
            try:
                os.killpg(group, signum)
            except OSError:
                pass
        for process in targets:
            try:
                process.send_signal(signum)
            except psutil.Error:
                pass

    signal_all(signal.SIGTERM)
    _, alive = psutil.wait_procs(targets, timeout=timeout_s)
    killed = len(alive)
    if alive:
        signal_all(signal.SIGKILL)
        _, alive = psutil.wait_procs(alive, timeout=5)
    if alive:
        raise Failure(f"processes still alive after SIGKILL: {sorted(p.pid for p in alive)}")
    (run_dir / "stock.pid").unlink(missing_ok=True)
    (run_dir / "tmp" / ".model_server.pid").unlink(missing_ok=True)
    pid = f"frontend pid {frontend.pid}, " if frontend is not None else ""
    forced = f", {killed} needed SIGKILL" if killed else ""
    return f"stopped stock TorchServe from {run_dir} ({pid}{len(targets)} process(es){forced})"


def log_tail(run_dir: Path, lines: int = 15) -> str:
    for name in ("logs/model_log.log", "logs/ts_log.log", "torchserve.out"):
        path = run_dir / name
        if path.exists() and path.stat().st_size:
            return f"last lines of {path}:\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return f"(no log in {run_dir})"


def start(port_base: int, weights: Path, run_dir: Path, timeout_s: float) -> str:
    if not weights.is_file():
        raise Failure(f"weights not found: {weights} (train them with `segserve train`, or pass --weights)", 2)
    if not 1024 <= port_base <= 65530:
        raise Failure(f"--port-base must be in 1024..65530 (got {port_base})", 2)
    running = server_processes(run_dir)
    if running:
        raise Failure(
            f"a stock TorchServe already runs from {run_dir} (pids {sorted(p.pid for p in running)}); "
            f"stop it with: python benchmarks/stock_server.py --stop --run-dir {run_dir}",
            2,
        )
    check_ports_free(port_base)
    archiver, torchserve = tool("torch-model-archiver"), tool("torchserve")

    store, tmp = run_dir / "model_store", run_dir / "tmp"
    for folder in (store, tmp):
        folder.mkdir(parents=True, exist_ok=True)
    # Our own TMPDIR: the archiver stages files in $TMPDIR/<model name>, the launcher keeps its pid file there.
    env = {key: value for key, value in os.environ.items() if key != "TS_CONFIG_FILE"}  # that one overrides --ts-config
    env.update(TMPDIR=str(tmp), **{MARKER: str(run_dir)})
    archive = [
        archiver,
        "--model-name",
        MODEL_NAME,
        "--version",
        "1.0",
        "--serialized-file",
        str(weights),
        "--handler",
        str(HANDLER),
        "--export-path",
        str(store),
        "--force",
    ]
    done = subprocess.run(archive, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise Failure(f"torch-model-archiver failed ({done.returncode}): {(done.stderr or done.stdout).strip()}")
    config = write_config(run_dir, port_base, store)
    (run_dir / "stock.pid").unlink(missing_ok=True)
    (tmp / ".model_server.pid").unlink(missing_ok=True)

    # The launcher starts the Java frontend and exits; both are in a new process group that --stop ends.
    with open(run_dir / "torchserve.out", "ab") as out:
        launcher = subprocess.Popen(
            [torchserve, "--start", "--ncs", "--ts-config", str(config)],
            cwd=run_dir,  # key_file.json (when tokens are on) and logs/ land here
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        code = launcher.wait(timeout=60)
    except subprocess.TimeoutExpired:
        code = None
    pid_file = tmp / ".model_server.pid"
    if code != 0 or not pid_file.exists():
        stop(run_dir, 5)
        raise Failure(f"torchserve --start failed (exit {code}); {log_tail(run_dir)}")
    frontend_pid = int(pid_file.read_text().strip())
    (run_dir / "stock.pid").write_text(f"{frontend_pid}\n")

    p = ports(port_base)
    inference, management = f"http://127.0.0.1:{p['inference']}", f"http://127.0.0.1:{p['management']}"
    deadline = time.monotonic() + timeout_s
    workers: list[dict] = []
    while time.monotonic() < deadline:
        if not psutil.pid_exists(frontend_pid):
            stop(run_dir, 5)
            raise Failure(f"TorchServe exited while starting; {log_tail(run_dir)}")
        try:
            if get(f"{inference}/ping")[0] == 200:
                status, body = get(f"{management}/models/{MODEL_NAME}")
                if status == 200:
                    workers = json.loads(body)[0].get("workers", [])
                    # All of TorchServe's workers ready, so a benchmark does not start on half of them.
                    if workers and all(w.get("status") == "READY" for w in workers):
                        break
        except (OSError, ValueError, KeyError, IndexError):
            pass
        time.sleep(0.5)
    else:
        ready = sum(w.get("status") == "READY" for w in workers)
        if not ready:
            stop(run_dir, 5)
            raise Failure(f"no {MODEL_NAME} worker became READY in {timeout_s:.0f}s; {log_tail(run_dir)}")
        print(f"warning: only {ready} of {len(workers)} workers READY after {timeout_s:.0f}s", file=sys.stderr)
    return (
        f"stock TorchServe serving {inference}/predictions/{MODEL_NAME} (workers: {len(workers)}, batch size 1); "
        f"stop with: python benchmarks/stock_server.py --stop --run-dir {run_dir}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port-base", type=int, default=18180, help="inference port; management +1, metrics +2, gRPC +3/+4")
    parser.add_argument("--weights", type=Path, default=REPO / "weights" / "seg.pt", help="TorchScript or SegNet state_dict")
    parser.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR, help=f"working folder (default {DEFAULT_RUN_DIR})")
    parser.add_argument("--timeout", type=float, default=180, help="seconds to wait for the workers (default 180)")
    parser.add_argument("--stop", action="store_true", help="stop the server started from --run-dir")
    args = parser.parse_args(argv)
    run_dir = args.run_dir.expanduser().resolve()
    try:
        if args.stop:
            print(stop(run_dir))
        else:
            print(start(args.port_base, args.weights.expanduser().resolve(), run_dir, args.timeout))
    except Failure as failure:
        print(f"error: {failure}", file=sys.stderr)
        return failure.code
    return 0


if __name__ == "__main__":
    sys.exit(main())
