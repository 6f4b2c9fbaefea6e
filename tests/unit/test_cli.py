"""The `segserve` command as a user runs it."""

import subprocess
import sys

from segserve.cli import main
from tests.conftest import ROOT


def test_missing_image_is_a_usage_error(tmp_path, capsys):
    assert main(["predict", str(tmp_path / "nope.jpg"), "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("error: no such image or folder:")


def test_a_folder_without_images_is_a_usage_error(tmp_path, capsys):
    assert main(["predict", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {tmp_path} is a folder without .jpg/.jpeg/.png files"


def test_build_with_missing_weights_is_a_usage_error(tmp_path, capsys):
    assert main(["build", "--weights", str(tmp_path / "mine.pt"), "--model-store", str(tmp_path)]) == 2
    assert "no such file" in capsys.readouterr().err


def test_instances_started_at_once_are_handed_different_ports_and_worker_ranges():
    # `bench ab` starts two TorchServes in two threads: each binds its ports only after both have chosen them
    from concurrent.futures import ThreadPoolExecutor

    from segserve.serving.ts_config import free_worker_port_base, loopback_ports

    with ThreadPoolExecutor(4) as pool:
        chosen = list(pool.map(lambda _: (loopback_ports(None), free_worker_port_base()), range(4)))
    ports = [value.rsplit(":", 1)[-1] for addresses, _ in chosen for value in addresses.values()]
    assert len(ports) == len(set(ports)) == 20
    assert len({base for _, base in chosen}) == 4


def claimed_in_another_process(chooser: str):
    """(a live child process, what segserve.serving.ts_config.<chooser>() handed it); it holds its claim until
    it reads a line."""
    import subprocess
    import sys

    other = subprocess.Popen(
        [sys.executable, "-c", f"from segserve.serving.ts_config import {chooser} as f; print(f(), flush=True); input()"],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    return other, int(other.stdout.readline())


def test_a_worker_range_another_live_process_claimed_is_not_handed_out(monkeypatch):
    """Two bench processes (a shared study) start servers at once: a range whose server has no sockets yet is
    still taken while the process that chose it lives."""
    import os

    from segserve.serving import ts_config

    other, theirs = claimed_in_another_process("free_worker_port_base")
    try:
        monkeypatch.setattr(os, "getpid", lambda: other.pid)  # start the search where the other process did
        monkeypatch.setattr(ts_config, "_HANDED_OUT_WORKER_BASES", set())
        ours = ts_config.free_worker_port_base()
        assert ours != theirs, theirs
    finally:
        other.communicate("\n", timeout=30)


def test_free_ports_lie_below_the_ephemeral_range_and_a_port_another_process_claimed_is_not_handed_out(monkeypatch):
    """An outgoing connection of any process takes its port from the ephemeral range, so a free port chosen
    there can be gone when the JVM binds it; and two processes choosing at once must not pick the same one."""
    import os

    from segserve.serving import ts_config

    low, _ = ts_config.ephemeral_port_range()
    other, theirs = claimed_in_another_process("free_port")
    try:
        monkeypatch.setattr(os, "getpid", lambda: other.pid)  # start the search where the other process did
        monkeypatch.setattr(ts_config, "_HANDED_OUT_PORTS", {})
        ours = ts_config.free_port()
        assert ours != theirs and max(ours, theirs) < low, (ours, theirs, low)
        ts_config.release_ports([ours])
        assert ts_config.free_port() == ours  # given back: free to hand out again
        ts_config.release_ports([ours])
    finally:
        other.communicate("\n", timeout=30)
    monkeypatch.setattr(ts_config, "_HANDED_OUT_PORTS", {})
    assert ts_config.free_port() == theirs  # the other process ended: its claim went with it


def test_the_cli_starts_without_torch():
    """`segserve` is a short-lived process (scale, token, serve --stop, the doc check's walkthroughs): reading the
    catalog's DAGs and parsing arguments import no torch (1.5 s); a command that needs it imports it itself."""
    heavy = "('torch', 'torchvision', 'numpy')"
    check = f"import sys, segserve.cli; segserve.cli.parser(); print(sorted(m for m in {heavy} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr[-2000:]


def test_an_error_is_printed_with_its_escapes_shown_not_obeyed(tmp_path, capsys):
    # an error may quote a worker, an answer or a file name: an ANSI escape or a CR in it must not reach the terminal
    assert main(["predict", str(tmp_path / "x\x1b[2J\r.jpg"), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: no such image or folder: {tmp_path}/x\\x1b[2J .jpg\n", err
