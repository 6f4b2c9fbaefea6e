"""The smoke tier (issue #52): every command that README.md, docs/*.md and the Makefile name — the Makefile's .PHONY
targets, the CLI's commands and actions, the `python -m segserve.…` modules and benchmarks/ scripts — is run once by
`make test` in a short form that checks its outcome (the test SMOKE names), is a prerequisite of `make test`, or says
why it cannot run here. smoke_problems() (run by the doc check, and by tests/unit/test_docs.py) fails on a command
without an entry, so a documented command cannot be left without a run: `make chaos` was broken for a week while
`make test` stayed green.
"""

import argparse
import ast
import re
from pathlib import Path

from segserve import ROOT

SHELL_BLOCK = re.compile(r"```(?:bash|sh)\n(.*?)```", re.S)  # the doc check's own blocks: checked there

# The smoke tier: every command the docs and the Makefile name → how `make test` runs it once (how, detail):
#   test          the named tests run it in a short form that checks its outcome (in make test: none marked long,
#                 peers or gpu); the detail says what each checks
#   prerequisite  `make test` runs it before its tests (a prerequisite of `test` in the Makefile: checked)
#   part          `make test` runs what it runs
#   cannot        not in make test, and why (the tests it names, if any, cover parts of it)
SMOKE_TESTS = "tests/system/test_smoke.py::"
BENCH_RUN = "tests/system/test_bench_run.py::test_every_output_file_is_written"
DOC_CHECK = "tests/system/test_docs.py::test_every_documented_command_is_run_or_named_with_its_test"
GPU_BUNDLE = "tests/system/test_gpu_bundle.py::test_the_bundle_is_under_its_limit_and_its_dry_run_runs_every_step"
SERVE_CLI = "tests/integration/test_cli.py::test_serve_predict_and_stop_from_the_command_line"
CHAOS = f"{SMOKE_TESTS}test_make_chaos_meets_its_goal_on_a_short_load"
MIX = f"{SMOKE_TESTS}test_make_mix_answers_every_small_and_large_request"
FUZZ = f"{SMOKE_TESTS}test_make_fuzz_for_a_few_seconds_finds_nothing"
PEERS = f"{SMOKE_TESTS}test_make_peers_measures_one_point_of_one_peer"
GPU_CHECK = f"{SMOKE_TESTS}test_make_gpu_check_on_the_cpu_skips_every_gpu_test_with_its_reason_and_the_check_refuses"
SCALE_PROFILE = f"{SMOKE_TESTS}test_segserve_scale_and_profile_on_a_served_pipeline"


def measurement(where: str) -> tuple[str, str]:
    return "cannot", f"a measurement (docs/{where}) with servers of its own: its numbers need its full length, not a check"


SMOKE: dict[str, tuple[str, str]] = {
    "make setup": ("prerequisite", "its .venv/.installed is built before make test's tests (test → lint → setup-dev)"),
    "make setup-dev": ("prerequisite", "test → lint → setup-dev"),
    "make setup-ray": ("prerequisite", "test → lint → setup-dev → setup-ray (Ray Serve for tests/unit/test_ray_engine.py)"),
    "make lint": ("prerequisite", "ruff check and ruff format --check"),
    "make setup-checkov": ("prerequisite", "checkov in .venv/checkov for tests/unit/test_manifest_checkov.py, which fails without it"),
    "make setup-postgres": ("prerequisite", "where PostgreSQL cannot be installed, its tests skip and say why"),
    "make setup-pushgateway": ("prerequisite", "where the Pushgateway cannot be installed, its tests skip and say why"),
    "make test": ("prerequisite", "make test itself (.ci/run)"),
    "make test-unit": ("part", "tests/unit/ without the long tests: make test's unit tier"),
    "make setup-ipex": (
        "cannot",
        "installs torch 2.8.0 and intel-extension-for-pytorch into .venv-ipex (a second torch: minutes, ~1 GB); without it, "
        "tests/system/test_optimize.py::test_segserve_optimize_refuses_a_missing_ipex_venv_or_a_bad_out_in_one_line_before_measuring",
    ),
    "make setup-numactl": ("cannot", "installs Debian's numactl with apt (root and a registry) where it is missing"),
    "make setup-hey": ("cannot", "installs Debian's hey with apt (root and a registry) where it is missing"),
    "make build": ("test", f"{DOC_CHECK}: serving.md's walkthrough runs it as its recipe (segserve build)"),
    "make run": (
        "test",
        f"{DOC_CHECK}: README's walkthrough (serve, predict samples/*.jpg, serve --stop) and a dry run of "
        "benchmarks/quick.yaml; as written (default ports, ~4 min) by make doc-check",
    ),
    "make bench": (
        "test",
        f"{BENCH_RUN}: a 2-point suite on a real TorchServe, every output file; grid.yaml (20–35 min) is dry-run by the doc check",
    ),
    "make test-long": (
        "cannot",
        "the tests marked long, outside make test by design (minutes each); their short forms run in it: "
        "tests/system/test_optimize.py::test_segserve_optimize_prints_a_table_with_accuracy_to_four_decimals, "
        "tests/integration/test_training.py::test_training_is_deterministic_and_reports_held_out_iou",
    ),
    "make docs": (
        "test",
        "tests/unit/test_docs.py::test_generated_reference_pages_and_the_schema_are_up_to_date: what it writes, rendered and compared",
    ),
    "make doc-check": (
        "test",
        f"{DOC_CHECK}: the same check without `make run`; "
        "tests/unit/test_docs.py::test_the_doc_check_lists_every_command_and_the_smoke_tier: its --list",
    ),
    "make fuzz": (
        "test",
        f"{FUZZ}: 4 s of its command as written (--save-crashes into a copy of the corpus), every target driven, no finding",
    ),
    "make chaos": (
        "test",
        f"{CHAOS}: the workflow alone, light load, its goal (workers and frontend killed and back, hostile input refused)",
    ),
    "make mix": ("test", f"{MIX}: the fused pipeline, 2 s alone and 2 s beside 25-megapixel JPEGs, every request answered 200"),
    "make gpu-check": ("test", f"{GPU_CHECK}: its pytest selection and the check's one-line refusal without CUDA"),
    "make gpu-bundle": ("test", f"{GPU_BUNDLE}: the bundle built, under its size limit, its dry run through every step"),
    "make clean": ("test", f"{SMOKE_TESTS}test_make_clean_removes_its_three_folders_and_nothing_else: in a scratch folder"),
    "make setup-peers": (
        "test",
        f"{PEERS}: the litserve peer's venv (.peers/litserve, its pattern rule); ray and triton's are not installed here",
    ),
    "make test-peers": (
        "cannot",
        "tests/peers/ needs the three peers' venvs (ray[serve] and nvidia-pytriton with its Triton server: large installs) "
        f"and ~2 minutes; one peer app started, measured and stopped: {PEERS}",
    ),
    "make peers": ("test", f"{PEERS}: benchmarks/peers.yaml cut to the litserve peer's first point, measured briefly, no failed request"),
    "segserve train": (
        "test",
        f"{SMOKE_TESTS}test_segserve_train_help_lists_its_options: its --help; "
        "training itself, tiny: tests/integration/test_training.py::test_training_is_deterministic_and_reports_held_out_iou",
    ),
    "segserve build": ("test", "tests/system/test_catalog.py::test_a_new_dag_is_yaml_only_and_is_built_served_predicted_and_benchmarked"),
    "segserve serve": ("test", SERVE_CLI),
    "segserve predict": ("test", SERVE_CLI),
    "segserve token": ("test", "tests/integration/test_cli.py::test_token_prints_the_generated_key"),
    "segserve scale": ("test", f"{SCALE_PROFILE}: 1 → 2 → 1 workers"),
    "segserve optimize": ("test", "tests/system/test_optimize.py::test_segserve_optimize_prints_a_table_with_accuracy_to_four_decimals"),
    "segserve fuse": (
        "test",
        "tests/system/test_fuse.py::test_segserves_own_workflow_fused_answers_the_workflows_jpegs_and_its_suite_plans",
    ),
    "segserve audit": ("test", "tests/unit/test_audit.py::test_the_documented_outputs_are_what_the_command_prints: three files"),
    "segserve profile": ("test", f"{SCALE_PROFILE}: a flame graph and a trace of the worker"),
    "segserve autoscale": (
        "test",
        "tests/integration/test_autoscale_foreign.py::test_autoscale_on_a_war_logs_what_torchserve_saw_of_each_node",
    ),
    "segserve pin": (
        "test",
        "tests/integration/test_cli.py::test_serve_autoscale_logs_decisions_pin_show_lists_them_and_stop_ends_it (--show), "
        "tests/unit/test_pinning_rule.py::test_pin_plan_from_writes_a_plan_the_loader_accepts (--plan-from)",
    ),
    "segserve bench": ("test", BENCH_RUN),
    "segserve bench compare": ("test", "tests/system/test_bench_run.py::test_resume_skips_finished_points_and_compare_finds_no_regression"),
    "segserve bench ab": ("test", "tests/system/test_ab.py::test_ab_measures_both_versions_in_turn_and_leaves_no_worktree"),
    "segserve bench replay": ("test", "tests/unit/test_replay.py::test_replay_scores_every_strategy_against_the_grids_best"),
    "segserve bench collect": (
        "test",
        "tests/system/test_study_postgres.py::test_two_bench_processes_share_one_study_and_collect_writes_it (where PostgreSQL "
        "installs), tests/unit/test_study.py::test_collect_writes_one_result_folder_from_the_study",
    ),
    "segserve bench schema": ("test", "tests/unit/test_docs.py::test_bench_schema_prints_the_committed_schema"),
    "segserve export": (
        "test",
        "tests/integration/test_export.py::test_s3_gets_the_whole_folder_once_and_a_rerun_finishes_an_interrupted_upload",
    ),
    "segserve results query": (
        "test",
        "tests/unit/test_query.py::test_rows_of_every_run_filtered_and_sorted_with_their_suite_and_timestamp",
    ),
    "python -m segserve.cli": ("test", "tests/unit/test_docs.py::test_bench_schema_prints_the_committed_schema"),
    "python -m segserve.qa.chaos": ("test", CHAOS),
    "python -m segserve.qa.mix": ("test", MIX),
    "python -m segserve.qa.fuzz": ("test", FUZZ),
    "python -m segserve.gpu.check": ("test", GPU_CHECK),
    "python -m segserve.gpu.bundle": ("test", GPU_BUNDLE),
    "python -m segserve.gpu.ceilings": ("test", f"{GPU_BUNDLE}: its ceilings step, on the CPU"),
    "python -m segserve.docs.reference": ("test", "tests/unit/test_docs.py::test_generated_reference_pages_and_the_schema_are_up_to_date"),
    "python -m segserve.docs.doccheck": ("test", DOC_CHECK),
    "python -m segserve.model.bare": ("test", f"{BENCH_RUN}: the bare forward beside every seg point"),
    "benchmarks/foreign/build.py": (
        "test",
        "tests/system/test_foreign_archives.py::test_the_seed_style_archives_build_and_their_suites_plan_from_their_folder",
    ),
    "benchmarks/foreign/build_builtin_vision.py": (
        "cannot",
        "about 10 s to build, and its archives' check serves them on TorchServe and Ray: the long tier's "
        "tests/system/test_ray_same_bytes.py::test_torchserves_built_in_object_detector_gets_torchserves_answers",
    ),
    "benchmarks/foreign/build_image_segmenter.py": (
        "test",
        "tests/system/test_image_segmenter.py::test_the_image_segmenter_archive_names_torchserves_handler_brings_no_code_and_its_suite_plans",
    ),
    "benchmarks/foreign/build_vision_join.py": (
        "test",
        "tests/system/test_vision_join.py::test_the_vision_join_builds_on_torchserves_image_classifier_fuses_and_its_suite_plans",
    ),
    "benchmarks/peers/litserve_app.py": ("test", PEERS),
    "benchmarks/peers/triton_app.py": ("cannot", "needs .peers/triton (nvidia-pytriton and its Triton server); make test-peers runs it"),
    "benchmarks/stock_server.py": measurement("measurements.md: the stock TorchServe baseline on fixed ports"),
}
OUTSIDE_MAKE_TEST = {"long", "peers", "gpu"}  # marks make test deselects (long, peers) or skips without CUDA (gpu)
SCRIPT = re.compile(r"\b(benchmarks/[\w/]+\.py)\b")
MODULE = re.compile(r"python3? -m (segserve(?:\.\w+)+)")
INLINE_CODE = re.compile(r"`([^`\n]+)`")
INLINE_MAKE = re.compile(r"(?:^|&&|;|\|\|)\s*make ([a-z][\w.-]*)")


def makefile_rules(root: Path = ROOT) -> tuple[list[str], dict[str, tuple[list[str], bool]]]:
    """The Makefile's .PHONY targets, and each rule's target → (prerequisites with $(VAR)s expanded, has a recipe)."""
    text = (root / "Makefile").read_text().replace("\\\n", " ")
    variables = dict(re.findall(r"^([A-Z_]+)\s*[:?]?=\s*(.*)$", text, re.M))

    def expand(word: str) -> str:
        return re.sub(r"\$\(([A-Z_]+)\)", lambda m: expand(variables.get(m.group(1), m.group(0))), word)

    rules: dict[str, tuple[list[str], bool]] = {}
    lines = text.splitlines()
    for number, line in enumerate(lines):
        if (m := re.match(r"^([^\s#=:][^=:]*):(?![:=])(.*)$", line)) and not line.startswith(".PHONY"):
            recipe = number + 1 < len(lines) and lines[number + 1].startswith("\t")
            for target in expand(m.group(1)).split():
                rules[target] = (expand(m.group(2)).split(), recipe)
    phony = re.search(r"^\.PHONY:(.*)$", text, re.M)
    return (phony.group(1).split() if phony else []), rules


def before_tests(rules: dict[str, tuple[list[str], bool]], target: str = "test") -> set[str]:
    """`target` and everything make builds for it first."""
    seen, todo = set(), [target]
    while todo:
        if (name := todo.pop()) not in seen:
            seen.add(name)
            todo += rules.get(name, ([], False))[0]
    return seen


def cli_commands() -> list[str]:
    """`segserve COMMAND` and `segserve COMMAND ACTION` for every command and action the CLI's parser has."""
    from segserve.cli import parser

    def subcommands(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        return next((dict(a.choices) for a in p._actions if isinstance(a, argparse._SubParsersAction)), {})

    found = []
    for name, command in subcommands(parser()).items():
        found += [f"segserve {name}" + ("" if action == "run" else f" {action}") for action in subcommands(command)] or [f"segserve {name}"]
    return found


def documented_commands(root: Path = ROOT) -> list[str]:
    """Every command the smoke tier must cover: the Makefile's .PHONY targets, the CLI's commands, and the
    `python -m segserve.…` modules and benchmarks/ scripts that README.md, docs/*.md or the Makefile name."""
    texts = [path.read_text() for path in [root / "README.md", *sorted((root / "docs").glob("*.md")), root / "Makefile"]]
    modules = sorted({m for text in texts for m in MODULE.findall(text)})
    scripts = sorted({s for text in texts for s in SCRIPT.findall(text) if "__main__" in _read(root / s)})
    return [f"make {t}" for t in makefile_rules(root)[0]] + cli_commands() + [f"python -m {m}" for m in modules] + scripts


def _read(path: Path) -> str:
    return path.read_text() if path.is_file() else ""


def marks_of(path: Path, function: str) -> set[str]:
    """The pytest marks a test function carries: its decorators' and its module's pytestmark (not a parameter's)."""
    tree = ast.parse(path.read_text())

    def mark(node) -> str | None:
        node = node.func if isinstance(node, ast.Call) else node
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "mark":
            return node.attr
        return None

    marks = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            marks |= {mark(n) for n in (node.value.elts if isinstance(node.value, ast.List | ast.Tuple) else [node.value])}
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == function:
            marks |= {mark(d) for d in node.decorator_list}
    return marks - {None}


def smoke_problems(root: Path = ROOT) -> list[str]:
    """A documented command without a smoke run, a stale entry, a smoke test outside make test, a `make X` the
    Makefile lacks, a prerequisite that is not one."""
    documented = documented_commands(root)
    phony, rules = makefile_rules(root)
    problems = [
        f"`{c}` has no smoke run: add it to SMOKE in segserve/docs/smoke.py (its test, or why it cannot run here)"
        for c in documented
        if c not in SMOKE
    ]
    problems += [
        f"SMOKE in segserve/docs/smoke.py lists `{c}`, which nothing names any more: remove it" for c in SMOKE if c not in documented
    ]
    for command, (how, detail) in SMOKE.items():
        named = re.findall(r"(tests/\S+\.py)::(\w+)", detail)
        if how == "test" and not named:
            problems.append(f"SMOKE: `{command}` names no test")
        for path, function in named if how == "test" else []:
            if (root / path).is_file() and (outside := marks_of(root / path, function) & OUTSIDE_MAKE_TEST):
                problems.append(f"SMOKE: `{command}`: {path}::{function} is marked {', '.join(sorted(outside))}: not run by make test")
        target = command.removeprefix("make ")
        if (
            how == "prerequisite"
            and target not in before_tests(rules)
            and not (not rules.get(target, ([], True))[1] and set(rules[target][0]) <= before_tests(rules))
        ):
            problems.append(f"SMOKE: `{command}` is no prerequisite of `make test` in the Makefile")
    for path in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        spans = INLINE_CODE.findall(SHELL_BLOCK.sub("", path.read_text()))
        for target in sorted({t for span in spans for t in INLINE_MAKE.findall(span)} - set(phony)):
            problems.append(f"{path.relative_to(root)}: `make {target}`: the Makefile has no such .PHONY target")
    return problems
