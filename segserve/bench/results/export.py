"""Results where teams look (`segserve bench SUITE --export DEST`, `segserve export RESULTS DEST`):

- `s3://bucket/prefix`: the whole result folder under prefix/<suite>/<timestamp>/ (so that many runs share a
  prefix and `segserve results query s3://bucket/prefix` finds them), each file with its content type; idempotent (an object whose
  MD5 — its ETag, for a single-part upload — matches the local file is not sent again), so an interrupted
  upload is finished by running the command again;
- `cloudwatch://Namespace`: each point's metrics as CloudWatch metric data, dimensions suite, target, run id
  and each swept parameter; botocore's adaptive retry mode backs off on throttling;
- `pushgateway://host:port`: the same metrics as Prometheus gauges (prometheus-client), grouped by suite
  and run.

Every destination also gets the per-node time breakdown (node time, queue, handler time, CPU) and each
pipeline's efficiency (pipelines.jsonl: its rate, its members' bounds, the ratios and their intervals) as metrics.
A destination is checked (credentials, bucket, namespace, reachability) before a suite measures anything.
"""

import json
import math
import mimetypes
import time
from dataclasses import dataclass
from pathlib import Path

from segserve.archives.s3_prefix import aws_call
from segserve.bench.results.analysis import node_times
from segserve.bench.results.store import IDENTITY_KEYS, read_pipelines, read_runs
from segserve.bench.suite.columns import BASE_COLUMNS, EXTRA_COLUMNS, METRICS
from segserve.errors import RuntimeFailure, UsageError

CLOUDWATCH_BATCH = 500  # metric data per PutMetricData call (the API takes 1000 and 1 MB)
CLOUDWATCH_UNITS = {"ms": "Milliseconds", "s": "Seconds", "req/s": "Count/Second", "bytes": "Bytes", "MB": "Megabytes"}
METRICS_OBJECT = "metrics.jsonl"  # S3: every exported sample, one JSON object per line
PARAM_COLUMNS = ("engine", "workers", "batch_size", "max_batch_delay_ms", "concurrency", "request_rate_rps")  # in BASE_COLUMNS
NODE_METRICS = ("node_ms", "queue_ms", "handler_ms_per_request", "cpu_pct")
NODE_UNITS = {"node_ms": "Milliseconds", "queue_ms": "Milliseconds", "handler_ms_per_request": "Milliseconds", "cpu_pct": "Percent"}
# each pipeline's row of the efficiency table (pipelines.jsonl) as metrics: name → (its key in the row, unit, what it
# is); a ratio withheld as uncertain has no value and is not sent, its interval is, and its _uncertain flag is 1
_RATIOS = {"shared": "shared bound", "disjoint": "disjoint bound", "bare": "the bare forward's throughput"}
PIPELINE_METRICS = {
    "pipeline_rps": ("pipeline_rps", "Count/Second", "the pipeline's best throughput under the constraints (else its best served point's)"),
    "pipeline_lost_answers": ("lost_answers", None, "answers its workflow executor never received at that point (lost_answers)"),
    "pipeline_shared_bound_rps": ("shared_bound_rps", "Count/Second", "what its members allow on shared CPUs: 1/sum(1/member_rps)"),
    "pipeline_disjoint_bound_rps": ("disjoint_bound_rps", "Count/Second", "what its members allow on disjoint CPUs: min(member_rps)"),
}
for _ratio, _over in _RATIOS.items():
    PIPELINE_METRICS[f"pipeline_ratio_{_ratio}"] = (f"ratio_{_ratio}", None, f"pipeline_rps / {_over}")
    for _end in ("low", "high"):
        _what = f"ratio_{_ratio}: {_end} end of its 95% interval"
        PIPELINE_METRICS[f"pipeline_ratio_{_ratio}_ci_{_end}"] = (f"ratio_{_ratio}_ci_{_end}", None, _what)
    _what = f"1 when ratio_{_ratio} is withheld as uncertain (pipelines.jsonl says why), 0 when it is a number"
    PIPELINE_METRICS[f"pipeline_ratio_{_ratio}_uncertain"] = (f"ratio_{_ratio}_uncertain", None, _what)


@dataclass(frozen=True)
class Sample:
    """One exported number: a metric of a point (node: None) or of one of its nodes."""

    metric: str
    value: float
    labels: dict  # suite, target, run_id, the swept parameters (and node)
    unit: str | None


def samples(folder: Path) -> list[Sample]:
    """Every point's metrics (METRICS) and its nodes' times, labelled with the suite, target, run id and the
    parameters the suite sweeps; then each pipeline's efficiency (pipeline_samples)."""
    records = list(read_runs(folder).values())
    suite = folder.parent.name
    fixed = set(BASE_COLUMNS) | set(EXTRA_COLUMNS) | set(IDENTITY_KEYS)
    # a parameter is a label where it varies between the folder's points (a fixed one tells nothing apart)
    params = set(PARAM_COLUMNS) | _swept(folder, fixed)
    swept = sorted(name for name in params if len({str(r.get(name)) for r in records}) > 1)
    out = []
    for record in records:
        if record.get("error"):
            continue
        labels = {"suite": suite, "target": record["target"], "run_id": record["run_id"]}
        labels |= {name: str(record.get(name)) for name in swept if record.get(name) is not None}
        for tag, metric in METRICS.items():
            value = record.get(tag)
            if _is_number(value):
                out.append(Sample(tag, float(value), labels, CLOUDWATCH_UNITS.get(metric.unit)))
        for node, times in node_times(record).items():
            for tag in NODE_METRICS:
                if times.get(tag) is not None:
                    out.append(Sample(f"node_{tag}", float(times[tag]), {**labels, "node": node}, NODE_UNITS[tag]))
    return out + pipeline_samples(folder)


def pipeline_samples(folder: Path) -> list[Sample]:
    """Each pipeline's numbers of the efficiency table (PIPELINE_METRICS), labelled with the suite and the
    pipeline; only those it has (a folder without pipelines.jsonl has none)."""
    out = []
    for row in read_pipelines(folder):
        labels = {"suite": folder.parent.name, "pipeline": row["pipeline"]}
        if row.get("engine") not in (None, "torchserve"):  # a TorchServe row keeps the labels it always had
            labels["engine"] = row["engine"]
        for metric, (key, unit, _) in PIPELINE_METRICS.items():
            value = row.get(key)
            if key.endswith("_uncertain"):  # a reason (text) or None: sent as a flag where the ratio was judged
                value = None if value is None and row.get(key.removesuffix("_uncertain")) is None else float(value is not None)
            if _is_number(value):
                out.append(Sample(metric, float(value), labels, unit))
    return out


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _swept(folder: Path, fixed: set[str]) -> set[str]:
    """The swept parameters: the summary's columns that are neither fixed columns nor identity."""
    path = folder / "summary.csv"
    if not path.is_file():
        return set()
    header = path.read_text().splitlines()[0].split(",")
    return {column for column in header if column not in fixed}


class S3:
    def __init__(self, dest: str, endpoint_url: str | None):
        from segserve.archives.s3_prefix import S3Prefix

        self.dest = dest
        self.store = S3Prefix(dest, endpoint_url)
        self.client, self.bucket, self.prefix = self.store.client, self.store.bucket, self.store.prefix

    def check(self) -> None:
        self.store.check()

    def export(self, folder: Path) -> str:
        """Send what is missing or changed, under <prefix>/<suite>/<timestamp>/ (the folder is
        results/<suite>/<timestamp>/); returns what it did, in words."""
        remote = self.store.etags()
        sent = kept = 0
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            key = self.store.key(f"{folder.parent.name}/{folder.name}/{path.relative_to(folder).as_posix()}")
            content_type = mimetypes.guess_type(path.name)[0] or _CONTENT_TYPES.get(path.suffix, "application/octet-stream")
            if self.store.put_if_changed(key, path.read_bytes(), content_type, remote):
                sent += 1
            else:
                kept += 1
        # the same metric samples the other destinations get (points and per-node times), as data
        lines = "".join(json.dumps({"metric": x.metric, "value": x.value, "unit": x.unit, **x.labels}) + "\n" for x in samples(folder))
        key = self.store.key(f"{folder.parent.name}/{folder.name}/{METRICS_OBJECT}")
        if self.store.put_if_changed(key, lines.encode(), "application/x-ndjson", remote):
            sent += 1
        else:
            kept += 1
        return f"{sent} object(s) sent, {kept} already there"


_CONTENT_TYPES = {".jsonl": "application/x-ndjson", ".md": "text/markdown", ".yaml": "application/yaml", ".log": "text/plain"}


class CloudWatch:
    def __init__(self, dest: str, endpoint_url: str | None):
        import boto3
        from botocore.config import Config

        self.dest, self.namespace = dest, dest.removeprefix("cloudwatch://").strip("/")
        if not self.namespace or self.namespace.startswith("AWS/") or ":" in self.namespace:
            raise UsageError(f"--export {dest}: a namespace such as cloudwatch://segserve (not empty, not AWS/…, no ':')")
        # adaptive: retries throttled calls with backoff, and slows down the client itself
        self.client = boto3.client("cloudwatch", endpoint_url=endpoint_url, config=Config(retries={"mode": "adaptive", "max_attempts": 10}))

    def check(self) -> None:
        aws_call(f"--export {self.dest}", lambda: self.client.list_metrics(Namespace=self.namespace))

    def export(self, folder: Path) -> str:
        data = []
        for sample in samples(folder):
            datum = {
                "MetricName": sample.metric,
                "Dimensions": [{"Name": name, "Value": value} for name, value in sample.labels.items()][:30],
                "Value": sample.value,
            }
            if sample.unit:
                datum["Unit"] = sample.unit
            data.append(datum)
        for start in range(0, len(data), CLOUDWATCH_BATCH):
            batch = data[start : start + CLOUDWATCH_BATCH]
            aws_call(f"--export {self.dest}", lambda batch=batch: self.client.put_metric_data(Namespace=self.namespace, MetricData=batch))
        return f"{len(data)} metric value(s) in {math.ceil(len(data) / CLOUDWATCH_BATCH)} call(s)"


class Pushgateway:
    def __init__(self, dest: str):
        self.dest, self.address = dest, dest.removeprefix("pushgateway://").strip("/")
        if ":" not in self.address:
            raise UsageError(f"--export {dest}: give pushgateway://host:port")

    def check(self) -> None:
        import urllib.request

        try:
            urllib.request.urlopen(f"http://{self.address}/-/ready", timeout=10).close()
        except OSError as error:
            raise UsageError(f"--export {self.dest}: the Pushgateway does not answer ({getattr(error, 'reason', error)})") from None

    def export(self, folder: Path) -> str:
        from prometheus_client import CollectorRegistry, Gauge, push_to_gateway

        registry = CollectorRegistry()
        found = samples(folder)
        gauges: dict[str, Gauge] = {}
        names = {s.metric: sorted({k for x in found if x.metric == s.metric for k in x.labels if k != "suite"}) for s in found}
        for sample in found:
            if sample.metric not in gauges:
                description = _description(sample.metric)
                gauges[sample.metric] = Gauge(f"segserve_{sample.metric}", description, names[sample.metric], registry=registry)
            values = {name: sample.labels.get(name, "") for name in names[sample.metric]}
            gauges[sample.metric].labels(**values).set(sample.value)
        grouping = {"suite": folder.parent.name, "run": folder.name}
        try:
            push_to_gateway(self.address, job="segserve_bench", registry=registry, grouping_key=grouping, timeout=30)
        except OSError as error:
            raise RuntimeFailure(f"{self.dest}: {error}") from None
        return f"{len(found)} sample(s) in {len(gauges)} gauge(s), group suite={grouping['suite']} run={grouping['run']}"


def _description(metric: str) -> str:
    if metric in METRICS:
        return METRICS[metric].description
    if metric in PIPELINE_METRICS:
        return PIPELINE_METRICS[metric][2]
    return f"per node: {metric}"


def destination(dest: str, endpoint_url: str | None = None):
    scheme = dest.split("://", 1)[0] if "://" in dest else ""
    if scheme == "s3":
        return S3(dest, endpoint_url)
    if scheme == "cloudwatch":
        return CloudWatch(dest, endpoint_url)
    if scheme == "pushgateway":
        return Pushgateway(dest)
    raise UsageError(f"--export {dest!r}: one of s3://bucket/prefix, cloudwatch://Namespace, pushgateway://host:port")


def checked(dests: list[str], endpoint_url: str | None = None) -> list:
    """The destinations, each checked now (before a suite measures anything)."""
    targets = [destination(dest, endpoint_url) for dest in dests]
    for target in targets:
        target.check()
    return targets


def export(folder: Path, dests: list[str], endpoint_url: str | None = None, log=print) -> None:
    for target in checked(dests, endpoint_url):
        started = time.monotonic()
        log(f"export {target.dest}: {target.export(folder)} ({time.monotonic() - started:.1f} s)")


def download_summaries(url: str, into: Path, endpoint_url: str | None = None) -> list[Path]:
    """The summary.jsonl (and pipelines.jsonl, where the run has one) of every run under an s3:// prefix (as
    exported: <prefix>/<suite>/<timestamp>/), each in into/<suite>/<timestamp>/, so that a query reads them as
    result folders."""
    from segserve.archives.s3_prefix import S3Prefix

    store = S3Prefix(url, endpoint_url, "results query")
    store.check()
    folders = []
    etags = store.etags()
    for key, etag in etags.items():
        parts = key.split("/")
        if not key.endswith("/summary.jsonl") or len(parts) < 3:
            continue
        folder = into / parts[-3] / parts[-2]
        folder.mkdir(parents=True, exist_ok=True)
        store.get_verified(key, etag, folder / "summary.jsonl")
        pipelines_key = key.removesuffix("summary.jsonl") + "pipelines.jsonl"
        if pipelines_key in etags:  # a run exported before pipelines.jsonl existed has none: no pipeline rows
            store.get_verified(pipelines_key, etags[pipelines_key], folder / "pipelines.jsonl")
        folders.append(folder)
    if not folders:
        raise UsageError(f"{url}: no exported run (…/<suite>/<timestamp>/summary.jsonl) under this prefix")
    return folders
