"""The Ray engine's fourth slice, without Ray running: a model's replica answers its own route (the key, the
route, the version, then its batch), HAProxy's stats and metrics moved to loopback in the config Ray's installed
template writes, and the verdict on each listener (segserve/engines/ray/exposure.py)."""

import asyncio
import json
from pathlib import Path

import pytest
from starlette.requests import Request as HttpRequest

from segserve.engines.ray import exposure, haproxy_loopback
from segserve.engines.ray.replica import MarReplica, Request
from segserve.engines.ray.torchserve_api import InferenceKey, new_keys


def rendered_ray_template() -> str:
    """HAProxy's config as Ray 2.60's HAProxyManager renders it (no backends), from the installed package."""
    from jinja2 import Environment
    from ray.serve._private.haproxy import HAProxyConfig
    from ray.serve._private.haproxy_templates import HAPROXY_CONFIG_TEMPLATE

    config = HAProxyConfig(stats_port=18404, metrics_port=19101)
    environment = Environment()
    environment.filters["haproxy_fmt"] = str
    route_info = config.build_health_route_info([])  # what HAProxyManager hands the template
    return environment.from_string(HAPROXY_CONFIG_TEMPLATE).render(config=config, backends=[], grpc_backends=[], route_info=route_info)


def binds(config: str) -> list[str]:
    return [line.split()[1] for line in config.splitlines() if line.strip().startswith("bind ")]


def test_ray_template_binds_stats_and_metrics_everywhere_and_the_rewrite_moves_them_to_loopback():
    config = rendered_ray_template()
    assert "*:18404" in binds(config) and ":19101" in binds(config)  # why the rewrite exists (Ray 2.60)
    fixed = haproxy_loopback.loopback_binds(config)
    assert "127.0.0.1:18404" in binds(fixed) and "127.0.0.1:19101" in binds(fixed)
    assert all(b.startswith("127.0.0.1:") for b in binds(fixed)), binds(fixed)
    assert haproxy_loopback.loopback_binds(fixed) == fixed  # a reload's second pass changes nothing


def test_a_bind_on_another_address_stops_haproxy_unless_it_is_the_inference_host():
    with pytest.raises(ValueError, match="10.1.2.3:80"):
        haproxy_loopback.loopback_binds("frontend x\n    bind 10.1.2.3:80\n")
    assert haproxy_loopback.loopback_binds("    bind 0.0.0.0:8080\n", ("127.0.0.1", "0.0.0.0")) == "    bind 0.0.0.0:8080\n"


def test_the_wrapper_rewrites_the_config_then_runs_the_real_binary_with_the_same_arguments(tmp_path, monkeypatch):
    config = tmp_path / "haproxy.cfg"
    config.write_text("listen stats\n  bind *:8404\n")
    ran = []
    monkeypatch.setenv(haproxy_loopback.REAL_BINARY, "/opt/haproxy")
    monkeypatch.setattr(haproxy_loopback.os, "execv", lambda path, argv: ran.append((path, argv)))
    haproxy_loopback.main(["-db", "-f", str(config), "-sf", "12"])
    assert config.read_text() == "listen stats\n  bind 127.0.0.1:8404\n"
    assert ran == [("/opt/haproxy", ["/opt/haproxy", "-db", "-f", str(config), "-sf", "12"])]
    with pytest.raises(SystemExit, match="error: haproxy_loopback: no -f CONFIG"):
        haproxy_loopback.main(["-db"])


def http(path: str, key: str, body: bytes = b"{}") -> HttpRequest:
    sent = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        return sent.pop(0)

    headers = [(b"authorization", f"Bearer {key}".encode()), (b"content-type", b"application/json")]
    return HttpRequest({"type": "http", "method": "POST", "path": path, "headers": headers, "query_string": b""}, receive)


@pytest.fixture
def replica(tmp_path: Path):
    """A MarReplica of model `echo` version 1.0 without its archive: its batch records what it was handed."""
    key_file = tmp_path / "key_file.json"
    key_file.write_text(json.dumps(new_keys()))
    replica = MarReplica.__new__(MarReplica)
    replica.key, replica.versions, replica.handed = InferenceKey(str(key_file)), {"echo": "1.0"}, []

    async def batch(sent: Request):
        replica.handed.append(sent)
        from segserve.engines.ray.torchserve_api import Answer

        return Answer(200, {"content-type": "text/plain"}, b"ok")

    replica.batch = batch
    return replica, json.loads(key_file.read_text())["inference"]["key"]


def test_a_replica_answers_its_own_route_after_the_key_as_the_ingress_does(replica):
    model, key = replica

    def answer(path: str, token: str = key):
        got = asyncio.run(model.answer(http(path, token), "rid"))
        return got.status, json.loads(got.body)["type"] if got.status != 200 else got.body

    assert answer("/predictions/echo", "wrong") == (400, "InvalidKeyException")
    assert answer("/predictions/echo/2.0") == (404, "ModelVersionNotFoundException")
    assert answer("/predictions/echoX") == (404, "ModelNotFoundException")  # a longer name under the prefix
    assert model.handed == []
    assert answer("/predictions/echo/1.0/some/path") == (200, b"ok")
    handed = model.handed[0]
    assert (handed.request_id, handed.body, handed.content_type) == ("rid", b"{}", "application/json")
    assert (b"url_path", b"some/path") in handed.headers and (b"explain", b"False") in handed.headers


def listener(ip: str, process: str = "gcs_server") -> exposure.Listener:
    return exposure.Listener(1, process, ip, 1234)


def test_a_listener_is_fine_on_loopback_or_refusing_a_keyless_request_and_open_otherwise():
    assert exposure.verdict(listener("127.0.0.1"), 200, b"<html>") == "loopback"
    assert exposure.verdict(listener("::"), None, b"", "UNAUTHENTICATED") == "keyed"  # gRPC: Ray's token
    assert exposure.verdict(listener("::"), None, b"", "UNIMPLEMENTED") == "open"  # a gRPC server taking keyless calls
    assert exposure.verdict(listener("::"), None, b"", None) == "unknown"  # neither HTTP/1 nor gRPC
    assert exposure.verdict(listener("0.0.0.0", "ray::ServeReplica:model:echo:echo"), 400, b"{") == "keyed"
    assert exposure.verdict(listener("192.0.2.2", "ray::DashboardAgent"), 401, b"Unauthorized") == "keyed"
    assert exposure.verdict(listener("0.0.0.0", "ray::DashboardAgent"), 200, b"# HELP python_gc") == "ray-metrics"
    # HAProxy's stats page or its Prometheus exporter on all interfaces: open (slice 1's finding)
    assert exposure.verdict(listener("0.0.0.0", "haproxy"), 200, b"<html>") == "open"
    assert exposure.verdict(listener("0.0.0.0", "haproxy"), 200, b"# HELP haproxy_") == "open"


def test_haproxy_ports_are_never_the_engines_own(tmp_path, monkeypatch):
    from segserve.engines.ray import engine

    handed = iter([28001, 28002, 28003, 28004, 28005, 28006])  # 28001: --port-base 28000's management port
    monkeypatch.setattr(engine, "free_port", lambda: next(handed))
    env = engine.haproxy_env(tmp_path, taken=frozenset({28000, 28001}))
    ports = [env[k] for k in ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT", "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT")]
    assert ports == ["28002", "28003", "28004"]
    wrapper = tmp_path / "h" / "haproxy"
    assert env["RAY_SERVE_HAPROXY_BINARY_PATH"] == str(wrapper) and wrapper.stat().st_mode & 0o777 == 0o700


def test_serve_starts_ray_behind_haproxy_unless_told_and_refuses_ray_proxy_without_the_ray_engine(tmp_path):
    from types import SimpleNamespace

    from segserve.cli import cmd_serve
    from segserve.engines.engine_interface import open_engine
    from segserve.errors import UsageError

    config = tmp_path / "config.properties"
    assert open_engine("ray", tmp_path, tmp_path, config).haproxy is True
    assert open_engine("ray", tmp_path, tmp_path, config, ray_proxy="default").haproxy is False
    with pytest.raises(UsageError, match="--ray-proxy chooses the Ray engine's HTTP front: add --engine ray"):
        cmd_serve.run(SimpleNamespace(engine=None, stop=False, ray_proxy="haproxy", run_dir=str(tmp_path)))
