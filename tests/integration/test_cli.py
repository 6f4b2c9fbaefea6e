"""The `segserve` command as a user runs it."""

import socket

import pytest
import torch
from torchvision.io import decode_jpeg

from segserve.cli import main
from tests.conftest import ROOT


def server_args(server) -> list[str]:
    return ["--run-dir", str(server.run_dir), "--model-store", str(server.model_store), "--config", str(ROOT / "config.properties")]


def test_predict_writes_a_jpeg_per_image_at_its_size(server, tmp_path, capsys):
    images = sorted((ROOT / "samples").glob("*.jpg"))
    assert main(["predict", *map(str, images), "--out", str(tmp_path), *server_args(server)]) == 0
    printed = capsys.readouterr().out
    for image in images:
        result = tmp_path / f"{image.stem}.jpg"
        assert f"-> {result}" in printed and " ms" in printed
        sent = decode_jpeg(torch.frombuffer(bytearray(image.read_bytes()), dtype=torch.uint8))
        got = decode_jpeg(torch.frombuffer(bytearray(result.read_bytes()), dtype=torch.uint8))
        assert got.shape == sent.shape


def test_predict_reports_a_refused_image_and_exits_1(server, tmp_path, capsys):
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"not a jpeg")
    assert main(["predict", str(bad), "--out", str(tmp_path / "out"), *server_args(server)]) == 1
    captured = capsys.readouterr()
    assert "expected a JPEG or PNG image" in captured.out
    assert captured.err.strip() == "error: 1 of 1 request(s) failed"


def test_token_prints_the_generated_key(server, capsys):
    assert main(["token", "--api", "management", *server_args(server)]) == 0
    assert capsys.readouterr().out.strip() == server.token("management")


def test_predict_takes_a_folder_of_images(server, tmp_path, capsys):
    folder = tmp_path / "photos"
    folder.mkdir()
    for image in sorted((ROOT / "samples").glob("*.jpg"))[:2]:
        (folder / image.name.upper()).write_bytes(image.read_bytes())  # suffixes in any case
    (folder / "notes.txt").write_text("not an image")
    assert main(["predict", str(folder), "--out", str(tmp_path / "out"), *server_args(server)]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(p.stem + ".jpg" for p in folder.glob("*.JPG"))


def consecutive_free_ports(count: int = 3) -> int:
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        try:
            for offset in range(count):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", base + offset))
            return base
        except OSError:
            continue
    raise RuntimeError("no run of free ports")


def test_serve_predict_and_stop_from_the_command_line(model_store, tmp_path, capsys):
    args = ["--run-dir", str(tmp_path / "run"), "--model-store", str(model_store), "--config", str(ROOT / "config.properties")]
    port = consecutive_free_ports(5)
    assert main(["serve", "--port-base", str(port), *args]) == 0
    try:
        assert f"/wfpredict/seg_jpeg, /predictions/seg_jpeg_fused at http://127.0.0.1:{port}" in capsys.readouterr().out
        assert main(["predict", str(ROOT / "samples" / "shapes_1.jpg"), "--out", str(tmp_path / "out"), *args]) == 0
        assert (tmp_path / "out" / "shapes_1.jpg").read_bytes()[:2] == b"\xff\xd8"
        pid = int((tmp_path / "run" / "server.pid").read_text())
    finally:
        assert main(["serve", "--stop", *args]) == 0
    assert "TorchServe stopped" in capsys.readouterr().out
    with pytest.raises(ProcessLookupError):
        import os

        os.kill(pid, 0)


@pytest.mark.parametrize(
    "served, scaled, what",
    [("seg_jpeg", {"seg_jpeg__seg", "seg_jpeg__jpeg"}, "nodes"), ("seg_jpeg_fused", {"seg_jpeg_fused"}, "workers × threads")],
)
def test_serve_autoscale_logs_decisions_pin_show_lists_them_and_stop_ends_it(model_store, tmp_path, capsys, served, scaled, what):
    import json
    import time

    import psutil

    args = ["--run-dir", str(tmp_path / "run"), "--model-store", str(model_store), "--config", str(ROOT / "config.properties")]
    assert main(["serve", "--autoscale", "--targets", "seg", *args]) == 2  # no workflow or fused pipeline to scale
    assert "serve one (--targets seg_jpeg)" in capsys.readouterr().err
    assert main(["serve", "--autoscale", "--targets", served, "--port-base", str(consecutive_free_ports(5)), *args]) == 0
    decisions = tmp_path / "run" / "autoscale.jsonl"
    try:
        out = capsys.readouterr().out
        assert f"autoscaling {served}'s {what} (pid " in out
        pid = int(out.split("(pid ")[1].split(")")[0])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (decisions.exists() and decisions.read_text().endswith("\n")):
            time.sleep(0.5)  # a whole first line: the file exists a moment before it is written
        first = json.loads(decisions.read_text().splitlines()[0])
        assert {m["node"] for m in first["metrics"]} == scaled and first["why"]
        assert main(["pin", "--show", *args]) == 0
        assert "autoscaler, last decisions:" in capsys.readouterr().out
    finally:
        assert main(["serve", "--stop", *args]) == 0
    assert "autoscaler pid" in capsys.readouterr().out
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
