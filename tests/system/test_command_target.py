"""A command target: a server the suite starts for each of its own settings, measures once healthy and stops by its
processes (how benchmarks/peers.yaml measures LitServe, Ray Serve and Triton beside segserve)."""

import json
import sys
import textwrap
from pathlib import Path

import psutil

from segserve.cli import main
from segserve.serving.processes import MARKER

SERVER = Path(__file__).with_name("command_server.py")
LOAD = "load: {warmup_s: 0.3, window_s: 0.5, stable_windows: 2, max_windows: 3, stability_tolerance: 0.5}"


def marked_processes() -> list[psutil.Process]:
    """Processes that carry a command target's run folder (segserve-peer-…) in their environment."""
    found = []
    for process in psutil.process_iter():
        try:
            if "segserve-peer-" in process.environ().get(MARKER, ""):
                found.append(process)
        except psutil.Error:
            continue
    return found


def test_a_command_target_is_started_per_setting_measured_with_its_processes_and_stopped(tmp_path, capsys):
    started = tmp_path / "started.jsonl"
    suite = tmp_path / "peers.yaml"
    suite.write_text(
        textwrap.dedent(
            f"""
            targets:
              - name: peer
                command: [{sys.executable}, {SERVER}, --port, "{{port}}", --delay-ms, "{{delay_ms}}", --started-log, {started}]
                params: {{delay_ms: [0, 5]}}
                packages: [psutil, no-such-package]
              - name: tritonlike
                command: [{sys.executable}, {SERVER}, --port, "{{port}}", --mode, v2, --started-log, {started}]
                path: /v2/models/seg_jpeg/infer
                protocol: kserve-v2-binary
              - name: broken
                command: [{sys.executable}, {SERVER}, --port, "{{port}}", --mode, fail, --started-log, {started}]
              - name: absent
                command: [.no-such-venv/bin/python, app.py, --port, "{{port}}"]
              - name: orphaning
                command: [{sys.executable}, {SERVER}, --port, "{{port}}", --mode, orphan, --started-log, {started}]
            inputs: [{{images: ["samples/shapes_0.jpg"]}}]
            grid: {{load: {{concurrency: [2]}}}}
            {LOAD}
            """
        )
    )
    assert main(["bench", str(suite), "--results", str(tmp_path / "results")]) == 0
    log = capsys.readouterr().out
    (folder,) = (tmp_path / "results" / "peers").iterdir()
    rows = [json.loads(line) for line in (folder / "summary.jsonl").read_text().splitlines()]
    records = {r["run_id"]: r for r in map(json.loads, (p.read_text() for p in (folder / "runs").glob("*.json")))}
    by_target = {}
    for row in rows:
        by_target.setdefault(row["target"], []).append(records[row["run_id"]])

    # one start per setting, each with its own value in place of {delay_ms}; measured with its processes' CPU and RSS
    peer = sorted(by_target["peer"], key=lambda r: r["delay_ms"])
    assert [r["delay_ms"] for r in peer] == [0, 5]
    starts = [json.loads(line) for line in started.read_text().splitlines()]
    assert [s[s.index("--delay-ms") + 1] for s in starts if "--delay-ms" in s] == ["0", "5"]
    for record in peer:
        assert record["error"] is None and record["requests_ok"] > 0 and record["requests_failed"] == 0, record
        assert record["server_rss_mb"] > 5 and record["server_cpu_pct"] is not None
        assert list(record["server_processes"]) == [Path(sys.executable).name]  # by executable: here the one server
        assert record["target_kind"] == "command"
        assert record["server_versions"] == {"psutil": psutil.__version__, "no-such-package": None}
    # the v2 requests were well formed: the server answers 400 to anything else
    (tritonlike,) = by_target["tritonlike"]
    assert tritonlike["error"] is None and tritonlike["requests_failed"] == 0 and tritonlike["requests_ok"] > 0, tritonlike

    # a command that exits before it is healthy fails its point with its own log's last lines; the suite goes on
    (broken,) = by_target["broken"]
    assert broken["error"].startswith("RuntimeFailure: broken: its command exited with 1 before /health answered")
    assert broken["error"].endswith("its log ends: no model here: weights/missing.pt")
    (absent,) = by_target["absent"]
    assert absent["error"] == "RuntimeFailure: absent: cannot run .no-such-venv/bin/python (No such file or directory)"
    (orphaning,) = by_target["orphaning"]
    assert "its command exited with 3" in orphaning["error"]
    assert "left processes running after its command exited; stopped: pid " in orphaning["error"]
    assert orphaning["error"].endswith("its log ends: crashed, leaving a child behind")
    assert "orphaning: left processes running after its command exited" in log
    assert marked_processes() == []  # nothing of any start is left running

    report = (folder / "report.md").read_text()
    assert "## Side by side: peer servers and segserve" in report
