"""Archives segserve never wrote, built here with the official archivers from handlers that never import segserve,
benchmarked as a user would: a TorchScript model behind its own BaseHandler (raw tensors in), a two-node workflow
(that model, then a Pillow JPEG function handler), a two-input model fed multipart requests, and broken ones."""

import base64
import functools
import hashlib
import http.server
import json
import re
import subprocess
import sys
import sysconfig
import textwrap
import threading
import zipfile
from pathlib import Path

import boto3
import pytest
import torch
import yaml

from segserve.bench.results import manifest_check
from segserve.bench.results.render import render_table
from segserve.bench.results.store import read_pipelines
from segserve.cli import main
from segserve.shown_text import for_markdown
from tests.integration.test_export import aws  # noqa: F401 (the fixture: moto's S3 on loopback)

BIN = Path(sys.executable).parent

TINY_HANDLER = '''
import json
import os
from pathlib import Path

import torch
import yaml
from ts.torch_handler.base_handler import BaseHandler


class TinySegmenter(BaseHandler):
    """Raw float32 [3, 32, 32] in, one class byte per pixel out."""

    def initialize(self, context):
        # the names in this worker's environment and its HOME, for the test that a user's archive gets no credentials
        home = os.environ.get("HOME", "")
        mode = oct(os.stat(home).st_mode & 0o777) if os.path.isdir(home) else None
        report = {"names": sorted(os.environ), "home": home, "home_mode": mode}
        (Path("ENVIRON_DIR") / f"{os.getpid()}.json").write_text(json.dumps(report))
        super().initialize(context)

    def preprocess(self, data):
        rows = [torch.frombuffer(bytearray(row.get("data") or row.get("body")), dtype=torch.float32) for row in data]
        return torch.stack([row.reshape(3, 32, 32) for row in rows])

    def postprocess(self, logits):
        return [bytes(labels.to(torch.uint8).flatten().tolist()) for labels in logits.argmax(1)]
'''

JPEG_HANDLER = """
import io

from PIL import Image


def handle(data, context):
    if data is None:  # TorchServe's load-time call
        return None
    answers = []
    for row in data:
        labels = bytes(row.get("data") or row.get("body"))
        if len(labels) != 32 * 32:  # one class byte per pixel of a 32 × 32 image, nothing else
            raise ValueError(f"expected 1024 class bytes, got {len(labels)}")
        image = Image.frombytes("L", (32, 32), bytes(min(255, 80 * value) for value in labels))
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=90)
        answers.append(buffer.getvalue())
    return answers
"""

TWO_INPUT_HANDLER = """
import json
import re


def handle(data, context):
    if data is None:
        return None
    return [json.dumps({"tokens": len(row["tokens"]), "mask": sum(row["mask"])}) for row in data]
"""


def run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def model_archive(folder: Path, name: str, handler_source: str, serialized: Path | None = None) -> Path:
    handler = folder / f"{name}_handler.py"
    handler.write_text(handler_source)
    command = [str(BIN / "torch-model-archiver"), "--model-name", name, "--version", "1.0", "--handler", str(handler)]
    command += ["--serialized-file", str(serialized)] if serialized else []
    run([*command, "--export-path", str(folder), "--force"])
    return folder / f"{name}.mar"


@pytest.fixture(scope="module")
def user_archives(tmp_path_factory) -> Path:
    """A user's folder: tiny.mar, encode.mar, pipeline.war (tiny → encode), pair.mar (multipart), broken ones."""
    folder = tmp_path_factory.mktemp("user")
    network = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 3, 1))
    torch.jit.script(network.eval()).save(str(folder / "tiny.pt"))
    (folder / "environ").mkdir()
    model_archive(folder, "tiny", TINY_HANDLER.replace("ENVIRON_DIR", str(folder / "environ")), folder / "tiny.pt")
    model_archive(folder, "encode", JPEG_HANDLER)
    model_archive(folder, "pair", TWO_INPUT_HANDLER)
    workflow_archive(
        folder,
        "pipeline",
        """
            models:
              min-workers: 1
              max-workers: 1
              batch-size: 1
              # TorchServe 0.12 can drop a node's answer (docs/serving.md), most of all from nodes this fast: asked
              # again after half a second, up to 3 times, instead of stalling a connection for the default timeout
              timeout-ms: 500
              retry-attempts: 3
              tiny: {url: tiny.mar}
              encode: {url: encode.mar}
            dag:
              tiny: [encode]
            """,
    )
    (folder / "not_a_zip.mar").write_bytes(b"this is not an archive")
    # TorchServe's own default handler on a TorchScript model: it loads (captum, which 0.12's vision handlers import,
    # is in segserve's install_requires) and fails every request (raw tensors are not images)
    model = [str(BIN / "torch-model-archiver"), "--model-name", "classifier", "--version", "1.0", "--handler", "image_classifier"]
    run([*model, "--serialized-file", str(folder / "tiny.pt"), "--export-path", str(folder), "--force"])
    # a handler that imports a module the environment lacks, which its requirements file lists (a wheel it brings)
    wheel = tiny_wheel(folder)
    (folder / "requirements.txt").write_text(f"./{wheel.name}\n")
    (folder / "needsdep_handler.py").write_text(NEEDS_DEP_HANDLER)
    needs = [str(BIN / "torch-model-archiver"), "--model-name", "needsdep", "--version", "1.0", "--extra-files", str(wheel)]
    needs += ["--handler", str(folder / "needsdep_handler.py"), "--requirements-file", str(folder / "requirements.txt")]
    run([*needs, "--export-path", str(folder), "--force"])
    (folder / "mask.bin").write_bytes(bytes([1, 0, 1, 1, 1]))
    return folder


NEEDS_DEP_HANDLER = """
import segserve_tiny_dep


def handle(data, context):
    return None if data is None else [segserve_tiny_dep.ANSWER for _ in data]
"""


def tiny_wheel(folder: Path) -> Path:
    """segserve_tiny_dep, a pure-Python wheel written here (pip installs it with no index)."""
    files = {
        "segserve_tiny_dep/__init__.py": "ANSWER = 'installed'\n",
        "segserve_tiny_dep-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: segserve-tiny-dep\nVersion: 0.1\n",
        "segserve_tiny_dep-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files["segserve_tiny_dep-0.1.dist-info/RECORD"] = "".join(f"{name},,\n" for name in [*files, "segserve_tiny_dep-0.1.dist-info/RECORD"])
    wheel = folder / "segserve_tiny_dep-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zipped:
        for name, text in files.items():
            zipped.writestr(name, text)
    return wheel


def workflow_archive(folder: Path, name: str, spec: str, functions: str = "") -> Path:
    """<name>.war from a spec (dedented) and a functions file, with torch-workflow-archiver, into `folder`."""
    (folder / f"{name}.yaml").write_text(textwrap.dedent(spec))
    (folder / f"{name}_functions.py").write_text(functions)
    command = [str(BIN / "torch-workflow-archiver"), "--workflow-name", name, "--spec-file", str(folder / f"{name}.yaml")]
    run([*command, "--handler", str(folder / f"{name}_functions.py"), "--export-path", str(folder), "--force"])
    return folder / f"{name}.war"


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.?ar"))}


def bench(tmp_path: Path, name: str, suite_text: str, capsys) -> tuple[Path, list[dict]]:
    """`segserve bench` of a suite written as <name>.yaml: its result folder and its whole records (runs/)."""
    suite = tmp_path / f"{name}.yaml"
    suite.write_text(suite_text)
    assert main(["bench", str(suite), "--results", str(tmp_path / "results")]) == 0, capsys.readouterr().err
    (folder,) = (tmp_path / "results" / name).iterdir()
    return folder, [json.loads(path.read_text()) for path in sorted((folder / "runs").glob("*.json"))]


def test_a_users_archives_are_benchmarked_as_they_are(user_archives, tmp_path, monkeypatch, capsys):
    before = digests(user_archives)
    monkeypatch.chdir(user_archives)
    folder, rows = bench(
        tmp_path,
        "mine",
        textwrap.dedent(
            """
            targets:
              - {name: pipeline, archive: pipeline.war, members: true}
              - name: pair
                archive: pair.mar
                inputs: [{multipart: [{name: tokens, tensor: {dtype: int64, shape: [16]}}, {name: mask, file: mask.bin}]}]
            inputs: [{tensor: {dtype: float32, shape: [3, 32, 32], count: 3}}]
            grid:
              archive: {batch_size: [4], max_batch_delay_ms: [2]}
              runtime: {tiny_workers: [1, 2], encode_workers: [2], pair_workers: [1]}
              load: {concurrency: [4]}
            # max_others_share 1.0: beside make test's other process every window counts as disturbed and is measured
            # again (up to max_windows more) otherwise: seconds a point that nothing here reads
            load: {warmup_s: 0.5, fresh_workers_warmup_s: 2.0, window_s: 1.0, stable_windows: 2, max_windows: 3, stability_tolerance: 0.5,
                   max_others_share: 1.0}
            """
        ),
        capsys,
    )
    outcomes = [{k: r.get(k) for k in ("run_id", "error", "requests_ok", "requests_failed", "failures_by_status")} for r in rows]
    assert all(r["error"] is None and r["requests_ok"] > 0 and r["requests_failed"] == 0 for r in rows), outcomes
    seen = sorted((r["target"], r["batch_size"], r.get("tiny_workers"), r.get("encode_workers")) for r in rows)
    assert seen == [
        ("pair", 4, None, None),
        ("pipeline", 4, 1, 2),
        ("pipeline", 4, 2, 2),
        ("pipeline-encode", 4, None, 2),
        ("pipeline-tiny", 4, 1, None),
        ("pipeline-tiny", 4, 2, None),
    ]
    # members: each node alone; encode (which takes 1024 class bytes only) was sent what tiny answers
    assert "captured what pipeline-tiny answers to its 3 input(s)" in capsys.readouterr().out
    report = (folder / "report.md").read_text()
    efficiency = report.split("## Pipeline efficiency")[1].split("\n## ")[0]
    # its rate, the point it is, feasible, no flags, no lost answers, no failed request, then its members
    row = r"\| pipeline \| [\d.]+ \| pipeline-[0-9a-f]{8} \| yes \| – \| 0 \| 0 \| pipeline-tiny [\d.]+, pipeline-encode [\d.]+ \|"
    assert re.search(row, efficiency), efficiency
    # the same row as data (pipelines.jsonl): its every cell, the ratios (or their uncertain notes) among them, is the report's
    (pipeline,) = read_pipelines(folder)
    assert pipeline["pipeline"] == "pipeline" and pipeline["shared_bound_rps"] > 0
    assert pipeline["ratio_shared"] is not None or pipeline["ratio_shared_uncertain"], pipeline
    assert render_table([pipeline]).splitlines()[-1] in efficiency.splitlines(), (pipeline, efficiency)
    assert main(["results", "query", str(folder), "--pipelines", "--where", "pipeline=pipeline", "--format", "json"]) == 0
    assert [row["ratio_disjoint_ci_low"] for row in json.loads(capsys.readouterr().out)] == [pipeline["ratio_disjoint_ci_low"]]
    assert digests(user_archives) == before  # the user's files are never changed
    # best/: the workflow's best point (a pipeline is preferred to models), as management calls and its spec
    best = max((r for r in rows if r["target"] == "pipeline"), key=lambda r: r["throughput_rps"])
    script = (folder / "best" / "register.sh").read_text()
    assert f"# From {best['run_id']} (pipeline)" in script and "/workflows?url=pipeline.war&workflow_name=pipeline" in script
    spec = yaml.safe_load((folder / "best" / "pipeline.yaml").read_text())
    assert spec["models"]["tiny"]["min-workers"] == best["tiny_workers"] and spec["models"]["encode"]["max-workers"] == 2
    assert spec["models"]["tiny"]["batch-size"] == best["batch_size"] and spec["dag"] == {"tiny": ["encode"]}
    # and the .war fused into one .mar KServe can serve, with its manifests, each validated as a cluster would (#51)
    fused = folder / "best" / "fused"
    assert zipfile.is_zipfile(fused / "fused_pipeline.mar") and not (folder / "best" / "fused.txt").exists()
    k8s = list(yaml.safe_load_all((fused / "k8s.yaml").read_text()))
    # the InferenceService with its NetworkPolicy and AuthorizationPolicy
    kserve = {d["kind"]: d for d in yaml.safe_load_all((fused / "kserve.yaml").read_text())}
    service = kserve["InferenceService"]
    assert manifest_check.kubernetes_problems(k8s) == [] and manifest_check.inference_service_problems(service) == []
    assert '"marName":"fused_pipeline.mar"' in next(d for d in k8s if d["kind"] == "ConfigMap")["data"]["config.properties"]


def test_broken_archives_fail_their_points_with_torchserves_reason_and_the_suite_goes_on(user_archives, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(user_archives)
    folder, records = bench(
        tmp_path,
        "broken",
        textwrap.dedent(
            """
            targets:
              - {name: garbage, archive: not_a_zip.mar}
              - {name: classifier, archive: classifier.mar}
              - {name: tiny, archive: tiny.mar}
              - {name: needsdep, archive: needsdep.mar}
            inputs: [{tensor: {dtype: float32, shape: [3, 32, 32]}}]
            grid: {load: {concurrency: [2]}}
            load: {warmup_s: 0.3, window_s: 0.5, stable_windows: 2, max_windows: 2, stability_tolerance: 0.9, max_others_share: 1.0}
            """
        ),
        capsys,
    )
    rows = {r["target"]: r for r in records}
    assert rows["tiny"]["error"] is None and rows["tiny"]["requests_ok"] > 0
    assert "registering garbage.mar as garbage failed: HTTP " in rows["garbage"]["error"], rows["garbage"]
    # requests that fail: the first exception of the workers' log during the point, with its chain, before the counts
    cause, error = rows["classifier"]["error_cause"], rows["classifier"]["error"]
    assert cause.startswith("PIL.UnidentifiedImageError: cannot identify image file") and " ← ts/torch_handler/vision_handler.py:" in cause
    assert error.startswith(f"RuntimeFailure: {cause}; no request completed in "), error
    # a worker that does not load: its handler imported as TorchServe's worker imports it, then the way to ask for
    # the requirements file that lists the missing module
    cause, error = rows["needsdep"]["error_cause"], rows["needsdep"]["error"]
    assert cause == (
        "ModuleNotFoundError: No module named 'segserve_tiny_dep' ← needsdep_handler.py:2; the archive lists it in its "
        "requirements.txt (./segserve_tiny_dep-0.1-py3-none-any.whl): add `install_requirements: true` to targets.needsdep "
        "to install it as TorchServe's install_py_dep_per_model would"
    )
    assert error.startswith(f"RuntimeFailure: {cause}; registering needsdep.mar as needsdep failed: HTTP 500"), error
    # the causes in the terminal and in report.md too
    out, report = capsys.readouterr().out, (folder / "report.md").read_text()
    assert f"FAILED {rows['needsdep']['error']}" in out and for_markdown(rows["classifier"]["error_cause"]) in report


@pytest.mark.long  # a server of its own (install_py_dep_per_model) and pip: about 20 s (make test-long)
def test_an_archive_that_asks_for_its_requirements_is_served_with_them_and_segserves_venv_is_unchanged(
    user_archives, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(user_archives)
    suite = """
        targets: [{name: installed, archive: needsdep.mar, install_requirements: true}]
        inputs: [{tensor: {dtype: float32, shape: [3, 32, 32]}}]
        grid: {load: {concurrency: [2]}}
        load: {warmup_s: 0.3, window_s: 0.5, stable_windows: 2, max_windows: 2, stability_tolerance: 0.9}
        """
    _, records = bench(tmp_path, "installed", textwrap.dedent(suite), capsys)
    # installed where TorchServe extracted the archive (install_py_dep_per_model), and segserve's venv unchanged
    assert records[0]["error"] is None and records[0]["requests_ok"] > 0, records[0]
    assert not list(Path(sysconfig.get_paths()["purelib"]).glob("segserve_tiny_dep*"))
    assert subprocess.run([sys.executable, "-c", "import segserve_tiny_dep"], capture_output=True).returncode == 1


def test_the_seed_style_archives_build_and_their_suites_plan_from_their_folder(tmp_path, monkeypatch, capsys):
    """benchmarks/foreign/: build.py makes a user's archives with the official archivers, and each suite there plans
    its points from the archives' folder (what docs/benchmarking.md's measurement ran)."""
    root = Path(__file__).resolve().parents[2]
    run([sys.executable, str(root / "benchmarks" / "foreign" / "build.py"), str(tmp_path / "archives")])
    built = {p.name for p in (tmp_path / "archives").iterdir()}
    assert {"seg.mar", "jpeg.mar", "seed.war", "lookup.mar", "lookup.war", "overlay.mar", "seed_join.war", "image_0.bin"} <= built
    monkeypatch.chdir(tmp_path / "archives")
    assert main(["fuse", "seed.war", "--model-store", ".", "--out", "seed_one.mar"]) == 0  # what seed_fused.yaml measures
    assert main(["fuse", "lookup.war", "--model-store", ".", "--out", "lookup_one.mar"]) == 0  # and lookup_fused.yaml
    assert main(["fuse", "seed_join.war", "--model-store", ".", "--out", "seed_join_one.mar"]) == 0  # a join: seed_join.yaml
    counts = {}
    for suite in sorted((root / "benchmarks" / "foreign").glob("*.yaml")):
        if suite.stem == "image_segmenter":  # its archive is build_image_segmenter.py's: tests/system/test_image_segmenter.py
            continue
        if suite.stem.startswith("vision_join"):  # their archives are build_vision_join.py's: tests/system/test_vision_join.py
            continue
        assert main(["bench", str(suite), "--dry-run"]) == 0, capsys.readouterr().err
        counts[suite.stem] = len(re.findall(r"^ +\d+\. ", capsys.readouterr().out, re.MULTILINE))  # the planned points
    # with members: true, the members' points too (seed-seg and seed-jpeg alone)
    expected = {
        "lookup_fused": 6,
        "seed_fused": 16,
        "seed_fused_rate": 4,
        "seed_goal": 8,
        "seed_goal_batch": 16,
        "seed_goal_threads": 16,
        "seed_grid": 48,
        "seed_join": 16,  # the workflow, its two model members (seg, and overlay, the join) and the fused .mar
        "seed_members": 16,
        "seed_search": 48,
        "seed_search_auto": 96,
        "seed_side_by_side": 3,
        "seed_stock_vs_fused": 4,
    }
    assert counts == expected


class Archives(http.server.SimpleHTTPRequestHandler):
    """The user's folder over HTTP, behind basic auth (user:secret), as an artifact server would serve it."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.headers.get("Authorization") != "Basic " + base64.b64encode(b"user:secret").decode():
            self.send_error(401)
            return
        super().do_GET()

    def log_message(self, *args):
        pass


def test_archives_at_urls_are_fetched_and_benchmarked_and_one_that_does_not_answer_fails_masked(
    user_archives,
    aws,
    tmp_path,
    monkeypatch,
    capsys,  # noqa: F811
):
    """An archive target's archive at https?:// (basic auth in the URL) and s3:// (a .war with its node archives beside
    it): fetched into the cache and measured; a URL that does not answer fails its point with the URL masked. Their
    workers see none of segserve's credentials (the AWS ones here), only what the suite's worker_env names."""
    monkeypatch.setenv("SEGSERVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_not_for_archives")
    monkeypatch.setenv("SEGSERVE_PASSED_ON", "named in worker_env")
    for report in (user_archives / "environ").iterdir():
        report.unlink()  # what the workers of earlier tests reported
    monkeypatch.setenv("AWS_ENDPOINT_URL", aws)  # boto3's own setting: segserve's code does not know it is not AWS
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="models")
    for name in ("pipeline.war", "tiny.mar", "encode.mar"):
        s3.upload_file(str(user_archives / name), "models", f"v1/{name}")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Archives, directory=str(user_archives)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://user:secret@127.0.0.1:{server.server_address[1]}"
    try:
        _, rows = bench(
            tmp_path,
            "remote",
            textwrap.dedent(
                f"""
                targets:
                  - {{name: fetched, archive: "{base}/tiny.mar", worker_env: [SEGSERVE_PASSED_ON]}}
                  - {{name: gone, archive: "{base}/gone.mar?token=abc"}}
                  - {{name: from_s3, archive: "s3://models/v1/pipeline.war"}}
                inputs: [{{tensor: {{dtype: float32, shape: [3, 32, 32], count: 2}}}}]
                grid: {{archive: {{batch_size: [2]}}, load: {{concurrency: [2]}}}}
                load: {{warmup_s: 0.3, fresh_workers_warmup_s: 1.0, window_s: 0.5, stable_windows: 2, max_windows: 3,
                       max_others_share: 1.0}}
                """
            ),
            capsys,
        )
    finally:
        server.shutdown()
        server.server_close()
    by_target = {r["target"]: r for r in rows}
    assert by_target["fetched"]["error"] is None and by_target["fetched"]["requests_ok"] > 0, by_target["fetched"]
    assert by_target["from_s3"]["error"] is None and by_target["from_s3"]["requests_ok"] > 0, by_target["from_s3"]
    gone = by_target["gone"]["error"]
    assert gone.startswith(f"RuntimeFailure: http://***@127.0.0.1:{server.server_address[1]}/gone.mar?token=*** answered HTTP 404"), gone
    files = [p for p in (tmp_path / "results").rglob("*") if p.is_file() and p.suffix not in (".png", ".mar")]  # text files
    written = capsys.readouterr().out + "".join(p.read_text() for p in files)
    assert "user:secret" not in written and "token=abc" not in written
    reports = [json.loads(p.read_text()) for p in (user_archives / "environ").iterdir()]  # a tiny worker each
    names = [report["names"] for report in reports]
    assert len(reports) >= 2 and all("SEGSERVE_PASSED_ON" in them and "PATH" in them for them in names), reports
    assert not [name for them in names for name in them if name.startswith("AWS_") or name == "GITHUB_TOKEN"], reports
    # not the user's HOME (boto3 would find ~/.aws/credentials there): its server's scratch one, 0700, gone at its stop
    homes = {report["home"]: report["home_mode"] for report in reports}
    assert all(Path(home).name == "archive-home" and mode == "0o700" for home, mode in homes.items()), homes
    assert not [home for home in homes if Path(home).exists()], homes
