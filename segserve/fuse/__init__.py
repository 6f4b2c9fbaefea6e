"""`segserve fuse`: a TorchServe workflow (.war) and its nodes' archives as one ordinary model archive (.mar) whose
handler (fused_handler.py, shipped in it) runs the DAG inside one worker (docs/fuse.md)."""

import json
import re
import shutil
import tempfile
import zipfile
from pathlib import Path

from segserve.archives.build import run_tool, tool
from segserve.errors import UsageError
from segserve.fuse.war import Workflow, read_workflow

HANDLER = Path(__file__).with_name("fused_handler.py")
PLAN_FILE = "fused_workflow.json"  # what fused_handler.py reads (it imports torch: not imported here)
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")  # what TorchServe accepts as a model name


def default_out(workflow: Workflow, model_store: Path) -> Path:
    # not <workflow>_fused.mar: that is segserve build's hand-made twin of its own workflows (seg_jpeg_fused.mar)
    return model_store / f"fused_{workflow.name}.mar"


def fuse(war: Path, model_store: Path, out: Path | None = None, log=print) -> Path:
    """Write the fused .mar (out, or <model_store>/fused_<workflow>.mar); nothing is written when the .war is refused."""
    if not model_store.is_dir():
        raise UsageError(f"--model-store {model_store}: no such folder")
    workflow = read_workflow(war, model_store)
    out = out or default_out(workflow, model_store)
    if out.suffix != ".mar" or not MODEL_NAME.fullmatch(out.stem):
        raise UsageError(f"--out {out}: must be NAME.mar with a model name of letters, digits, '_' and '-' (got {out.name!r})")
    for node in workflow.order:
        if not MODEL_NAME.fullmatch(node):
            raise UsageError(f"{war}: node {node!r}: a node name of letters, digits, '_' and '-' only can be fused")
    with tempfile.TemporaryDirectory(prefix="segserve-fuse-") as staging:
        extra = Path(staging) / "extra"
        folders = {}
        for node, archive in workflow.archives.items():
            folders[node] = f"nodes/{node}"
            with zipfile.ZipFile(archive) as mar:
                mar.extractall(extra / folders[node])
        functions_file = None
        if workflow.functions_file:
            functions_file = f"workflow/{Path(workflow.functions_file).name}"
            (extra / "workflow").mkdir(parents=True)
            (extra / functions_file).write_bytes(workflow.functions_source)
        (extra / PLAN_FILE).write_text(json.dumps(workflow.plan(folders, functions_file), indent=2))
        shutil.copy2(HANDLER, Path(staging) / HANDLER.name)
        export = Path(staging) / "export"
        export.mkdir()
        handler = str(Path(staging) / HANDLER.name)
        command = [tool("torch-model-archiver"), "--model-name", out.stem, "--version", "1.0", "--handler", handler]
        run_tool([*command, "--extra-files", str(extra), "--export-path", str(export)], log=log)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(export / f"{out.stem}.mar", out)
    log(f"wrote {out}: {len(workflow.order)} nodes of {war.name} ({', '.join(workflow.order)}) in one model {out.stem}")
    return out
