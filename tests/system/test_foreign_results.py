"""What a user does with the result folders of archive targets (a .mar and a .war of their own, built with the official
archivers from handlers that never import segserve): `bench compare`, `bench ab` (run from the archives' folder, a
`members: true` .war included), `results query` and `export` to S3 (moto) and a Pushgateway. One module-scoped run of
a small suite serves every test but ab's."""

import json
import shutil
import textwrap
import urllib.request

import boto3
import pytest

from segserve.cli import main
from tests.conftest import ROOT
from tests.integration.test_export import aws  # noqa: F401 (the fixture: moto's S3 on loopback)
from tests.system.test_foreign_archives import user_archives  # noqa: F401 (the fixture: a user's archives folder)
from tests.unit.test_export import pushgateway  # noqa: F401 (the fixture: Debian's prometheus-pushgateway)

# fresh workers warm 2 s: with 0.3 s, under three test processes on 2 cores, the workflow's first point after its
# registration had no answer inside its 1.2 s of windows ("none answered") and the export test found no node rows
INPUTS_AND_LOAD = """
inputs: [{tensor: {dtype: float32, shape: [3, 32, 32], count: 2}}]
load: {warmup_s: 0.2, fresh_workers_warmup_s: 2.0, window_s: 0.3, stable_windows: 2, max_windows: 2, stability_tolerance: 0.9, timeout_s: 3}
"""

SUITE = """
targets:
  - {name: pipeline, archive: pipeline.war}
  - {name: single, archive: tiny.mar}
grid:
  archive: {batch_size: [2]}
  runtime: {tiny_workers: [1, 2], encode_workers: [1]}
  load: {concurrency: [4]}
"""


def bench(folder, name: str, text: str):
    """`segserve bench` of a suite from the folder run from (the user's): its one result folder."""
    (folder / f"{name}.yaml").write_text(textwrap.dedent(text) + INPUTS_AND_LOAD)
    assert main(["bench", str(folder / f"{name}.yaml"), "--results", str(folder / "results")]) == 0
    (result,) = (folder / "results" / name).iterdir()
    return result


@pytest.fixture(scope="module")
def run(user_archives, tmp_path_factory):  # noqa: F811
    """A run of SUITE from the user's folder: pipeline.war at tiny_workers 1 and 2, tiny.mar as `single`."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(user_archives)
        return bench(tmp_path_factory.mktemp("foreign_results"), "mine", SUITE)


def rows(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "summary.jsonl").read_text().splitlines()]


def test_compare_joins_two_runs_of_archive_targets_on_their_run_ids(run, user_archives, tmp_path, monkeypatch, capsys):  # noqa: F811
    monkeypatch.chdir(user_archives)
    again = bench(
        tmp_path, "mine", "targets: [{name: single, archive: tiny.mar}]\ngrid: {archive: {batch_size: [2]}, load: {concurrency: [4]}}"
    )
    capsys.readouterr()
    code = main(["bench", "compare", str(run), str(again)])
    out = capsys.readouterr().out
    (single,) = [r["run_id"] for r in rows(run) if r["target"] == "single"]
    assert code in (0, 1) and f"{single}: throughput_rps " in out, out  # the same point, measured in both
    assert out.count("only in old") == 2 and "overall (1 point(s)" in out, out


def test_compare_of_a_rebuilt_archive_names_it_and_says_how_to_compare_builds(run, tmp_path, capsys):
    """The archive's digest is in its run ids: a rebuilt tiny.mar gives its targets other run ids at the same points."""
    rebuilt = tmp_path / "mine" / "rebuilt"
    shutil.copytree(run, rebuilt)
    changed = [{**r, "run_id": r["run_id"] + "x", "setup": {**r["setup"], "recipe": "0" * 8}} for r in rows(run)]
    (rebuilt / "summary.jsonl").write_text("".join(json.dumps(r) + "\n" for r in changed))
    assert main(["bench", "compare", str(run), str(rebuilt)]) == 2
    err = capsys.readouterr().err
    assert "measured with other archive (tiny.mar is not the file it was)" in err, err
    assert "measured with other archive (pipeline.war, or a .mar its nodes name, is not the file it was)" in err, err
    assert "give both as targets of one suite" in err and "no point in common" not in err, err


def test_results_query_has_the_archive_targets_per_node_columns(run, capsys):
    args = ["results", "query", str(run.parent.parent), "--where", "target=pipeline", "--sort", "-tiny_workers", "--format", "json"]
    assert main(args) == 0
    found = json.loads(capsys.readouterr().out)
    assert [(r["target"], r["tiny_workers"], r["suite"]) for r in found] == [("pipeline", 2, "mine"), ("pipeline", 1, "mine")]
    assert main(["results", "query", str(run), "--where", "tiny_workers=1", "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split(",")[3] == "pipeline"  # suite, timestamp, run_id, target
    # encode_workers took one value: no column, and the error says why
    assert main(["results", "query", str(run), "--where", "encode_workers=1"]) == 2
    assert "only where its suite swept it" in capsys.readouterr().err


def test_export_sends_an_archive_target_run_to_s3_and_a_pushgateway(run, aws, pushgateway, capsys):  # noqa: F811
    boto3.client("s3", endpoint_url=aws).create_bucket(Bucket="team")
    assert main(["export", str(run), "s3://team/runs", f"pushgateway://{pushgateway}", "--endpoint-url", aws]) == 0
    s3 = boto3.client("s3", endpoint_url=aws)
    key = f"runs/mine/{run.name}/metrics.jsonl"
    exported = [json.loads(line) for line in s3.get_object(Bucket="team", Key=key)["Body"].read().decode().splitlines()]
    nodes = {(x["node"], x["tiny_workers"]) for x in exported if x["metric"] == "node_queue_ms" and x["target"] == "pipeline"}
    assert nodes == {("pipeline__tiny", "1"), ("pipeline__tiny", "2"), ("pipeline__encode", "1"), ("pipeline__encode", "2")}
    assert s3.head_object(Bucket="team", Key=f"runs/mine/{run.name}/best/register.sh")["ContentLength"] > 0
    capsys.readouterr()
    assert main(["results", "query", "s3://team/runs", "--where", "target=single", "--endpoint-url", aws, "--format", "json"]) == 0
    assert [r["target"] for r in json.loads(capsys.readouterr().out)] == ["single"]
    metrics = urllib.request.urlopen(f"http://{pushgateway}/metrics", timeout=10).read().decode()
    assert "segserve_throughput_rps{" in metrics and 'target="single"' in metrics and 'tiny_workers="2"' in metrics


def test_ab_runs_from_the_users_folder_with_a_war_and_its_members(run, user_archives, tmp_path, monkeypatch, capsys):  # noqa: F811
    """Refs of segserve's checkout from a folder that is no git repository; both sides find the user's archives (relative
    paths) and measure the points `segserve bench` measures there (the same run ids); members captured on A's server."""
    monkeypatch.chdir(user_archives)
    suite = tmp_path / "ab.yaml"
    suite.write_text(
        "targets: [{name: pipeline, archive: pipeline.war, members: true}]\n"
        "grid: {archive: {batch_size: [2]}, runtime: {tiny_workers: [1], encode_workers: [1]}, load: {concurrency: [4]}}" + INPUTS_AND_LOAD
    )
    code = main(["bench", "ab", str(suite), "--a", "HEAD", "--b", str(ROOT), "--rounds", "1", "--results", str(tmp_path / "results")])
    (folder,) = (tmp_path / "results" / "ab").iterdir()
    summary = json.loads((folder / "ab.json").read_text())
    measured = {p["run_id"].rsplit("-", 1)[0]: p for p in summary["points"]}
    assert code == (1 if summary["slower"] else 0) and set(measured) == {"pipeline", "pipeline-tiny", "pipeline-encode"}
    assert all(p["a_rps"] > 0 and p["b_rps"] > 0 for p in measured.values()), summary["points"]
    # pipeline-encode (1024 class bytes in, else an error) was sent what pipeline-tiny answers: captured on A's server
    in_bench = {r["run_id"] for r in rows(run)}
    assert measured["pipeline"]["run_id"] in in_bench
