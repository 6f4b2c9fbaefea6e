"""`segserve profile` against a real TorchServe: py-spy from outside every worker, a torch.profiler trace per node."""

from segserve.bench.run.profiler import handler_costs, top_functions
from segserve.cli import main


def test_top_functions_count_own_and_total_samples_per_function(tmp_path):
    raw = tmp_path / "w.txt"
    raw.write_text(
        "main (a.py:1);forward (b.py:2);conv (c.py:3) 4\nmain (a.py:1);forward (b.py:2);conv (c.py:9) 2\n"
        "main (a.py:1);encode (d.py:4) 3\nmain (a.py:1) 1\n"
    )
    rows = {r["function"]: r for r in top_functions([raw])}
    assert rows["conv (c.py)"]["self_pct"] == 60.0 and rows["conv (c.py)"]["total_pct"] == 60.0  # its two lines together
    assert rows["main (a.py)"]["self_pct"] == 10.0 and rows["main (a.py)"]["total_pct"] == 100.0
    assert list(rows)[0] == "conv (c.py)"


def test_handler_costs_name_the_innermost_handler_frame(tmp_path):
    raw = tmp_path / "w.txt"
    raw.write_text(
        "loop (ts/x.py:1);handle (handlers/base.py:5);fill (handlers/segmentation.py:7);interpolate (torch/f.py:2) 3\n"
        "loop (ts/x.py:1);handle (handlers/base.py:5);encode (handlers/jpeg.py:9);__call__ (torch/_ops.py:1) 1\n"
        "loop (ts/x.py:1);recv (ts/y.py:3) 1\n"
    )
    rows = {r["function"]: r["pct"] for r in handler_costs([raw])}
    assert rows == {"fill (handlers/segmentation.py)": 60.0, "encode (handlers/jpeg.py)": 20.0, "outside handlers: recv (ts/y.py)": 20.0}


def test_profile_without_a_running_server_says_how_to_start_one(tmp_path, capsys):
    assert main(["profile", "seg_jpeg_fused", "--run-dir", str(tmp_path / "nothing"), "--seconds", "1"]) == 1
    assert "segserve serve --targets seg_jpeg_fused" in capsys.readouterr().err


def test_a_worker_batch_while_the_request_is_being_written_never_sees_it_half_written(tmp_path, monkeypatch):
    """A worker looks for its model's request file at every batch; it must never find one whose bytes are not
    written yet (make test, run 63: the seg node claimed an empty file, dropped it as bad JSON, and no trace came)."""
    from pathlib import Path

    from handlers.profiling import claim, request_path
    from segserve.bench.run.profiler import request_traces

    pending = request_path(tmp_path, "m")
    at_the_write = []

    def write_with_a_batch_in_between(self, text, *args, **kwargs):
        with open(self, "w") as handle:  # the file exists, still empty, from here on
            at_the_write.append(claim(pending))  # a worker's batch comes now
            return handle.write(text)

    monkeypatch.setattr(Path, "write_text", write_with_a_batch_in_between)
    traces = request_traces(tmp_path, ["m"], tmp_path / "out")
    assert at_the_write == [None]  # nothing there to take yet
    assert claim(pending) == str(traces["m"].resolve())  # the next batch takes the whole request


def test_a_ray_replicas_group_name_gives_a_file_in_the_profile_folder(tmp_path):
    """A Ray engine's replicas are grouped as "<model>/<pid>": py-spy was told to write into a folder that does not
    exist ("No such file or directory", no flame graph of any replica)."""
    import subprocess
    import sys

    from segserve.bench.run.profiler import finish_samplers, start_samplers

    sleeper = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: sum(range(10000))"])
    try:
        samplers = start_samplers({f"seg/{sleeper.pid}": [sleeper.pid]}, 1, 50, tmp_path)
        assert finish_samplers(samplers, timeout_s=60) == []
    finally:
        sleeper.kill()
        sleeper.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"seg-{sleeper.pid}-{sleeper.pid}.svg", f"seg-{sleeper.pid}-{sleeper.pid}.txt"]
