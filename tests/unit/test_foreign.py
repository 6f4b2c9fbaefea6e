"""Archive targets (a user's .mar or .war) in a suite: what applies to them, what is refused in one line, and the
request formats a model of any input takes (raw tensors, JSON from a template, multipart parts)."""

import email.parser
import io
import json
import zipfile

import pytest
import torch
import yaml

from segserve.archives.catalog import Catalog
from segserve.archives.war import read_dag
from segserve.bench.run.dag_requests import Failed, FunctionFile, content_type_of, node_requests, worker_row
from segserve.bench.run.inputs import Body, request_bodies
from segserve.bench.run.suite_inputs import SuiteInputs
from segserve.bench.suite import plan as planning
from segserve.bench.suite.input_spec import InputSpec
from segserve.bench.suite.spec import load_suite
from segserve.errors import RuntimeFailure, UsageError
from tests.conftest import ROOT

# a .war's function file: what each call saw (a dict: the worker sends json.dumps(indent=2)), or by its input: text,
# a tensor (torch.save), an exception, the process gone
FUNCTIONS = """
import os

LOADS = []


def fn_first(data, context):
    if data is None:  # TorchServe's load-time call
        LOADS.append(context.model_name)
        return None
    body = data[0]["body"]
    if body in (b"text", b"tensor", b"raise", b"exit"):
        os._exit(3) if body == b"exit" else None
        if body == b"raise":
            raise ValueError("not this one")
        if body == b"text":
            return ["some text"]
        import torch  # only here: the node's process imports torch for nothing else

        return [torch.arange(3)]
    here = os.path.samefile(os.getcwd(), context.system_properties["model_dir"])
    seen = {"rows": len(data), "type": type(body).__name__, "size": len(body), "loads": len(LOADS), "model": context.model_name}
    environment = sorted(name for name in os.environ if name.startswith("SEGSERVE_TEST_"))
    return [{**seen, "batch_size": context.system_properties["batch_size"], "cwd_is_model_dir": here, "env": environment}]
"""


def row_of(body: bytes) -> tuple[dict, dict]:
    return worker_row(body, content_type_of(body))


def write_war(path, spec: dict, functions: str = "") -> None:
    """A .war as torch-workflow-archiver writes one (its manifest, spec and handler file)."""
    manifest = {"workflow": {"workflowName": path.stem, "specFile": "spec.yaml", "handler": "handler.py"}}
    with zipfile.ZipFile(path, "w") as war:
        war.writestr("WAR-INF/MANIFEST.json", json.dumps(manifest))
        war.writestr("spec.yaml", yaml.safe_dump(spec, sort_keys=False))
        war.writestr("handler.py", functions)


def suite_file(tmp_path, text: str):
    path = tmp_path / "suite.yaml"
    path.write_text(text)
    return path


@pytest.fixture
def archives(tmp_path):
    (tmp_path / "mine.mar").write_bytes(b"not opened by segserve")
    spec = {"models": {"batch-size": 1, "pre": {"url": "pre.mar"}, "post": {"url": "post.mar"}}, "dag": {"pre": ["post", "tail"]}}
    write_war(tmp_path / "flow.war", spec, "def tail(data, context):\n    return data\n")
    write_war(tmp_path / "fn.war", {"models": {"post": {"url": "post.mar"}}, "dag": {"tail": ["post"]}})
    # TorchServe's dog-breed shape: a function node first, a join below it and a model node
    joined = {
        "models": {n: {"url": f"{n}.mar"} for n in ("model_a", "join_b")},
        "dag": {"fn_first": ["model_a", "join_b"], "model_a": ["join_b"]},
    }
    write_war(tmp_path / "join.war", joined, FUNCTIONS)
    cycle = {"models": {n: {"url": f"{n}.mar"} for n in ("a", "b", "c")}, "dag": {"a": ["b"], "b": ["c"], "c": ["b"]}}
    write_war(tmp_path / "cycle.war", cycle)
    write_war(tmp_path / "two.war", {"models": {n: {"url": f"{n}.mar"} for n in ("a", "b", "c")}, "dag": {"a": ["c"], "b": ["c"]}})
    write_war(tmp_path / "escape.war", {"models": {"a": {"url": "../../a.mar"}}, "dag": {"a": []}})
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01")
    return tmp_path


def test_archive_targets_take_registration_values_and_workers_per_node(archives, monkeypatch):
    monkeypatch.chdir(archives)
    suite = load_suite(
        suite_file(
            archives,
            """
targets:
  - {name: mine, archive: mine.mar}
  - {name: flow, archive: flow.war}
inputs: [{tensor: {dtype: float16, shape: [3, 8, 8]}}]
grid:
  archive: {batch_size: [1, 4], response_timeout: [30]}
  runtime: {post_workers: [1, 2]}
""",
        ),
        catalog := Catalog(ROOT),
    )
    flow = catalog.targets["flow"]
    assert flow.kind == "workflow" and [n.name for n in flow.nodes] == ["pre", "post"]  # `tail`: a function node
    assert flow.models == ("flow__pre", "flow__post") and flow.leaves == ("post", "tail")
    points = planning.expand(suite, catalog)
    params = {(p.target, tuple(sorted(p.params.items()))) for p in points}
    # only TorchServe's values: no precision or jpeg_quality (segserve handler settings) on a user's handler
    assert all(set(dict(p.archive)) == {"batch_size", "max_batch_delay_ms", "response_timeout"} for p in points), params
    assert sorted((p.target, p.params["batch_size"], p.workers.get("post")) for p in points if p.target == "flow") == [
        ("flow", 1, 1),
        ("flow", 1, 2),
        ("flow", 4, 1),
        ("flow", 4, 2),
    ]
    assert len([p for p in points if p.target == "mine"]) == 2


@pytest.mark.parametrize(
    ("grid", "named"),
    [
        ("archive: {precision: [fp16]}", "grid.archive.precision: a setting of segserve's handlers"),
        ("archive: {nodes: {pre: {micro_batch_size: [2]}}}", "grid.archive.nodes.pre.micro_batch_size: a setting of segserve's handlers"),
        ("archive: {nodes: {pre: {precision: [fp16]}}}", "grid.archive.nodes.pre.precision: a setting of segserve's handlers"),
    ],
)
def test_a_segserve_handler_setting_on_an_archive_target_is_refused_naming_it(archives, monkeypatch, grid, named):
    monkeypatch.chdir(archives)
    text = f"targets: [{{name: flow, archive: flow.war}}]\ninputs: [{{files: [blob.bin]}}]\ngrid: {{{grid}}}\n"
    with pytest.raises(UsageError) as refused:
        load_suite(suite_file(archives, text), Catalog(ROOT))
    assert named in str(refused.value) and len(str(refused.value).splitlines()) == 1, str(refused.value)


@pytest.mark.parametrize(
    ("target", "inputs", "says"),
    [
        ("{name: mine, archive: gone.mar}", "[{files: [blob.bin]}]", "targets.mine.archive: no such file 'gone.mar'"),
        ("{name: mine, archive: mine.zip}", "[{files: [blob.bin]}]", "give a .mar or .war file"),
        ("{name: seg, archive: mine.mar}", "[{files: [blob.bin]}]", "'seg' is a catalog target"),
        ("{name: mine, archive: mine.mar}", "[{files: [missing.bin]}]", "inputs: no file matches 'missing.bin'"),
        ("{name: mine, archive: mine.mar}", "[{multipart: [{file: blob.bin}]}]", "inputs.0.multipart.0.name: Field required"),
        ("{name: mine, archive: mine.mar, inputs: [{files: [nope.bin]}]}", "[{files: [blob.bin]}]", "no file matches 'nope.bin'"),
        ("{name: mine, archive: mine.mar, members: true}", "[{files: [blob.bin]}]", "members: only a .war has members"),
        (
            "{name: c, archive: cycle.war, members: true}",
            "[{files: [blob.bin]}]",
            "node b: a cycle (b → c → b) (TorchServe: Not a valid DAG)",
        ),
        (
            "{name: t, archive: two.war, members: true}",
            "[{files: [blob.bin]}]",
            "the dag has 2 start nodes (a, b) (TorchServe: DAG should have only one start node)",
        ),
        ("{name: e, archive: escape.war}", "[{files: [blob.bin]}]", "targets.e: escape.war: models.a.url: '../../a.mar' is not a relative"),
    ],
)
def test_bad_archive_targets_and_inputs_are_refused_in_one_line_before_anything_starts(archives, monkeypatch, target, inputs, says):
    monkeypatch.chdir(archives)
    with pytest.raises(UsageError) as refused:
        load_suite(suite_file(archives, f"targets: [{target}]\ninputs: {inputs}\n"), Catalog(ROOT))
    assert says in str(refused.value) and len(str(refused.value).splitlines()) == 1, str(refused.value)


def test_a_wars_members_are_targets_after_it_the_root_sent_its_inputs_the_others_their_parents_answers(archives, monkeypatch):
    monkeypatch.chdir(archives)
    text = "targets: [{name: flow, archive: flow.war, members: true, inputs: [{files: [blob.bin]}]}, {name: mine, archive: mine.mar}]\n"
    suite = load_suite(suite_file(archives, text + "inputs: [{tensor: {dtype: float16, shape: [3, 8, 8]}}]\n"), catalog := Catalog(ROOT))
    assert suite.target_names == ["flow", "flow-pre", "flow-post", "mine"]
    assert suite.archive_targets["flow-pre"].inputs == suite.archive_targets["flow"].inputs
    assert suite.archive_targets["flow-post"].inputs is None
    assert (catalog.foreign["flow-pre"].workflow, catalog.foreign["flow-post"].workflow) == (None, "flow")
    # the workflow's nodes are its members (the efficiency table's bounds); a member's one node is the .war's node
    assert catalog.targets["flow"].members == ("flow-pre", "flow-post")
    assert [n.name for n in catalog.targets["flow-post"].nodes] == ["post"]
    # a member's run id follows its parent's inputs and archive: another root input, another id for both
    ids = {p.target: p.run_id for p in planning.expand(suite, catalog, SuiteInputs(suite, catalog, ROOT / "none.pt").digests())}
    (archives / "blob.bin").write_bytes(b"\x00\x02")
    again = {p.target: p.run_id for p in planning.expand(suite, catalog, SuiteInputs(suite, catalog, ROOT / "none.pt").digests())}
    assert ids["flow-post"] != again["flow-post"] and ids["flow-pre"] != again["flow-pre"] and ids["mine"] == again["mine"]
    with pytest.raises(RuntimeFailure, match="captured on a server"):  # no server to capture on: said, not guessed
        SuiteInputs(suite, catalog, ROOT / "none.pt").bodies_for("flow-post")


def test_tensor_json_and_multipart_bodies(tmp_path):
    (tmp_path / "mask.bin").write_bytes(bytes([1, 0, 1, 1]))
    specs = [
        InputSpec.model_validate({"tensor": {"dtype": "int64", "shape": [2, 3], "count": 2, "seed": 5}}),
        InputSpec.model_validate({"json_template": {"template": {"text": "request {index}", "n": [1, "{index}"]}, "count": 2}}),
        InputSpec.model_validate(
            {
                "multipart": [
                    {"name": "tokens", "tensor": {"dtype": "int32", "shape": [4]}},
                    {"name": "mask", "file": str(tmp_path / "mask.bin")},
                ]
            }
        ),
    ]
    tensors, texts, (form,) = (request_bodies([spec]) for spec in specs)
    assert [len(body) for body in tensors] == [2 * 3 * 8] * 2 and tensors[0] != tensors[1]
    assert torch.frombuffer(bytearray(tensors[0]), dtype=torch.int64).reshape(2, 3).max() < 100
    assert request_bodies(specs[:1]) == tensors  # the same seed, the same bytes (run ids stay)
    assert [json.loads(body) for body in texts] == [{"text": "request 0", "n": [1, "0"]}, {"text": "request 1", "n": [1, "1"]}]
    assert texts[0].content_type == "application/json"
    message = email.parser.BytesParser().parsebytes(f"Content-Type: {form.content_type}\r\n\r\n".encode() + bytes(form))
    parts = {part.get_param("name", header="content-disposition"): part.get_payload(decode=True) for part in message.get_payload()}
    assert parts == {
        "tokens": bytes(request_bodies([InputSpec.model_validate({"tensor": {"dtype": "int32", "shape": [4]}})])[0]),
        "mask": bytes([1, 0, 1, 1]),
    }
    assert request_bodies(specs[2:]) == [form]  # the boundary comes from the parts: the same body every run


def test_a_war_is_registered_from_a_copy_with_each_nodes_values_written_into_its_spec(archives, tmp_path):
    from segserve.archives.foreign import read_archive

    (archives / "pre.mar").write_bytes(b"pre")
    store = tmp_path / "store"
    store.mkdir()
    original = (archives / "flow.war").read_bytes()
    flow = read_archive("flow", str(archives / "flow.war"), None)
    name = flow.install(store, {"pre": {"batch-size": 4, "timeout-ms": 30000, "min-workers": 2, "max-workers": 2}})
    with zipfile.ZipFile(store / name) as war:
        spec = yaml.safe_load(war.read("spec.yaml"))
        assert sorted(war.namelist()) == ["WAR-INF/MANIFEST.json", "handler.py", "spec.yaml"]
    assert spec["models"]["pre"] == {"url": "pre.mar", "batch-size": 4, "timeout-ms": 30000, "min-workers": 2, "max-workers": 2}
    assert spec["models"]["post"] == {"url": "post.mar"} and spec["dag"] == {"pre": ["post", "tail"]}
    assert (archives / "flow.war").read_bytes() == original  # the user's file is left as it was
    assert (store / "pre.mar").read_bytes() == b"pre" and not (store / "post.mar").exists()  # a missing node: TorchServe says so


def test_urls_are_printed_and_kept_without_their_credentials():
    from segserve.archives.archive_urls import folder_of, masked, masked_text

    assert (
        masked("https://user:pw@host:8443/a/b.mar?X-Amz-Signature=s3cr3t&x=1") == "https://***@host:8443/a/b.mar?X-Amz-Signature=***&x=***"
    )
    assert masked("s3://bucket/v1/seed.war") == "s3://bucket/v1/seed.war"
    text = 'targets: [{name: a, archive: "http://u:p@127.0.0.1:9/a.mar"}, {name: b, archive: s3://x/y.war}]'
    assert masked_text(text) == 'targets: [{name: a, archive: "http://***@127.0.0.1:9/a.mar"}, {name: b, archive: s3://x/y.war}]'
    assert folder_of("s3://bucket/v1/seed.war") == "s3://bucket/v1/"


def test_the_dag_is_evaluated_parents_first_and_each_node_sent_what_the_workflow_sends_it():
    # the spec may list a child before its parents: the order comes from the edges
    assert read_dag({"c": ["d"], "a": ["b", "c"], "b": ["d"]}, "x").order == ["a", "c", "b", "d"]  # ties in the order first named
    dag = {"fn_first": ["model_a", "join_b"], "model_a": ["join_b"]}
    asked = []

    def answer(node, bodies):
        asked.append((node, [bytes(b) for b in bodies]))
        return [node.encode() + b":" + bytes(body) for body in bodies]

    sent = node_requests(dag, [b"x", b"yy"], answer)
    # parents first, each asked once; the leaf (join_b) is never asked: nothing is sent its answers
    assert asked == [("fn_first", [b"x", b"yy"]), ("model_a", [b"fn_first:x", b"fn_first:yy"])]
    assert sent["fn_first"] == [b"x", b"yy"] and sent["model_a"] == [b"fn_first:x", b"fn_first:yy"]
    # one parent: its answer is the body; a join: one form field per parent, named after it, as TorchServe's worker
    # hands the join's handler its row inside the workflow ({parent: bytearray}, no content type)
    row, headers = row_of(sent["model_a"][0])
    assert row == {"body": bytearray(b"fn_first:x")} and type(row["body"]) is bytearray
    row, headers = row_of(sent["join_b"][1])
    assert row == {"fn_first": bytearray(b"fn_first:yy"), "model_a": bytearray(b"model_a:fn_first:yy")}
    assert all(type(value) is bytearray for value in row.values())
    assert headers == {"fn_first": {"content-type": ""}, "model_a": {"content-type": ""}}


def test_a_worker_row_decodes_as_torchserves_worker_does():
    assert row_of(Body(b'{"x": 1}', "application/json"))[0] == {"body": {"x": 1}}
    assert row_of(Body(b"hello", "text/plain; charset=utf-8"))[0] == {"body": "hello"}
    assert row_of(Body(b"{oops", "application/json"))[0] == {"body": bytearray(b"{oops")}  # forwarded undecoded
    assert row_of(Body(b"a=1&b=", "application/x-www-form-urlencoded"))[0] == {"a": bytearray(b"1"), "b": bytearray()}
    boundary = "xyz"
    form = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="a.json"\r\nContent-Type: application/json\r\n\r\n'
        f'{{"k": 2}}\r\n--{boundary}--\r\n'
    )
    row, headers = row_of(Body(form.encode(), f"multipart/form-data; boundary={boundary}"))
    assert row == {"image": {"k": 2}} and headers == {"image": {"content-type": "application/json"}}  # a file part keeps its type


def test_function_nodes_run_from_the_wars_own_file_one_row_at_a_time_encoded_as_a_worker_encodes(tmp_path, monkeypatch):
    write_war(tmp_path / "wf.war", {"models": {}, "dag": {"fn_first": []}}, FUNCTIONS)
    monkeypatch.setenv("SEGSERVE_TEST_DROPPED", "a credential, say")
    kept = {"SEGSERVE_TEST_KEPT": "1", "PATH": "/usr/bin:/bin"}
    with FunctionFile(tmp_path / "wf.war", "wf", "handler.py", env=kept) as functions:
        bodies = [b"abc", Body(b'{"x": 1, "y": 2}', "application/json"), b"text", b"tensor"]
        answered = functions.answers("fn_first", bodies)
        # a row it raises on is failed (its worker would fail it), its batch-mates answered
        raised = functions.answers("fn_first", [b"abc", b"raise"])
        assert raised[1] == Failed("raised ValueError: not this one") and json.loads(raised[0])["size"] == 3
        with pytest.raises(RuntimeFailure, match=r"^wf.war: function node 'fn_first': its process ended with status 3 and no answer"):
            functions.answers("fn_first", [b"exit"])
        folder = functions.folder
    # one process for the node (its load once), one row at a time, in the .war's folder, with the environment given
    seen = {"rows": 1, "type": "bytearray", "size": 3, "loads": 1, "model": "wf__fn_first"}
    seen |= {"batch_size": 1, "cwd_is_model_dir": True, "env": ["SEGSERVE_TEST_KEPT"]}
    assert answered[0] == json.dumps(seen, indent=2).encode()  # a dict: what the worker sends, byte for byte
    assert json.loads(answered[1]) == {**seen, "type": "dict", "size": 2}  # a JSON request: decoded as the worker does
    assert answered[2] == b"some text" and torch.equal(torch.load(io.BytesIO(answered[3])), torch.arange(3))
    assert not folder.exists()  # the copy goes with it


def test_a_join_workflows_members_are_sent_what_its_dag_sends_them_each_node_answering_once(archives, monkeypatch):
    monkeypatch.chdir(archives)
    text = "targets: [{name: j, archive: join.war, members: true}]\ninputs: [{files: [blob.bin]}, {files: [mine.mar]}]\n"
    suite = load_suite(suite_file(archives, text), catalog := Catalog(ROOT))
    # the model nodes are the members (the efficiency table's bounds); the function node is not one
    assert suite.target_names == ["j", "j-model_a", "j-join_b"] and catalog.targets["j"].members == ("j-model_a", "j-join_b")
    assert catalog.foreign["j-model_a"].workflow == "j" and catalog.foreign["j-join_b"].workflow == "j"
    inputs = SuiteInputs(suite, catalog, ROOT / "none.pt")
    captured = []

    def capture(name, bodies):
        captured.append(name)
        return [b"A" + bytes(body[-8:]) for body in bodies]

    inputs.capture = capture
    model_a, join_b = inputs.bodies_for("j-model_a"), inputs.bodies_for("j-join_b")
    assert captured == ["j-model_a"]  # the DAG evaluated once for both members; the leaf never captured
    assert [json.loads(body)["size"] for body in model_a] == [2, len(b"not opened by segserve")]  # fn_first's answers
    rows = [row_of(body)[0] for body in join_b]
    assert rows == [{"fn_first": bytearray(a), "model_a": bytearray(b"A" + a[-8:])} for a in model_a]
