"""TorchServe as a context manager: started on the way in unless it runs, stopped on the way out however the block
ends (the real start and stop are tested on a real TorchServe in tests/integration/test_server_lifecycle.py)."""

import pytest

from segserve.serving.server import TorchServe
from tests.conftest import ROOT


def instance(tmp_path, monkeypatch, running_pid):
    server = TorchServe(run_dir=tmp_path, model_store=tmp_path, config_template=ROOT / "config.properties")
    calls = []
    monkeypatch.setattr(TorchServe, "start", lambda self, *a, **k: calls.append("start"))
    monkeypatch.setattr(TorchServe, "stop", lambda self, *a, **k: calls.append("stop") or "")
    monkeypatch.setattr(TorchServe, "running_pid", lambda self: running_pid)
    return server, calls


def test_the_block_starts_the_server_and_stops_it_after(tmp_path, monkeypatch):
    server, calls = instance(tmp_path, monkeypatch, None)
    with server as entered:
        assert entered is server and calls == ["start"]
    assert calls == ["start", "stop"]


def test_a_running_server_is_not_started_again_and_a_failing_block_still_stops_it(tmp_path, monkeypatch):
    server, calls = instance(tmp_path, monkeypatch, 1234)
    with pytest.raises(RuntimeError, match="boom"), server:
        raise RuntimeError("boom")
    assert calls == ["stop"]
