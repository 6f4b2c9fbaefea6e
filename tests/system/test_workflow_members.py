"""`members: true` on a workflow of TorchServe's dog-breed shape (a function node first, a join below it), built here
with the official archivers from handlers that never import segserve: each model node measured alone on what the
workflow sends it, the join's handler given the same row alone (over TorchServe's gRPC API, one input per parent) as
inside the workflow, and the efficiency table filled."""

import json
import re
import textwrap

import pytest

from segserve.bench.results.store import read_pipelines
from tests.system.test_foreign_archives import bench, model_archive, workflow_archive

FUNCTIONS = """
def fn_first(data, context):
    if data is None:  # TorchServe's load-time call
        return None
    # a dict: the worker sends it as json.dumps(indent=2), which the children get
    return [{"size": len(row["body"]), "head": bytes(row["body"][:4]).hex()} for row in data]
"""

# refuses the row of refuse.bin (a 400 and its own body, which the workflow hands on to join_b) and fails the row of
# fail.bin (raises: TorchServe's 503, the row goes no further in the workflow)
MODEL_A = """
import json


def handle(data, context):
    if data is None:
        return None
    answers = []
    for index, row in enumerate(data):
        head = bytes.fromhex(json.loads(bytes(row["body"]))["head"])
        if head == b"fail":
            raise ValueError("model_a cannot take fail.bin")
        if head == b"refu":
            context.set_response_status(400, "refused", index)
            answers.append(json.dumps({"error": "model_a refuses refuse.bin"}))
        else:
            answers.append(bytes(row["body"])[::-1])
    return answers
"""

# records each distinct row it is handed (with its parameters' headers), by the name it runs under: inside the
# workflow `dog__join_b`, alone `dog-join_b`; refuses a row without both parents' bytes
JOIN_B = """
import hashlib
import json

RECORD = {record!r}
SEEN = set()


def handle(data, context):
    if data is None:
        return None
    answers = []
    for index, row in enumerate(data):
        if set(row) != {{"fn_first", "model_a"}} or not all(isinstance(v, bytearray) for v in row.values()):
            raise ValueError(f"join_b expects fn_first's and model_a's bytes, got {{ {{k: type(v).__name__ for k, v in row.items()}} }}")
        seen = {{
            parent: [type(value).__name__, hashlib.sha256(value).hexdigest(), context.get_request_header(index, parent)]
            for parent, value in sorted(row.items())
        }}
        line = json.dumps({{"model": context.model_name, "row": seen}}, sort_keys=True)
        if line not in SEEN:
            SEEN.add(line)
            with open(RECORD, "a") as record:
                record.write(line + "\\n")
        answers.append(json.dumps({{parent: len(value) for parent, value in row.items()}}))
    return answers
"""


# long: a server of its own, three archives built, three points measured (21-25 s of make test on 2 cores). make
# test checks its parts: the rows the DAG sends each member (tests/unit/test_foreign.py), a refused row handed on and
# a failed one left out (tests/unit/test_member_capture.py), a join's named inputs over gRPC
# (tests/unit/test_grpc_named_inputs.py), a war's members on a real TorchServe (tests/system/test_foreign_archives.py).
@pytest.mark.long
def test_a_join_workflows_members_are_measured_on_what_the_workflow_sends_them(tmp_path, monkeypatch, capsys):
    user = tmp_path / "user"
    user.mkdir()
    record = tmp_path / "join_rows.jsonl"
    model_archive(user, "model_a", MODEL_A)
    model_archive(user, "join_b", JOIN_B.format(record=str(record)))
    spec = """
        models:
          min-workers: 1
          max-workers: 1
          batch-size: 1
          # TorchServe 0.12 can drop a node's answer (docs/serving.md): asked again after half a second
          timeout-ms: 500
          retry-attempts: 3
          model_a: {url: model_a.mar}
          join_b: {url: join_b.mar}
        dag:
          fn_first: [model_a, join_b]
          model_a: [join_b]
        """
    workflow_archive(user, "dog", spec, FUNCTIONS)
    (user / "in").mkdir()
    for name in ("ok1.bin", "ok2.bin", "refuse.bin", "fail.bin"):
        (user / "in" / name).write_bytes(name.encode() * 8)
    monkeypatch.chdir(user)
    suite = """
        targets: [{name: dog, archive: dog.war, members: true}]
        inputs: [{files: [in/*.bin]}]
        grid: {archive: {batch_size: [1]}, load: {concurrency: [2]}}  # a row alone: refuse.bin's 400 never shares fail.bin's batch
        load: {warmup_s: 0.3, fresh_workers_warmup_s: 1.0, window_s: 0.5, stable_windows: 2, max_windows: 3, stability_tolerance: 0.9}
        """
    folder, rows = bench(tmp_path, "dog", textwrap.dedent(suite), capsys)
    outcomes = {r["target"]: (r["error"], r.get("requests_ok") > 0, r.get("failures_by_status")) for r in rows}
    # the model nodes are the members, each measured alone; the function node is not one. fail.bin fails as in the
    # workflow (its 500 after the retries; model_a's own 503), refuse.bin's 400 only alone (the workflow hands it on)
    statuses = {target: (error, ok, sorted(failed)) for target, (error, ok, failed) in outcomes.items()}
    assert statuses == {"dog": (None, True, ["500"]), "dog-model_a": (None, True, ["400", "503"]), "dog-join_b": (None, True, [])}, outcomes
    # join_b never gets fail.bin's row inside the workflow: measured without it, saying so; the others get every input
    left_out = {r["target"]: r.get("inputs_left_out") for r in rows}
    assert left_out["dog"] is None and left_out["dog-model_a"] is None, left_out
    assert re.fullmatch(
        r"fail\.bin \(model_a answered 503: Prediction failed \(ValueError: model_a cannot take fail\.bin ← .*\)\)", left_out["dog-join_b"]
    )
    # the join's member over TorchServe's gRPC API (one input per parent, no multipart), the others as the suite says
    protocols = {r["target"]: (r.get("protocol"), bool(r.get("protocol_reason"))) for r in rows}
    assert protocols == {"dog": (None, False), "dog-model_a": (None, False), "dog-join_b": ("grpc", True)}, protocols
    captured = "captured what dog-model_a answers to its 4 input(s): its children's inputs; it failed 1, which go no further"
    assert f"{captured}: fail.bin (answered 503: Prediction failed" in capsys.readouterr().out
    # join_b alone was handed, for each input that reaches it, the very row the workflow hands it: fn_first's and
    # model_a's bytes (for refuse.bin model_a's refusal) as bytearrays under their names, the same (empty) content types
    seen = [json.loads(line) for line in record.read_text().splitlines()]
    inside = {json.dumps(s["row"], sort_keys=True) for s in seen if s["model"] == "dog__join_b"}
    alone = {json.dumps(s["row"], sort_keys=True) for s in seen if s["model"] == "dog-join_b"}
    assert len(inside) == 3 and inside == alone, (inside, alone)
    assert all(value[0] == "bytearray" and value[2] == {"content-type": ""} for row in map(json.loads, alone) for value in row.values())
    # the efficiency table: the workflow against its two members' bounds, in the report and pipelines.jsonl
    (pipeline,) = read_pipelines(folder)
    assert pipeline["pipeline"] == "dog" and pipeline["shared_bound_rps"] > 0, pipeline
    efficiency = (folder / "report.md").read_text().split("## Pipeline efficiency")[1].split("\n## ")[0]
    row = r"\| dog \| [\d.]+ \| dog-[0-9a-f]{8} \| (yes|no) \| [^|]+ \| \d+ \| \d+ \| dog-model_a [\d.]+, dog-join_b [\d.]+ \|"
    assert re.search(row, efficiency), efficiency
