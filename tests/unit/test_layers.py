"""Layers, one per folder: no module imports from a folder above its own (imports inside functions count too),
and no two modules import each other, directly or around a circle.

 0 handlers/                 ships inside every .mar: imports nothing of segserve
 1 segserve/ (its root)      errors, the checkout's root
 2 segserve/model/           the network: synthetic data, training, int8, accuracy, the bare forward, handlers in process
 3 segserve/archives/        the catalog, building .mar/.war files, archives in S3
 4 segserve/serving/         one TorchServe: its processes, config, cores, client, metrics, a pipeline started on it
   segserve/engines/,        what both engines run of TorchServe's worker protocol; the Ray engine (any .mar on Ray
   engines/ray/              Serve with TorchServe's inference API)
 5 segserve/autoscale/       the autoscaler's rules and its loop beside a server
 6 segserve/bench/suite/     a suite: its file, parameters, plan, columns
 7 segserve/bench/results/   records on disk, analyses, renderers, exports
 8 segserve/bench/search/    strategies behind one interface, and the studies they keep
 9 segserve/bench/run/       load, measurement, deployment (targets/: one module per kind), the loop, a whole suite run
10 segserve/bench/           commands over runs: ab, replay
11 segserve/optimize/, qa/,  optimised variants; fuzz, chaos, mix; a workflow fused into one .mar; a TorchServe's
   fuse/, audit/             security audit
12 segserve/cli/             the commands
13 segserve/docs/, gpu/      the reference pages (from the CLI's parser) and the doc check; the GPU bundle (runs commands)
"""

import ast
from pathlib import Path

from tests.conftest import ROOT

FOLDERS = {
    "handlers": 0,
    "segserve": 1,
    "segserve.machine": 1,
    "segserve.model": 2,
    "segserve.archives": 3,
    "segserve.serving": 4,
    "segserve.engines": 4,
    "segserve.engines.ray": 4,
    "segserve.autoscale": 5,
    "segserve.bench.suite": 6,
    "segserve.bench.results": 7,
    "segserve.bench.search": 8,
    "segserve.bench.run": 9,
    "segserve.bench.run.targets": 9,
    "segserve.bench": 10,
    "segserve.optimize": 11,
    "segserve.qa": 11,
    "segserve.fuse": 11,
    "segserve.audit": 11,
    "segserve.cli": 12,
    "segserve.docs": 13,
    "segserve.gpu": 13,
}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)  # a package is its folder's name


def project_imports(path: Path, modules: set[str]) -> set[str]:
    """The project modules a file imports, each resolved to the longest module name that exists."""

    def resolve(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {resolve(n) for n in names if n.split(".")[0] in ("handlers", "segserve")} - {""}


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    paths = [*(root / "handlers").glob("*.py"), *(root / "segserve").rglob("*.py")]
    return {module_name(p, root): p for p in sorted(paths) if p.name != "__main__.py"}


def folder(module: str) -> str:
    """The folder a module's file is in (a package's __init__ is in its own folder)."""
    if module.split(".")[0] == "handlers":
        return "handlers"
    while module not in FOLDERS:
        module = module.rpartition(".")[0]
    return module


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    modules = project_modules(root)
    names = set(modules)
    return {name: project_imports(path, names) - {name} for name, path in modules.items()}


def upward_imports(imports: dict[str, set[str]]) -> list[str]:
    upward = []
    for importer, imported in sorted(imports.items()):
        for name in sorted(imported):
            if FOLDERS[folder(name)] > FOLDERS[folder(importer)]:
                upward.append(
                    f"{importer} ({folder(importer)}, layer {FOLDERS[folder(importer)]}) imports {name} (layer {FOLDERS[folder(name)]})"
                )
    return upward


def circles(imports: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of two or more modules (Tarjan's algorithm): modules that import each other."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(imports.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(imports):
        if node not in index:
            visit(node)
    return found


def test_every_folder_has_a_layer():
    assert sorted({folder(m) for m in project_modules()} - set(FOLDERS)) == []
    assert sorted(f for f in FOLDERS if f != "handlers" and not (ROOT / f.replace(".", "/") / "__init__.py").exists()) == []


def test_no_import_runs_from_a_lower_layer_to_a_higher_one():
    assert upward_imports(graph()) == []


def test_no_two_modules_import_each_other_even_around_a_circle():
    assert circles(graph()) == []


def test_no_two_modules_share_a_name():
    stems = {}
    for path in [*(ROOT / "handlers").glob("*.py"), *(ROOT / "segserve").rglob("*.py")]:
        if path.name not in ("__init__.py", "__main__.py"):
            stems.setdefault(path.stem, []).append(str(path.relative_to(ROOT)))
    assert {stem: paths for stem, paths in stems.items() if len(paths) > 1} == {}


def test_the_checks_catch_an_upward_import_and_a_circle(tmp_path):
    (tmp_path / "segserve" / "bench" / "run").mkdir(parents=True)
    (tmp_path / "segserve" / "bench" / "results").mkdir(parents=True)
    (tmp_path / "handlers").mkdir()
    for package in ("segserve", "segserve/bench", "segserve/bench/run", "segserve/bench/results"):
        (tmp_path / package / "__init__.py").write_text("")
    # inside a function counts too
    (tmp_path / "segserve" / "bench" / "results" / "report.py").write_text("def f():\n    from segserve.bench.run.runner import Runner\n")
    (tmp_path / "segserve" / "bench" / "run" / "runner.py").write_text("from segserve.bench.run import session\n")
    (tmp_path / "segserve" / "bench" / "run" / "session.py").write_text("import segserve.bench.run.runner\n")
    (tmp_path / "handlers" / "base.py").write_text("import segserve.bench\n")
    imports = graph(tmp_path)
    assert upward_imports(imports) == [
        "handlers.base (handlers, layer 0) imports segserve.bench (layer 10)",
        "segserve.bench.results.report (segserve.bench.results, layer 7) imports segserve.bench.run.runner (layer 9)",
    ]
    assert circles(imports) == [["segserve.bench.run.runner", "segserve.bench.run.session"]]
