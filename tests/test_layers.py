"""Layers: no module imports from a layer above its own (imports inside functions count too).

0 handlers/          ships inside every .mar: imports nothing of segserve
1 segserve core      catalog, archives, the server, the client: nothing of the bench
2 bench: measure     suite, parameters, plan, search, deploy, load, measure, the loop, results on disk, the autoscaler loop
3 bench: analyse     analyses and every renderer and writer of results (report, plots, sinks, core plans)
4 entry points       the CLI, the suite session, chaos, fuzz, one-off benchmarks, optimize, profile, the docs generator, the GPU bundle
"""

import ast
from pathlib import Path

from tests.conftest import ROOT

LAYERS = {
    "handlers": 0,
    **dict.fromkeys(
        [
            "segserve",
            "segserve.errors",
            "segserve.serving.http",
            "segserve.serving.processes",
            "segserve.serving.cores",
            "segserve.archives.catalog",
            "segserve.archives.build",
            "segserve.serving.server",
            "segserve.serving.ts_config",
            "segserve.model.synthetic",
            "segserve.model.train",
            "segserve.model.worker_context",
            "segserve.serving.client",
            "segserve.model.quantize",
            "segserve.model.accuracy",
            "segserve.autoscale.rules",
        ],
        1,
    ),
    **{
        f"segserve.bench.{name}": 2
        for name in (
            "__init__ load stats schema params suite inputs server_metrics disturbance plan search predict measure deploy runner "
            "bare results study"
        ).split()
    },
    "segserve.autoscale.loop": 2,  # the loop: measured beside a suite's autoscaled points
    **{f"segserve.bench.{name}": 3 for name in "analysis render report plots compare sinks core_plan".split()},
    **dict.fromkeys(
        [
            "segserve.bench.run.session",
            "segserve.bench.ab",
            "segserve.bench.replay",
            "segserve.bench.results.query",
            "segserve.bench.results.export",
            "segserve.cli",
            "segserve.qa.chaos",
            "segserve.qa.fuzz",
            "segserve.qa.fuzz_inputs",
            "segserve.qa.fuzz_worker",
            "segserve.qa.mix",
            "segserve.gpu.check",
            "segserve.optimize.variants",
            "segserve.bench.run.profiler",
            "segserve.docs.reference",
            "segserve.docs.doccheck",
            "segserve.gpu.bundle",
            "segserve.gpu.summary",
        ],
        4,
    ),
}


def module_name(path: Path, root: Path = ROOT) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts)  # segserve/bench/__init__.py: segserve.bench.__init__


def layer_of(module: str) -> int | None:
    if module == "handlers" or module.startswith("handlers."):
        return 0
    while module:
        if module in LAYERS:
            return LAYERS[module]
        module = module.rpartition(".")[0]
    return None


def project_imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return [name for name in names if name.split(".")[0] in ("handlers", "segserve")]


def test_every_module_has_a_layer():
    modules = [module_name(p) for p in sorted((ROOT / "segserve").rglob("*.py"))]
    assert [m for m in modules if layer_of(m) is None] == []


def upward_imports(paths: list[Path], root: Path = ROOT) -> list[str]:
    upward = []
    for path in paths:
        importer = module_name(path, root)
        for imported in project_imports(path):
            if layer_of(imported) > layer_of(importer):
                upward.append(f"{importer} (layer {layer_of(importer)}) imports {imported} (layer {layer_of(imported)})")
    return upward


def test_no_import_runs_from_a_lower_layer_to_a_higher_one():
    assert upward_imports(sorted([*(ROOT / "handlers").glob("*.py"), *(ROOT / "segserve").rglob("*.py")])) == []


def test_the_check_catches_an_upward_import(tmp_path):
    (tmp_path / "segserve" / "bench").mkdir(parents=True)
    runner = tmp_path / "segserve" / "bench" / "runner.py"
    runner.write_text("def f():\n    from segserve.bench.results.report import write_report\n")  # inside a function counts too
    handler = tmp_path / "handlers.py"
    handler.write_text("import segserve.archives.catalog\n")
    assert upward_imports([runner, handler], tmp_path) == [
        "segserve.bench.run.runner (layer 2) imports segserve.bench.results.report.write_report (layer 3)",
        "handlers (layer 0) imports segserve.archives.catalog (layer 1)",
    ]
