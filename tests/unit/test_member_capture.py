"""`members: true` when a node refuses or fails some of the workflow's inputs: each member is fed what it gets inside
the workflow (a refused row's body handed on, a failed row left out for the failing node's descendants only), and
what is left out or missing is said by input file and reason."""

import json
import pickle

import pytest

from segserve.archives.catalog import Catalog
from segserve.bench.results.analysis import Pipeline, analyse
from segserve.bench.run.dag_requests import Failed, left_out, node_requests
from segserve.bench.run.load import Body
from segserve.bench.run.suite_inputs import SuiteInputs
from segserve.bench.run.targets.torchserve_targets import torchserve_error
from segserve.bench.suite.spec import load_suite
from segserve.errors import RuntimeFailure
from segserve.serving.http import Response
from tests.conftest import ROOT
from tests.unit.test_foreign import suite_file, write_war

# pre → mid → leaf, a sibling of mid (sib), and a join of mid and sib
DAG = {"pre": ["mid", "sib"], "mid": ["leaf", "join"], "sib": ["join"]}
FAILED = "answered 503: Prediction failed (ValueError: no boom ← handler.py:7)"


def fake_capture(captured: list, failing: str | None = None):
    """A node's answers as the bench's capture gives them: mid refuses a 'bad' row with its handler's own 400 body
    (handed on) and fails a 'boom' row (TorchServe's 503: Failed); `failing` fails as a whole (does not load)."""

    def capture(name, bodies):
        captured.append((name, [body.name for body in bodies]))
        if name == failing:
            raise RuntimeFailure(f"ImportError: no captum; {name}: its worker did not load\n(the server's log tail)")
        if name != "w-mid":
            return [Body(name.encode() + b":" + bytes(body), "application/octet-stream") for body in bodies]
        return [
            Failed(FAILED)
            if b"boom" in body
            else Body(b'{"error": "mid refuses bad"}' if b"bad" in body else b"mid:" + bytes(body), "application/json")
            for body in bodies
        ]

    return capture


@pytest.fixture
def suite(tmp_path, monkeypatch):
    models = {node: {"url": f"{node}.mar"} for node in ("pre", "mid", "sib", "leaf", "join")}
    write_war(tmp_path / "w.war", {"models": models, "dag": DAG})
    for name in ("1_ok.bin", "2_bad.bin", "3_boom.bin"):
        (tmp_path / name).write_bytes(name.encode())
    monkeypatch.chdir(tmp_path)
    text = "targets: [{name: w, archive: w.war, members: true}]\ninputs: [{files: ['*.bin']}]\n"
    return load_suite(suite_file(tmp_path, text), catalog := Catalog(ROOT)), catalog


def test_a_refused_row_is_handed_on_a_failed_one_left_out_for_the_failing_nodes_descendants_only(suite):
    inputs, captured = SuiteInputs(*suite, ROOT / "none.pt"), []
    inputs.capture = fake_capture(captured)
    mid, sib, leaf, join = (inputs.bodies_for(f"w-{node}") for node in ("mid", "sib", "leaf", "join"))
    # the sibling and mid itself get every input; each node asked once, for the rows that reach it
    assert [b.name for b in sib] == [b.name for b in mid] == ["1_ok.bin", "2_bad.bin", "3_boom.bin"]
    assert sib.left_out is None and mid.left_out is None
    assert captured == [(f"w-{node}", ["1_ok.bin", "2_bad.bin", "3_boom.bin"]) for node in ("pre", "mid", "sib")]
    # the refused row's body goes on as the child's input, as TorchServe's workflow sends it; the failed row does not
    assert [bytes(b) for b in leaf] == [b"mid:w-pre:1_ok.bin", b'{"error": "mid refuses bad"}']
    assert [b.name for b in leaf] == [b.name for b in join] == ["1_ok.bin", "2_bad.bin"]
    assert leaf.left_out == join.left_out == f"3_boom.bin (mid {FAILED})"
    assert type(pickle.loads(pickle.dumps(leaf))) is list  # to a load process as a plain list (no torch import there)
    assert json.loads(bytes(join[1].parts["mid"])) == {"error": "mid refuses bad"} and join[1].parts["sib"] == b"w-sib:w-pre:2_bad.bin"


def test_a_node_that_fails_as_a_whole_fails_only_the_members_below_it_naming_why(suite):
    inputs, captured = SuiteInputs(*suite, ROOT / "none.pt"), []
    inputs.capture = fake_capture(captured, failing="w-sib")
    assert len(inputs.bodies_for("w-leaf")) == 2 and len(inputs.bodies_for("w-sib")) == 3  # measured
    with pytest.raises(RuntimeFailure) as failed:
        inputs.bodies_for("w-join")
    said = str(failed.value)
    assert said.startswith("w-join: none of the workflow's 3 inputs reaches it: ") and len(said.splitlines()) == 1, said
    assert (
        "1_ok.bin, 2_bad.bin (sib failed: ImportError: no captum; w-sib: its worker did not load)" in said
        and f"3_boom.bin (mid {FAILED})" in said
    )


def test_rows_keep_the_inputs_index_as_name_and_a_failure_is_grouped_by_reason():
    def answer(node, bodies):
        return [Failed("raised KeyError: 'x'") if node == "a" and bytes(b) != b"0" else b"ok" for b in bodies]

    sent = node_requests({"a": ["b"]}, [b"0", b"1", b"2"], answer)
    assert [row.name for row in sent["b"]] == ["#0", "#1", "#2"]
    assert left_out(sent["b"]) == "#1, #2 (a raised KeyError: 'x')" and left_out(sent["a"]) is None


def test_only_torchserves_own_error_fails_a_row_a_handlers_status_is_handed_on():
    def response(status, body):
        return Response(status, {"content-type": "application/json"}, json.dumps(body, indent=2).encode())

    # the worker failed the batch (ts/service.py): TorchServe's envelope, whatever the code
    assert (
        torchserve_error(response(503, {"code": 503, "type": "InternalServerException", "message": "Prediction\n failed"}))
        == "Prediction failed"
    )
    assert torchserve_error(response(400, {"code": 400, "type": "InternalServerException", "message": "raised PredictionException"}))
    # a handler's own answer, whatever status it set (context.set_response_status): the workflow hands it on
    assert torchserve_error(response(400, {"error": "bad input"})) is None
    assert torchserve_error(response(500, {"code": 500, "message": "mine", "detail": 1})) is None
    assert torchserve_error(Response(503, {}, b"not json")) is None and torchserve_error(response(200, {"code": 200, "type": "x"})) is None


def test_the_efficiency_table_says_which_member_is_missing_and_why():
    def record(target, throughput_rps, **extra):
        return {"run_id": f"r-{target}", "target": target, "throughput_rps": throughput_rps, "error": None} | extra

    records = [
        record("w", 10.0),
        record("w-mid", 30.0, inputs_left_out="3_boom.bin (mid answered 503: Prediction failed)"),
        record("w-join", None, error="RuntimeFailure: w-join: none of the workflow's 3 inputs reaches it: ..."),
    ]
    pipelines = {"w": Pipeline(("w-pre", "w-mid", "w-join"), None), "other": Pipeline(("o-a",), None)}
    analysis = analyse(records, {}, "throughput_rps", [], pipelines)
    assert analysis.efficiency == []
    assert analysis.efficiency_notes == [
        "w has no row: w-pre: not measured; w-join: RuntimeFailure: w-join: none of the workflow's 3 inputs reaches it: ...",
        "w-mid was measured without the inputs a node above it failed: 3_boom.bin (mid answered 503: Prediction failed)",
    ]
