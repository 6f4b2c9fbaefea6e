"""Exports to real HTTP endpoints on loopback, started here: S3 and CloudWatch (moto's standalone server; the code
does not know it is not AWS) and Debian's prometheus-pushgateway; what was sent is read back through the same
public APIs and compared with the local result folder."""

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

import boto3
import pytest

from segserve.bench.results.export import samples
from segserve.cli import main
from tests.unit.test_export import folder, free_port, pushgateway, record, wait_for  # noqa: F401 (fixtures among them)


@pytest.fixture(scope="module")
def aws(tmp_path_factory):
    """moto's server on a free loopback port, with fake credentials in the environment (as a user's would be)."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(url + "/moto-api/", process)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def objects(s3, bucket: str, prefix: str) -> dict[str, bytes]:
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return {o["Key"]: s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in listed}


def test_s3_gets_the_whole_folder_once_and_a_rerun_finishes_an_interrupted_upload(aws, folder, capsys):
    s3 = boto3.client("s3", endpoint_url=aws)
    s3.create_bucket(Bucket="results-a")
    dest = "s3://results-a/team"
    assert main(["export", str(folder), dest, "--endpoint-url", aws]) == 0
    assert "8 object(s) sent, 0 already there" in capsys.readouterr().out
    local = {f"team/quick/20261201T000000Z/{p.relative_to(folder).as_posix()}": p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    sent = objects(s3, "results-a", "team/")
    exported = [json.loads(line) for line in sent.pop("team/quick/20261201T000000Z/metrics.jsonl").decode().splitlines()]
    assert sent == local and "team/quick/20261201T000000Z/pipelines.jsonl" in sent
    assert len(exported) == len(samples(folder))
    node = next(x for x in exported if x["metric"] == "node_queue_ms" and x["node"] == "seg_jpeg__seg" and x["run_id"] == "seg_jpeg-aaaa")
    assert node["value"] == 5.0 and node["unit"] == "Milliseconds" and node["suite"] == "quick"
    head = s3.head_object(Bucket="results-a", Key="team/quick/20261201T000000Z/report.md")
    assert head["ContentType"] == "text/markdown"
    assert s3.head_object(Bucket="results-a", Key="team/quick/20261201T000000Z/summary.jsonl")["ContentType"] == "application/x-ndjson"

    # an upload killed after some objects: the rest is sent by running the command again, nothing twice
    s3.delete_object(Bucket="results-a", Key="team/quick/20261201T000000Z/report.md")
    s3.delete_object(Bucket="results-a", Key="team/quick/20261201T000000Z/runs/seg_jpeg-bbbb.json")
    (folder / "summary.csv").write_text("changed\n")
    local["team/quick/20261201T000000Z/summary.csv"] = b"changed\n"
    assert main(["export", str(folder), dest, "--endpoint-url", aws]) == 0
    assert "3 object(s) sent, 5 already there" in capsys.readouterr().out
    sent = objects(s3, "results-a", "team/")
    sent.pop("team/quick/20261201T000000Z/metrics.jsonl")
    assert sent == local


def test_cloudwatch_gets_every_point_and_node_metric(aws, folder, capsys):
    assert main(["export", str(folder), "cloudwatch://segserve-test", "--endpoint-url", aws]) == 0
    printed = capsys.readouterr().out
    expected = samples(folder)
    assert f"{len(expected)} metric value(s)" in printed
    cloudwatch = boto3.client("cloudwatch", endpoint_url=aws)
    names = {m["MetricName"] for m in cloudwatch.list_metrics(Namespace="segserve-test")["Metrics"]}
    assert {"throughput_rps", "latency_p99_ms", "node_node_ms", "node_queue_ms", "node_handler_ms_per_request", "node_cpu_pct"} <= names
    assert {"pipeline_ratio_shared", "pipeline_shared_bound_rps", "pipeline_ratio_disjoint_ci_low"} <= names
    assert "pipeline_ratio_disjoint" not in names  # withheld as uncertain: no number to send
    dimensions = [
        {"Name": "suite", "Value": "quick"},
        {"Name": "target", "Value": "seg_jpeg"},
        {"Name": "run_id", "Value": "seg_jpeg-bbbb"},
    ]
    dimensions.append({"Name": "batch_size", "Value": "8"})
    queries = [
        {
            "Id": "t",
            "MetricStat": {
                "Metric": {"Namespace": "segserve-test", "MetricName": "throughput_rps", "Dimensions": dimensions},
                "Period": 60,
                "Stat": "Maximum",
            },
        },
        {
            "Id": "n",
            "MetricStat": {
                "Metric": {
                    "Namespace": "segserve-test",
                    "MetricName": "node_node_ms",
                    "Dimensions": [*dimensions, {"Name": "node", "Value": "seg_jpeg__seg"}],
                },
                "Period": 60,
                "Stat": "Maximum",
            },
        },
        {
            "Id": "p",
            "MetricStat": {
                "Metric": {
                    "Namespace": "segserve-test",
                    "MetricName": "pipeline_ratio_shared",
                    "Dimensions": [{"Name": "suite", "Value": "quick"}, {"Name": "pipeline", "Value": "seg_jpeg"}],
                },
                "Period": 60,
                "Stat": "Maximum",
            },
        },
    ]
    now = time.time()
    answer = cloudwatch.get_metric_data(MetricDataQueries=queries, StartTime=now - 600, EndTime=now + 600)
    values = {r["Id"]: r["Values"] for r in answer["MetricDataResults"]}
    assert values == {"t": [75.0], "n": [20.0], "p": [1.0]}


def test_pushgateway_gets_the_same_metrics_grouped_by_suite_and_run(pushgateway, folder, capsys):
    assert main(["export", str(folder), f"pushgateway://{pushgateway}"]) == 0
    assert "gauge(s), group suite=quick run=20261201T000000Z" in capsys.readouterr().out
    text = urllib.request.urlopen(f"http://{pushgateway}/metrics", timeout=10).read().decode()
    lines = [line for line in text.splitlines() if line.startswith("segserve_throughput_rps{")]
    assert len(lines) == 2
    line = next(line for line in lines if 'run_id="seg_jpeg-bbbb"' in line)
    assert 'suite="quick"' in line and 'run="20261201T000000Z"' in line and 'batch_size="8"' in line and line.endswith(" 75")
    assert any(line.startswith("segserve_node_queue_ms{") and 'node="seg_jpeg__jpeg"' in line for line in text.splitlines())
    (ratio,) = [line for line in text.splitlines() if line.startswith("segserve_pipeline_ratio_shared{")]
    assert 'pipeline="seg_jpeg"' in ratio and 'run="20261201T000000Z"' in ratio and ratio.endswith(" 1")


@pytest.mark.parametrize(
    ("dest", "message"),
    [
        ("s3://no-such-bucket/x", "error: --export s3://no-such-bucket/x: 404"),
        ("cloudwatch://AWS/EC2", "error: --export cloudwatch://AWS/EC2: a namespace such as"),
        ("ftp://somewhere", "error: --export 'ftp://somewhere': one of s3://"),
    ],
)
def test_bad_destinations_are_one_error_line(aws, folder, capsys, dest, message):
    assert main(["export", str(folder), dest, "--endpoint-url", aws]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


def test_a_suite_with_a_bad_export_fails_before_measuring(aws, tmp_path, capsys):
    weights = tmp_path / "w.pt"
    weights.write_bytes(b"unused")
    suite = tmp_path / "s.yaml"
    suite.write_text('targets: [seg]\ninputs: [{images: ["samples/*.jpg"]}]\n')
    args = ["bench", str(suite), "--weights", str(weights), "--results", str(tmp_path / "r"), "--endpoint-url", aws]
    assert main([*args, "--export", "s3://missing-bucket/p"]) == 2
    assert "error: --export s3://missing-bucket/p: 404" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_query_reads_runs_exported_to_s3(aws, folder, tmp_path, capsys):
    """Two runs exported under one prefix are one table, with their suite and timestamp from the keys."""
    boto3.client("s3", endpoint_url=aws).create_bucket(Bucket="results-q")
    other = tmp_path / "results" / "grid" / "20261202T000000Z"
    shutil.copytree(folder, other)
    for run in (folder, other):
        assert main(["export", str(run), "s3://results-q/shared", "--endpoint-url", aws]) == 0
    capsys.readouterr()
    args = ["results", "query", "s3://results-q/shared", "--endpoint-url", aws, "--where", "throughput_rps>70", "--format", "json"]
    assert main(args) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sorted((r["suite"], r["timestamp"], r["run_id"]) for r in rows) == [
        ("grid", "20261202T000000Z", "seg_jpeg-bbbb"),
        ("quick", "20261201T000000Z", "seg_jpeg-bbbb"),
    ]
    # each run's pipelines.jsonl came down with its summary
    assert main([*args[:5], "--pipelines", "--where", "ratio_shared>=1", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sorted((r["suite"], r["pipeline"], r["ratio_shared"]) for r in rows) == [("grid", "seg_jpeg", 1.0), ("quick", "seg_jpeg", 1.0)]
    assert main(["results", "query", "s3://results-q/nothing-here", "--endpoint-url", aws]) == 2
    assert "no exported run" in capsys.readouterr().err


def test_a_run_given_locally_and_in_s3_is_one_run(aws, folder, capsys):
    boto3.client("s3", endpoint_url=aws).create_bucket(Bucket="results-twice")
    assert main(["export", str(folder), "s3://results-twice/p", "--endpoint-url", aws]) == 0
    capsys.readouterr()
    assert main(["results", "query", str(folder), "s3://results-twice/p", "--endpoint-url", aws, "--format", "json"]) == 0
    assert sorted(r["run_id"] for r in json.loads(capsys.readouterr().out)) == ["seg_jpeg-aaaa", "seg_jpeg-bbbb"]
