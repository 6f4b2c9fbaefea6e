"""`segserve fuse` on workflows segserve never wrote: archives built here with the official archivers from handlers
that never import segserve, the workflow and its fused .mar served by one TorchServe, the same requests sent to
both, all at once so that rows batch. A chain, a fan-out (two nodes whose handler files and helper modules share
names), function nodes first, in the middle and last, a join with per-batch state on self and mixed text and JSON
answers (workflow_shapes.py), rows refused in the middle and at the leaf, and nodes that fail a row answer the same
status, content type and bytes (--row-errors node is tested in process: tests/unit/test_fuse.py); a handler that
does not import is refused by fuse, naming its node, and the user's archives are never changed."""

import hashlib
import struct
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
import torch

from segserve.cli import main
from segserve.serving.http import request
from segserve.serving.server import TorchServe
from tests.conftest import ROOT
from tests.system import workflow_shapes as shapes
from tests.system.test_foreign_archives import workflow_archive

BIN = Path(sys.executable).parent

TINY = '''
import torch
from ts.torch_handler.base_handler import BaseHandler


class TinySegmenter(BaseHandler):
    """Raw float32 [3, 8, 8] in (a body of another size raises), one class byte per pixel out."""

    def preprocess(self, data):
        return torch.stack([torch.frombuffer(bytearray(row["body"]), dtype=torch.float32).reshape(3, 8, 8) for row in data])

    def postprocess(self, logits):
        return [bytes(labels.to(torch.uint8).flatten().tolist()) for labels in logits.argmax(1)]
'''

# two nodes' handlers are both handler.py and import their own helper.py: fusing must keep them apart
HISTOGRAM = """
from helper import summary


def handle(data, context):
    if data is None:
        return None
    return [summary(bytes(row["body"])) for row in data]
"""
HISTOGRAM_HELPER = "def summary(labels):\n    return {'counts': [labels.count(c) for c in range(3)], 'note': 'histogram \\u00e9'}\n"

CHECKSUM = """
import time

from helper import summary


class Checksum:
    def initialize(self, context):
        self.batch_size = context.system_properties["batch_size"]

    def handle(self, data, context):
        time.sleep(0.3)  # usually finishes after the histogram, so /wfpredict's order is mostly the DAG's too
        return [summary(bytes(row["body"])) for row in data]
"""
CHECKSUM_HELPER = "def summary(labels):\n    return {'sum': sum(labels), 'mean': sum(labels) / max(len(labels), 1), 'ok': True}\n"


def run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def model_archive(folder: Path, name: str, files: dict[str, str], handler: str, serialized: Path | None = None) -> None:
    source = folder / "src" / name
    source.mkdir(parents=True)
    for file, text in files.items():
        (source / file).write_text(text)
    command = [str(BIN / "torch-model-archiver"), "--model-name", name, "--version", "1.0", "--export-path", str(folder)]
    command += ["--handler", handler if handler.isidentifier() else str(source / handler)]
    extra = [str(source / f) for f in files if f != handler]
    command += ["--extra-files", ",".join(extra)] if extra else []
    run([*command, *(["--serialized-file", str(serialized)] if serialized else [])])


def user_store(folder: Path) -> None:
    torch.manual_seed(0)
    network = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(4, 3, 1))
    torch.jit.script(network.eval()).save(str(folder / "tiny.pt"))
    model_archive(folder, "tiny", {"tiny_handler.py": TINY}, "tiny_handler.py", folder / "tiny.pt")
    model_archive(folder, "histogram", {"handler.py": HISTOGRAM, "helper.py": HISTOGRAM_HELPER}, "handler.py")
    model_archive(folder, "checksum", {"handler.py": CHECKSUM, "helper.py": CHECKSUM_HELPER}, "handler.py")
    # TorchServe 0.12 drops a fast node's answer now and then (docs/torchserve_workflows.md): asked again after 2 s
    defaults = "models:\n  batch-size: 1\n  timeout-ms: 2000\n  retry-attempts: 2\n"
    workflow_archive(folder, "chain", defaults + "  tiny: {url: tiny.mar}\n  histogram: {url: histogram.mar}\ndag:\n  tiny: [histogram]\n")
    fanout = "  tiny: {url: tiny.mar}\n  histogram: {url: histogram.mar}\n  checksum: {url: checksum.mar}\n"
    workflow_archive(folder, "fanout", defaults + fanout + "dag:\n  tiny: [histogram, checksum]\n")
    for name, handler in (("animal", shapes.ANIMAL), ("breed", shapes.BREED), ("left", shapes.LEFT), ("right", shapes.RIGHT)):
        model_archive(folder, name, {f"{name}.py": handler}, f"{name}.py")
    workflow_archive(folder, "dogbreed", shapes.DOGBREED_SPEC, shapes.DOGBREED_FUNCTIONS)
    workflow_archive(folder, "aggregate", shapes.AGGREGATE_SPEC, shapes.AGGREGATE_FUNCTIONS)
    model_archive(folder, "absent", {"absent.py": shapes.MISSING}, "absent.py")
    workflow_archive(folder, "missing", defaults + "  absent: {url: absent.mar}\ndag:\n  absent: []\n")


WORKFLOWS = ("chain", "fanout", "dogbreed", "aggregate")


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One TorchServe serving each workflow and its fused .mar (batch size 4); `store_before`: the digests of the
    user's files before any fuse."""
    store = tmp_path_factory.mktemp("user_store")
    user_store(store)
    before = digests(store)
    server = TorchServe(tmp_path_factory.mktemp("ts"), store, ROOT / "config.properties", free_ports=True)
    server.store_before = before
    with server, ThreadPoolExecutor(4) as pool:
        # the workflows' workers start while this thread fuses; each fused .mar is registered once it is written
        registered = [pool.submit(server.register_workflow, f"{name}.war", name) for name in WORKFLOWS]
        for name in WORKFLOWS:
            assert main(["fuse", str(store / f"{name}.war"), "--model-store", str(store)]) == 0
            fused = {"workers": 1, "batch_size": 4, "max_batch_delay_ms": 200}
            registered.append(pool.submit(server.register_model, f"fused_{name}.mar", f"fused_{name}", **fused))
        for registration in registered:
            registration.result()
        yield server


def post(server: TorchServe, paths_and_bodies: list[tuple[str, bytes]]):
    """All at once, so the fused model gets them in one batch where it can."""
    token, url = server.token("inference"), server.url("inference")
    with ThreadPoolExecutor(len(paths_and_bodies)) as pool:
        return list(pool.map(lambda pb: request(url, "POST", pb[0], token, pb[1], timeout_s=60), paths_and_bodies))


def tensors(count: int) -> list[bytes]:
    generator = torch.Generator().manual_seed(1)
    return [struct.pack("192f", *torch.randn(192, generator=generator).tolist()) for _ in range(count)]


def in_leaf_order(body: bytes, leaves: list[str]) -> bytes:
    """A /wfpredict answer of several leaves with its top-level blocks moved into `leaves` order, text untouched.

    WorkflowManager lists the leaves in the order they finished, which a busy host can swap; the fused model lists
    them in DAG order. Each block is cut from Gson's own text (a top-level key starts a line with two spaces), so the
    expected bytes are still TorchServe's, not segserve's serialiser."""
    lines = body.decode("utf-8").split("\n")
    assert lines[0] == "{" and lines[-2:] == ["}", ""], body
    blocks: dict[str, list[str]] = {}
    for line in lines[1:-2]:
        if line.startswith('  "'):
            key = line[3 : line.index('": ')]
            blocks[key] = []
        blocks[key].append(line)
    assert sorted(blocks) == sorted(leaves), body
    for block in blocks.values():
        block[-1] = block[-1].removesuffix(",")
    return ("{\n" + ",\n".join("\n".join(blocks[leaf]) for leaf in leaves) + "\n}\n").encode("utf-8")


def same_answers(server: TorchServe, name: str, bodies: list[bytes], leaves: list[str] | None = None, fused: str = ""):
    """/wfpredict/<name> and /predictions/fused_<name> (or `fused`) answer each row with the same status, content type
    and bytes; the fused answers."""
    workflow = post(server, [(f"/wfpredict/{name}", body) for body in bodies])
    answers = post(server, [(f"/predictions/{fused or f'fused_{name}'}", body) for body in bodies])
    expected = [(r.status, r.content_type, in_leaf_order(r.body, leaves) if leaves and r.status == 200 else r.body) for r in workflow]
    assert [(r.status, r.content_type, r.body) for r in answers] == expected
    return answers


def test_a_fused_chain_answers_the_workflows_bytes(served):
    answers = same_answers(served, "chain", tensors(6))
    assert {r.status for r in answers} == {200}
    assert answers[0].body.startswith(b'{\n  "counts": [') and b'"note": "histogram \\u00e9"' in answers[0].body


def test_a_fused_fan_out_answers_its_leaves_as_the_workflow_combines_them(served):
    answers = [r.body for r in same_answers(served, "fanout", tensors(4), leaves=["histogram", "checksum"])]
    # each leaf's helper.py, not the other's: the two handler.py and helper.py of the nodes stay apart
    assert answers[0].startswith(b'{\n  "histogram": {\n    "counts": [') and b'"checksum": {\n    "sum": ' in answers[0]
    assert answers[0].endswith(b'"ok": true\n  }\n}\n')
    assert '"note": "histogram é"'.encode() in answers[0]  # Gson writes the leaf's \u00e9 back as UTF-8


def test_a_fused_join_with_per_batch_state_answers_text_and_json_rows_and_refusals_as_the_workflow(served):
    """pre_processing → [animal, breed], animal → [breed]: the join gets each parent's answer under its name; rows
    refused in the middle (animal) and at the leaf (breed) are answered 200 with what the next node made of them."""
    bodies = [b" dog-rex ", b"cat-tom", b"dog-mutt", b"refuse", b"dog-fido", b"cat-felix", b"dog-mutt-2", b"dog-ace"]
    answers = same_answers(served, "dogbreed", bodies)
    assert {r.status for r in answers} == {200} and {r.content_type for r in answers} == {"application/json"}
    dog = answers[0].json()
    assert dog["parents"] == ["pre_processing", "animal"], dog
    assert dog["headers"] == {"request_length": str(len(bodies[0])), "animal": {"content-type": ""}}, dog
    assert answers[1].body == b"It's not a dog: cat"
    assert answers[2].json() == {"error": f"breed {answers[2].json()['error'].split()[1]} unknown"}  # the leaf's refusal
    assert answers[3].body == b'It\'s not a dog: {\n  "error": "not an animal"\n}'  # the middle's refusal, handed on


def test_a_fused_fan_out_with_an_aggregating_function_and_a_function_in_the_middle(served):
    answers = same_answers(served, "aggregate", [b"abc", b"Hello", b"x y", b"q"])
    assert answers[1].json() == {"middle": {"via": "middle", "left": {"upper": "HELLO", "batch": True}}, "right": "olleH"}


def test_rows_a_node_fails_are_answered_as_the_workflow_answers_them_and_their_batch_mates_are_served(served):
    """A node answering the wrong number of rows and a node raising fail their row with the workflow's own 500 (stock
    TorchServe sent each again retry-attempts times first); the rows beside them are served."""
    answers = same_answers(served, "aggregate", [b"abc", b"many", b"xyz"])
    assert [r.status for r in answers] == [200, 500, 200]
    assert answers[1].json() == {"code": 500, "type": "InternalServerException", "message": "Error executing right"}
    answers = same_answers(served, "chain", [b"not a tensor", *tensors(3)])
    assert [r.status for r in answers] == [500, 200, 200, 200] and answers[0].json()["message"] == "Error executing tiny"


def test_a_handler_that_does_not_import_is_refused_by_name_and_the_users_files_are_never_changed(served, capsys):
    store = served.model_store
    assert main(["fuse", str(store / "missing.war"), "--model-store", str(store)]) == 2
    err = capsys.readouterr().err
    assert "node absent: its handler does not import: ModuleNotFoundError: No module named 'segserve_tests_no_such_module'" in err
    assert not (store / "fused_missing.mar").exists()
    after = digests(store)
    assert {name: after.get(name) for name in served.store_before} == served.store_before
    assert sorted(set(after) - set(served.store_before)) == sorted(f"fused_{n}.mar" for n in WORKFLOWS)


def test_segserves_own_workflow_fused_answers_the_workflows_jpegs_and_its_suite_plans(served, model_store, tmp_path, monkeypatch):
    """`segserve fuse` of seg_jpeg.war (segserve's own handlers, the class map crossing as bytes): the same JPEG bytes
    as /wfpredict/seg_jpeg; and benchmarks/fuse_vs_handmade.yaml plans from a folder holding what the fuse wrote."""
    fused = tmp_path / "model_store" / "seg_jpeg_fusedby.mar"
    assert main(["fuse", str(model_store / "seg_jpeg.war"), "--model-store", str(model_store), "--out", str(fused)]) == 0
    for name in ("seg_jpeg.war", "seg.mar", "jpeg.mar"):
        (served.model_store / name).write_bytes((model_store / name).read_bytes())
    (served.model_store / fused.name).write_bytes(fused.read_bytes())
    served.register_workflow("seg_jpeg.war", "seg_jpeg")
    served.register_model(fused.name, "seg_jpeg_fusedby", workers=1)
    token, url = served.token("inference"), served.url("inference")
    for image in sorted((ROOT / "samples").glob("*.jpg")):  # one at a time: a batch of one in both
        body = image.read_bytes()
        workflow = request(url, "POST", "/wfpredict/seg_jpeg", token, body, timeout_s=60)
        one = request(url, "POST", "/predictions/seg_jpeg_fusedby", token, body, timeout_s=60)
        assert (one.status, workflow.status) == (200, 200) and one.body == workflow.body and one.body[:2] == b"\xff\xd8", image
    served.unregister("workflows", "seg_jpeg")
    served.unregister("models", "seg_jpeg_fusedby")
    # the suite, run from the project (its catalog targets), with the fused archive where this test wrote it
    monkeypatch.chdir(ROOT)
    for name in ("fuse_vs_handmade", "fuse_vs_handmade_raw128", "fuse_rate"):
        suite = tmp_path / f"{name}.yaml"
        text = (ROOT / "benchmarks" / f"{name}.yaml").read_text()
        suite.write_text(text.replace("archive: model_store/seg_jpeg_fusedby.mar", f"archive: {fused}"))
        assert main(["bench", str(suite), "--dry-run"]) == 0


def bare_venv(folder: Path) -> Path:
    """A venv with TorchServe and torch (this venv's site-packages, through a .pth) and nothing of segserve: the
    editable install's own .pth files are not read from there, and the project folder is not on its path."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    probe = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.run([str(folder / "bin" / "python"), "-c", probe], capture_output=True, text=True, check=True).stdout.strip())
    ours = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    (site / "this-venvs-packages.pth").write_text(ours + "\n")
    launcher = folder / "bin" / "torchserve"  # what pip writes for torchserve's console script
    launcher.write_text(f"#!{folder / 'bin' / 'python'}\nimport sys\nfrom ts.model_server import start\nsys.exit(start())\n")
    launcher.chmod(0o755)
    return folder


def test_a_fused_mar_is_served_by_a_torchserve_with_nothing_of_segserve_installed(served, tmp_path):
    """What `segserve fuse` writes needs TorchServe only: served from a venv where segserve and its handlers do not
    import, it answers the workflow's bytes (the workflow's answers from the server with segserve)."""
    venv = bare_venv(tmp_path / "bare")
    imports = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import ts, torch\ntry:\n import segserve\nexcept ImportError:\n print('no segserve')"],
        capture_output=True, text=True, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert imports.stdout.strip() == "no segserve", imports.stderr
    bodies = tensors(4)
    workflow = post(served, [("/wfpredict/chain", body) for body in bodies])
    assert all(r.status == 200 for r in workflow), [r.text() for r in workflow]
    store = tmp_path / "store"
    store.mkdir()
    (store / "fused_chain.mar").write_bytes((served.model_store / "fused_chain.mar").read_bytes())
    bare = TorchServe(tmp_path / "ts", store, ROOT / "config.properties", free_ports=True, venv=venv, env={"PYTHONPATH": ""})
    with bare:
        bare.register_model("fused_chain.mar", "fused_chain", workers=1, batch_size=4, max_batch_delay_ms=200)
        fused = post(bare, [("/predictions/fused_chain", body) for body in bodies])
        # its worker runs the bare venv's Python (TorchServe hands its launcher's interpreter to every worker)
        (worker,) = bare.describe("fused_chain")["workers"]
        python = psutil.Process(int(worker["pid"])).cmdline()[0]
    assert python == str(venv / "bin" / "python")
    assert [(r.status, r.body) for r in fused] == [(r.status, r.body) for r in workflow]
