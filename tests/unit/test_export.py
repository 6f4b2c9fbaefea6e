"""Exports to real HTTP endpoints on loopback, started here: S3 and CloudWatch (moto's standalone server; the code
does not know it is not AWS) and Debian's prometheus-pushgateway; what was sent is read back through the same
public APIs and compared with the local result folder."""

import json
import shutil
import subprocess
import time
import urllib.request

import pytest

from segserve.bench.results.export import samples
from segserve.bench.results.store import write_pipelines
from segserve.cli import main
from segserve.serving.ts_config import free_port


def wait_for(url: str, process, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s  # moto's imports alone take seconds on busy cores
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url}: the server exited ({process.returncode})")
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer in {timeout_s:.0f} s")


@pytest.fixture(scope="module")
def pushgateway(tmp_path_factory):
    binary = shutil.which("prometheus-pushgateway")
    if binary is None:
        pytest.skip("prometheus-pushgateway is not installed and `make setup-pushgateway` could not install it (apt)")
    port = free_port()
    # Debian's build persists to /var/lib/prometheus/pushgateway.data by default, shared with every other one:
    # a file of our own, so the test sees only what it pushed
    state = tmp_path_factory.mktemp("pushgateway") / "state.data"
    command = [binary, f"--web.listen-address=127.0.0.1:{port}", f"--persistence.file={state}"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(f"http://127.0.0.1:{port}/-/ready", process)
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)


def record(run_id: str, batch_size: int, rps: float) -> dict:
    return {
        "run_id": run_id,
        "target": "seg_jpeg",
        "workers": 1,
        "batch_size": batch_size,
        "throughput_rps": rps,
        "latency_p99_ms": 1000.0 / rps,
        "requests_failed": 0,
        "error": None,
        "server_models": {
            "seg_jpeg__seg": {"queue_ms": 5.0, "inference_ms": 20.0},
            "seg_jpeg__jpeg": {"queue_ms": 1.0, "inference_ms": 4.0},
        },
        "server_stages": {"seg_jpeg__seg": {"predict_ms": 12.0, "decode_ms": 2.0, "encode_ms": 0.0}},
        "server_processes": {"seg_jpeg__seg/11": {"cpu_pct": 80.0}, "seg_jpeg__jpeg/12": {"cpu_pct": 20.0}},
    }


# seg_jpeg's row of the efficiency table: its ratio to the disjoint bound withheld as uncertain (its interval is known)
PIPELINE_ROW = {
    "pipeline": "seg_jpeg",
    "pipeline_rps": 75.0,
    "members": "seg 100.0, jpeg 300.0",
    "seg_rps": 100.0,
    "jpeg_rps": 300.0,
    "shared_bound_rps": 75.0,
    "disturbed": False,
    "ratio_shared": 1.0,
    "ratio_shared_ci_low": 0.97,
    "ratio_shared_ci_high": 1.03,
    "disjoint_bound_rps": 100.0,
    "ratio_disjoint": None,
    "ratio_disjoint_ci_low": 0.5,
    "ratio_disjoint_ci_high": 0.95,
    "bare_rps": None,
    "ratio_bare": None,
    "ratio_bare_ci_low": None,
    "ratio_bare_ci_high": None,
    "bare_batch_size": None,
    "bare_threads": None,
    "ratio_shared_uncertain": None,
    "ratio_disjoint_uncertain": "uncertain (0.5–0.95): the pipeline or a member was disturbed",
    "ratio_bare_uncertain": None,
}


@pytest.fixture
def folder(tmp_path):
    """A result folder as `segserve bench` leaves it (results/<suite>/<timestamp>/)."""
    out = tmp_path / "results" / "quick" / "20261201T000000Z"
    (out / "runs").mkdir(parents=True)
    (out / "plots").mkdir()
    records = [record("seg_jpeg-aaaa", 4, 60.0), record("seg_jpeg-bbbb", 8, 75.0)]
    for r in records:
        (out / "runs" / f"{r['run_id']}.json").write_text(json.dumps(r))
    (out / "summary.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (out / "summary.csv").write_text("run_id,target,workers,batch_size,throughput_rps\n")
    (out / "report.md").write_text("# Benchmark report: quick\n")
    write_pipelines(out, [PIPELINE_ROW])
    (out / "plots" / "p.png").write_bytes(b"\x89PNG\r\n\x1a\nfake")
    return out


def test_an_unreachable_endpoint_or_pushgateway_is_named(folder, capsys, monkeypatch):
    # credentials as a user's would be (it ran after the moto tests, which set them, before the tiers split)
    for key, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(key, value)
    port = free_port()  # nothing listens there
    assert main(["export", str(folder), "s3://bucket/x", "--endpoint-url", f"http://127.0.0.1:{port}"]) == 2
    assert "error: --export s3://bucket/x: Could not connect to the endpoint URL" in capsys.readouterr().err
    assert main(["export", str(folder), f"pushgateway://127.0.0.1:{port}"]) == 2
    assert f"error: --export pushgateway://127.0.0.1:{port}: the Pushgateway does not answer" in capsys.readouterr().err


def test_a_destination_failing_after_the_suite_keeps_the_results_and_says_how_to_finish(tmp_path):
    import types

    from segserve.bench.results.sinks import Export

    class Broken:
        dest = "s3://bucket/prefix"

        def export(self, folder):
            raise RuntimeError("connection reset")

    said: list[str] = []
    Export([Broken()], said.append).finish(types.SimpleNamespace(out_dir=tmp_path))
    assert said == [
        f"export s3://bucket/prefix failed (connection reset); the results are complete in {tmp_path}; finish with:",
        f"  segserve export {tmp_path} s3://bucket/prefix",
    ]


def test_the_samples_carry_each_pipelines_bounds_and_ratios_but_no_withheld_ratio(folder):
    found = {x.metric: x for x in samples(folder) if x.metric.startswith("pipeline_")}
    assert {name: x.value for name, x in found.items()} == {
        "pipeline_rps": 75.0,
        "pipeline_shared_bound_rps": 75.0,
        "pipeline_disjoint_bound_rps": 100.0,
        "pipeline_ratio_shared": 1.0,
        "pipeline_ratio_shared_ci_low": 0.97,
        "pipeline_ratio_shared_ci_high": 1.03,
        "pipeline_ratio_disjoint_ci_low": 0.5,  # the ratio itself is uncertain, so not sent; its interval is
        "pipeline_ratio_disjoint_ci_high": 0.95,
        "pipeline_ratio_shared_uncertain": 0.0,  # judged a number
        "pipeline_ratio_disjoint_uncertain": 1.0,  # withheld: the exports say so (#59), pipelines.jsonl says why
    }
    assert found["pipeline_ratio_shared"].labels == {"suite": "quick", "pipeline": "seg_jpeg"}
    assert found["pipeline_ratio_shared"].unit is None and found["pipeline_shared_bound_rps"].unit == "Count/Second"
    # a folder from before pipelines.jsonl: the points' samples only
    (folder / "pipelines.jsonl").unlink()
    assert samples(folder) and not [x for x in samples(folder) if "pipeline" in x.labels]


def test_the_engine_labels_a_points_samples_where_it_varies_and_a_ray_pipelines_row(folder):
    ray = record("seg_jpeg-cccc", 8, 90.0) | {"engine": "ray"}
    (folder / "runs" / "seg_jpeg-cccc.json").write_text(json.dumps(ray))
    write_pipelines(folder, [PIPELINE_ROW | {"engine": "ray"}])
    throughput = {s.labels["run_id"]: s.labels for s in samples(folder) if s.metric == "throughput_rps"}
    assert throughput["seg_jpeg-cccc"]["engine"] == "ray"
    assert "engine" not in throughput["seg_jpeg-aaaa"]  # a record from before the Ray engine: TorchServe's, unlabelled
    pipeline = next(s for s in samples(folder) if s.metric == "pipeline_rps")
    assert pipeline.labels["engine"] == "ray"
