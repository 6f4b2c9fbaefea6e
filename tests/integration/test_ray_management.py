"""The Ray engine from `segserve serve --engine ray --no-targets` to `serve --stop`, through TorchServe's management
API on its own port: a .mar registered (POST /models?url=), predicted, scaled to two workers under concurrent
requests with none lost and the first replica kept (Serve's update in place), described with both workers, removed,
every listener on loopback or refusing a request without a key (exposure.py: Ray's own servers and exporters on
loopback), `segserve audit --run-dir` reporting nothing, `pin --show` listing the engine's processes and replicas,
`audit --management` refused by name, and nothing left running after the stop. About 25 s on 2 cores (docs/ray.md);
the answers' shapes are unit-tested against a real TorchServe's (tests/unit/test_ray_management.py)."""

import json
import subprocess
import threading
from pathlib import Path

import psutil
import pytest

from segserve.archives.build import tool
from segserve.cli import main
from segserve.engines.engine_interface import open_engine
from segserve.engines.ray.exposure import exposure
from segserve.serving.http import Connection, request

ROOT = Path(__file__).resolve().parents[2]
ECHO = Path(__file__).parent / "data" / "ray_echo" / "echo_handler.py"


# long: a Ray cluster of its own, 21-26 s, which make test's 12 minutes no longer hold (a clean clone took 12 min 6 s
# with it); make test checks its parts: tests/unit/test_ray_management.py (every answer against TorchServe's recorded
# ones, the engine's choice, the refusals) and test_ray_lockdown.py
@pytest.mark.long
def test_serve_register_predict_scale_under_load_describe_delete_and_stop(tmp_path, capsys):
    store, run_dir = tmp_path / "store", tmp_path / "run"
    store.mkdir()
    build = [tool("torch-model-archiver"), "--model-name", "echo", "--version", "1.0", "--handler", str(ECHO), "--export-path", str(store)]
    subprocess.run(build, check=True, capture_output=True)
    common = ["--run-dir", str(run_dir), "--model-store", str(store), "--config", str(ROOT / "config.properties")]
    from segserve.serving.ts_config import free_port

    # Serve's own proxy: HAProxy mode (serve's default) takes twice as long here, each change waiting for HAProxy's
    # reload and health checks (29 s against 57 s, 2 cores under load); it is checked in the long tier
    serve = ["serve", "--engine", "ray", "--ray-proxy", "default", "--no-targets", "--port-base", str(free_port())]
    assert main([*serve, *common]) == 0
    engine = open_engine(None, run_dir, store, ROOT / "config.properties")  # what `token`, `scale`, `predict` get
    try:
        assert engine.engine == "ray" and engine.models() == []
        capsys.readouterr()
        assert main(["token", "--api", "management", *common]) == 0
        assert capsys.readouterr().out.strip() == engine.token("management")
        registered = engine.call("management", "POST", "/models?url=echo.mar&batch_size=4&max_batch_delay=20&initial_workers=1")
        assert (registered.status, registered.json()) == (200, {"status": 'Model "echo" Version: 1.0 registered with 1 initial workers'})
        first = engine.describe("echo")["workers"][0]["pid"]

        answers, stop = [], threading.Event()

        def load() -> None:
            connection = Connection(engine.url("inference"), engine.token("inference"), timeout_s=60)
            while not stop.is_set():
                reply = connection.request("POST", "/predictions/echo", f"row {len(answers)}".encode())
                answers.append((reply.status, json.loads(reply.body)["row"] if reply.status == 200 else reply.text()))
            connection.close()

        senders = [threading.Thread(target=load) for _ in range(4)]
        for sender in senders:
            sender.start()
        engine.scale("echo", 2)  # `segserve scale`'s call: PUT min_worker=2&max_worker=2&synchronous=true
        stop.set()
        for sender in senders:
            sender.join()
        assert answers and all(status == 200 for status, _ in answers), [a for a in answers if a[0] != 200][:3]
        described = engine.describe("echo")
        assert (described["minWorkers"], [w["status"] for w in described["workers"]]) == (2, ["READY", "READY"])
        assert first in [w["pid"] for w in described["workers"]]  # scaled in place: the first replica kept serving
        pids = [int(w["pid"]) for w in described["workers"]]
        # every listener of the engine on loopback (Ray's own servers and exporters included: engine.LOOPBACK_ONLY),
        # but the replicas' inter-deployment gRPC servers ([::] in Serve's code), which refuse a call without the token
        found = exposure(engine.process_ids())
        assert set(found) == {"loopback", "keyed"}, found
        # `segserve audit --run-dir`: the Ray engine's rules; nothing to report (exit 0)
        assert main(["audit", "--run-dir", str(run_dir), "--json"]) == 0
        audited = json.loads(capsys.readouterr().out)
        assert (audited["models"], audited["findings"]) == (["echo"], []), audited
        # `audit --management` of its management API: refused by name (exit 2)
        assert main(["audit", str(ROOT / "config.properties"), "--management", engine.url("management")]) == 2
        assert "as the Ray engine's management API does" in capsys.readouterr().err
        # `pin --show`: the engine's own processes and both replicas, with their cores
        assert main(["pin", "--show", *common]) == 0
        shown = capsys.readouterr().out
        assert "(frontend)" in shown and "(ray)" in shown and all(f"{'echo':24s} {pid:>8d}  " in shown for pid in pids), shown
        engine.unregister("models", "echo")
        gone = request(engine.url("inference"), "POST", "/predictions/echo", engine.token("inference"), b"x")
        assert (gone.status, gone.json()["type"]) == (404, "ModelNotFoundException")
        running = engine.process_ids()
    finally:
        assert main(["serve", "--stop", *common]) == 0
    assert "the Ray engine stopped from" in capsys.readouterr().out
    assert engine.process_ids() == [] and not any(psutil.pid_exists(pid) for pid in running)
