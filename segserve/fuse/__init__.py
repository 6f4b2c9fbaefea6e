"""`segserve fuse`: a TorchServe workflow (.war) and its nodes' archives as one ordinary model archive (.mar) whose
handler (fused_handler.py, shipped in it) runs the DAG inside one worker (docs/fuse.md)."""

import json
import re
import shutil
import tempfile
import zipfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from segserve.archives.build import run_tool, tool
from segserve.archives.handler_check import probe_handler
from segserve.archives.war import check_functions
from segserve.errors import UsageError
from segserve.fuse.fused_plan import ROW_ERRORS, Workflow, read_workflow
from segserve.serving.server import archive_environment, scratch_home

HANDLER = Path(__file__).with_name("fused_handler.py")
PLAN_FILE = "fused_workflow.json"  # what fused_handler.py reads (it imports torch: not imported here)
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")  # what TorchServe accepts as a model name


def default_out(workflow: Workflow, model_store: Path) -> Path:
    # not <workflow>_fused.mar: that is segserve build's hand-made twin of its own workflows (seg_jpeg_fused.mar)
    return model_store / f"fused_{workflow.name}.mar"


def write_contents(workflow: Workflow, folder: Path, row_errors: str) -> None:
    """What the fused .mar holds beside its handler, written into `folder`: the plan, each model node's archive
    extracted under nodes/<node>/, the .war (its function file and what it brings) under workflow/."""
    folders = {}
    for node, archive in workflow.archives.items():
        folders[node] = f"nodes/{node}"
        with zipfile.ZipFile(archive) as mar:
            mar.extractall(folder / folders[node])  # zipfile keeps every member inside the folder
    functions_file = None
    if workflow.functions_file:  # the whole .war: a function node runs in its folder (ModelManager.registerModel)
        functions_file = f"workflow/{workflow.functions_file}"
        with zipfile.ZipFile(workflow.path) as war:
            war.extractall(folder / "workflow")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / PLAN_FILE).write_text(json.dumps(workflow.plan(folders, functions_file, row_errors), indent=2))


def check_imports(workflow: Workflow, folder: Path, env: dict[str, str]) -> None:
    """Each model node's handler, and the .war's function file, imported as a TorchServe worker would import it (in
    a process of its own, all at once, with environment `env`): one that does not is refused here, naming its node,
    before any server starts (a worker that cannot import its handler logs only the loader's fallback error). Each
    function node a name of the imported file (archives/war.py check_functions, as TorchServe's loader looks it up)."""
    handlers = {}  # node → (its folder, its handler string)
    for node in workflow.archives:
        manifest = json.loads((folder / "nodes" / node / "MAR-INF" / "MANIFEST.json").read_text())
        handlers[node] = (folder / "nodes" / node, manifest["model"]["handler"])
    functions = workflow.war.functions
    if functions:  # one import of the file is enough: its names answer for every function node
        path = folder / "workflow" / workflow.functions_file
        handlers[functions[0]] = (path.parent, f"{path.name}:{functions[0]}")
    with ThreadPoolExecutor(len(handlers)) as pool:
        answers = dict(zip(handlers, pool.map(lambda h: probe_handler(*h, env=env), handlers.values()), strict=True))
    for node in workflow.order:
        if node in answers and answers[node]["failure"]:
            raise UsageError(f"{workflow.path}: node {node}: its handler does not import: {answers[node]['failure']}")
    if functions:
        check_functions(workflow.war, set(answers[functions[0]]["names"] or ()))


def fuse(
    war: Path, model_store: Path, out: Path | None = None, log=print, row_errors: str = "workflow", worker_env: Sequence[str] = ()
) -> Path:
    """Write the fused .mar (out, or <model_store>/fused_<workflow>.mar); nothing is written when the .war is refused,
    and no file that was there is changed but `out`. Its handlers are imported (check_imports) with the environment
    a user's archive's workers get: of segserve's own, what TorchServe needs and the names in `worker_env` (as a
    suite's archive target lists them), in a scratch HOME (server.py archive_environment)."""
    if not model_store.is_dir():
        raise UsageError(f"--model-store {model_store}: no such folder")
    if row_errors not in ROW_ERRORS:
        raise UsageError(f"--row-errors {row_errors!r}: one of {', '.join(ROW_ERRORS)}")
    workflow = read_workflow(war, model_store)
    out = out or default_out(workflow, model_store)
    if out.suffix != ".mar" or not MODEL_NAME.fullmatch(out.stem):
        raise UsageError(f"--out {out}: must be NAME.mar with a model name of letters, digits, '_' and '-' (got {out.name!r})")
    if any(out.resolve() == p.resolve() for p in (war, *workflow.archives.values())):
        raise UsageError(f"--out {out}: is an archive of the workflow itself; name another file")
    for node in workflow.order:
        if not MODEL_NAME.fullmatch(node):
            raise UsageError(f"{war}: node {node!r}: a node name of letters, digits, '_' and '-' only can be fused")
    with tempfile.TemporaryDirectory(prefix="segserve-fuse-") as staging:
        extra = Path(staging) / "extra"
        write_contents(workflow, extra, row_errors)
        check_imports(workflow, extra, archive_environment(worker_env, scratch_home(Path(staging) / "home")))
        shutil.copy2(HANDLER, Path(staging) / HANDLER.name)
        export = Path(staging) / "export"
        export.mkdir()
        handler = str(Path(staging) / HANDLER.name)
        command = [tool("torch-model-archiver"), "--model-name", out.stem, "--version", "1.0", "--handler", handler]
        run_tool([*command, "--extra-files", str(extra), "--export-path", str(export)], log=log)
        out.parent.mkdir(parents=True, exist_ok=True)
        replaced = out.exists()
        shutil.move(export / f"{out.stem}.mar", out)
    log(f"wrote {out}: {len(workflow.order)} nodes of {war.name} ({', '.join(workflow.order)}) in one model {out.stem}")
    if replaced:  # a TorchServe that registered the old file keeps serving it: say so rather than replace it silently
        log(f"note: {out.name} replaced the file of that name; a server that registered it serves the old one until it registers it again")
    return out
