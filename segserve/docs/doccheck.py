"""The doc check: every command in a shell block of README.md and docs/*.md is either run here or named with
the test that runs it, so no documented command is left broken or untested.

    python -m segserve.docs.doccheck            # (in make test) the cheap ones: classify all, dry-run every suite,
                                           # and run the serving walkthroughs against a real TorchServe
    python -m segserve.docs.doccheck --list     # every command and how it is checked, then the smoke tier

How a command is checked, first matching rule wins (RULES below):
  walkthrough  the whole block is run as written, on free ports: `serve` gets --port-base and a run folder of
               its own, the other segserve commands the same run folder, URLs the port; blocks that start
               the server with the same command run as one script on one server (the block that builds first)
  dry-run      `segserve bench SUITE …` runs as `segserve bench SUITE --dry-run` (the suite parses, plans and
               validates; a long benchmark itself is not run in make test)
  run          run as written (fast, no server)
  test         a test runs it (the test must exist: its file and function are checked)
  ci           what CI runs (`make test`), or a long target outside make test (named with the test of its code)
  full         run as written by `--full` only (`make doc-check`): `make run`, on the default ports
  smoke        a make target: checked as SMOKE below says

The smoke tier (SMOKE): every command the docs and the Makefile name — each .PHONY target of the Makefile, each
`segserve` command and action (from the CLI's parser), each `python -m segserve.…` module and each script of
benchmarks/ that README.md, docs/*.md or the Makefile mention — is run once in `make test` in a short form that
checks its outcome (named tests, none marked long, peers or gpu), is run by `make test` itself (a prerequisite),
or says why it cannot run here. A command without an entry, an entry for a command nothing names any more, a
named test that is missing or outside `make test`, and a `make X` in the docs that the Makefile lacks all fail.
"""

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from segserve import ROOT
from segserve.docs.smoke import SMOKE, documented_commands, smoke_problems
from segserve.serving.ts_config import free_port_base

BLOCK = re.compile(r"```(?:bash|sh)\n(.*?)```", re.S)
SEGSERVE = ".venv/bin/segserve"


@dataclass(frozen=True)
class Command:
    file: str
    block: int  # index of the shell block in its file
    text: str  # as a user copies it (continuation lines joined, comment dropped)


def commands(root: Path = ROOT) -> list[Command]:
    found = []
    for path in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for index, match in enumerate(BLOCK.finditer(path.read_text())):
            for line in match.group(1).replace("\\\n", " ").splitlines():
                text = re.sub(r"\s+#\s.*$", "", line).strip()
                if text and not text.startswith("#"):
                    found.append(Command(str(path.relative_to(root)), index, re.sub(r"\s+", " ", text)))
    return found


# (pattern, how, detail): the first pattern that matches a command (re.search) says how it is checked
RULES: list[tuple[str, str, str]] = [
    (r"^make run$", "full", "run by `make doc-check` (python -m segserve.docs.doccheck --full), not in make test (~4 min, default ports)"),
    (r"^make build$", "walkthrough", "run as its recipe, segserve build"),
    (r"^make [\w-]+$", "smoke", ""),  # every other target: as SMOKE says
    (
        r"^(PYTHON=\S+ )?gpu_bundle/run\.sh --dry-run$",
        "test",
        "tests/system/test_gpu_bundle.py::test_the_bundle_is_under_its_limit_and_its_dry_run_runs_every_step",
    ),
    (r"^gpu_bundle/run\.sh$", "ci", "needs CUDA (a lent device); its dry run: tests/system/test_gpu_bundle.py"),
    (r"^wait$", "run", "the shell's"),
    (r"segserve bench schema", "run", ""),
    (
        r"segserve bench \S+ --rounds",
        "test",
        "tests/system/test_bench_run.py::test_a_grid_measured_in_rounds_alternates_its_points_and_keeps_the_median_of_each",
    ),
    (
        r"build_vision_join\.py|segserve fuse vision_join\.war|benchmarks/foreign/vision_join\.yaml",
        "test",
        "tests/system/test_vision_join.py::test_the_vision_join_builds_on_torchserves_image_classifier_fuses_and_its_suite_plans",
    ),
    (
        r"benchmarks/foreign/build\.py|segserve bench <repo>/benchmarks/foreign/",
        "test",
        "tests/system/test_foreign_archives.py::test_the_seed_style_archives_build_and_their_suites_plan_from_their_folder",
    ),
    (
        r"segserve fuse model_store/seg_jpeg\.war|segserve bench benchmarks/fuse_vs_handmade\.yaml",
        "test",
        "tests/system/test_fuse.py::test_segserves_own_workflow_fused_answers_the_workflows_jpegs_and_its_suite_plans",
    ),
    (r"segserve bench (benchmarks/\S+\.yaml)", "dry-run", ""),
    (r"^aws s3 cp ", "test", "tests/unit/test_manifests.py::test_the_inference_service_round_trips_through_kserves_models"),
    (
        r"^kubectl apply -f \S+/best/k8s\.yaml",
        "test",
        "tests/unit/test_manifests.py::test_k8s_manifests_round_trip_through_the_kubernetes_api_models",
    ),
    (
        r"^kubectl apply -f \S+/best/kserve\.yaml",
        "test",
        "tests/unit/test_manifests.py::test_the_inference_service_round_trips_through_kserves_models",
    ),
    (
        r"^kubectl apply -f \S+/best/rayservice\.yaml",
        "test",
        "tests/unit/test_rayservice.py::test_the_rayservice_passes_kuberays_crd_and_a_broken_one_is_refused_naming_the_field",
    ),
    (
        r"^python3 -c 'import json, secrets; |^kubectl create secret generic \S+-(inference-key|ray-token) ",
        "test",
        "tests/unit/test_rayservice.py::test_the_documented_secrets_are_a_key_file_the_replicas_read_and_the_token_kuberay_reads",
    ),
    (
        r"^kubectl exec deploy/\S+ -c torchserve -- python3 -c ",
        "test",
        "tests/unit/test_manifest_access.py::test_the_documented_command_prints_the_inference_key_and_nothing_else",
    ),
    (
        r"^segserve build --upload s3://",
        "test",
        "tests/integration/test_archive_store.py::test_upload_and_fetch_send_and_download_only_what_changed",
    ),
    (
        r"segserve bench SUITE\.yaml --resume",
        "test",
        "tests/system/test_bench_run.py::test_resume_skips_finished_points_and_compare_finds_no_regression",
    ),
    (
        r"segserve bench SUITE\.yaml --storage",
        "test",
        "tests/system/test_study_postgres.py::test_two_bench_processes_share_one_study_and_collect_writes_it",
    ),
    (
        r"segserve bench compare",
        "test",
        "tests/system/test_bench_run.py::test_resume_skips_finished_points_and_compare_finds_no_regression",
    ),
    (r"segserve bench ab", "test", "tests/system/test_ab.py::test_ab_measures_both_versions_in_turn_and_leaves_no_worktree"),
    (r"segserve bench replay", "test", "tests/unit/test_replay.py::test_replay_scores_every_strategy_against_the_grids_best"),
    (
        r"segserve bench collect",
        "test",
        "tests/system/test_study_postgres.py::test_two_bench_processes_share_one_study_and_collect_writes_it",
    ),
    (
        r"segserve results query .*--pipelines",
        "test",
        "tests/unit/test_query.py::test_pipelines_rows_are_filtered_and_sorted_like_points",
    ),
    (
        r"segserve results query",
        "test",
        "tests/unit/test_query.py::test_rows_of_every_run_filtered_and_sorted_with_their_suite_and_timestamp",
    ),
    (
        r"segserve export .*s3://",
        "test",
        "tests/integration/test_export.py::test_s3_gets_the_whole_folder_once_and_a_rerun_finishes_an_interrupted_upload",
    ),
    (r"segserve export .*cloudwatch://", "test", "tests/integration/test_export.py::test_cloudwatch_gets_every_point_and_node_metric"),
    (
        r"segserve optimize",
        "test",
        "tests/system/test_optimize.py::test_segserve_optimize_measures_each_variant_against_eager_and_writes_the_best_valid_archive",
    ),
    (
        r"segserve profile",
        "test",
        "tests/integration/test_profile.py::test_profile_samples_every_worker_of_a_workflow_and_traces_each_node",
    ),
    (
        r"segserve autoscale --war",
        "test",
        "tests/integration/test_autoscale_foreign.py::test_autoscale_on_a_war_logs_what_torchserve_saw_of_each_node",
    ),
    (
        r"segserve serve --targets seg_jpeg --autoscale",
        "test",
        "tests/integration/test_cli.py::test_serve_autoscale_logs_decisions_pin_show_lists_them_and_stop_ends_it",
    ),
    (
        r"segserve serve --targets seg_jpeg_fused --autoscale",
        "test",
        "tests/integration/test_cli.py::test_serve_autoscale_logs_decisions_pin_show_lists_them_and_stop_ends_it",
    ),
    (r"segserve serve --core-plan", "test", "tests/integration/test_pinning.py::test_every_process_runs_on_the_cores_of_the_plan"),
    (
        r"segserve pin --show",
        "test",
        "tests/integration/test_cli.py::test_serve_autoscale_logs_decisions_pin_show_lists_them_and_stop_ends_it",
    ),
    (r"segserve pin --plan-from", "test", "tests/unit/test_pinning_rule.py::test_pin_plan_from_writes_a_plan_the_loader_accepts"),
    (r"segserve fuse", "test", "tests/system/test_fuse.py::test_a_fused_chain_answers_the_workflows_bytes"),
    (
        r"segserve audit .*--management",
        "test",
        "tests/unit/test_audit.py::test_the_live_check_reads_the_servers_version_models_and_tokenless_answer",
    ),
    (r"segserve audit", "test", "tests/unit/test_audit.py::test_the_documented_outputs_are_what_the_command_prints"),
    (r"segserve scale", "test", "tests/integration/test_pinning.py::test_scaling_a_node_up_and_down_keeps_slots_disjoint_and_frees_them"),
    (r"segserve build --weights", "test", "tests/integration/test_archives.py::test_each_mar_runs_with_only_the_archive_on_the_path"),
    (r"segserve build$", "walkthrough", ""),
    (r"segserve (serve|token|predict)|^TOKEN=|^curl ", "walkthrough", ""),
]


def rule_for(command: Command) -> tuple[str, str]:
    for pattern, how, detail in RULES:
        if re.search(pattern, command.text):
            if how == "smoke":
                return SMOKE.get(command.text, ("none", f"no entry in SMOKE in segserve/docs/smoke.py ({command.file})"))
            return how, detail
    return "none", f"no rule: add one to RULES in segserve/docs/doccheck.py ({command.file})"


def missing_tests(root: Path = ROOT) -> list[str]:
    """Tests named by a rule or a SMOKE entry that do not exist (a renamed test must not leave a command unchecked)."""
    missing = []
    for how, detail in [(how, detail) for _, how, detail in RULES] + list(SMOKE.values()):
        for named in re.findall(r"tests/\S+\.py::\w+", detail) if how in ("test", "ci", "cannot") else []:
            path, function = named.split("::")
            if not (root / path).is_file() or f"def {function}(" not in (root / path).read_text():
                missing.append(named)
    return missing


def walkthrough_script(lines: list[str], run_dir: Path, port_base: int) -> str:
    """A shell block made runnable here: the same commands, on this run folder and these ports."""
    out = ["set -euo pipefail"]
    if not any("segserve build" in line or line == "make build" for line in lines):
        out.append(f"{SEGSERVE} build >/dev/null  # what make run did before this block")
    for line in lines:
        line = f"{SEGSERVE} build" if line == "make build" else line  # its recipe (make would also run setup)
        line = line.replace("127.0.0.1:8080", f"127.0.0.1:{port_base}")
        line = re.sub(r"(segserve serve)(?![\w-])(?! --stop)", rf"\1 --port-base {port_base}", line)
        line = re.sub(r"(segserve (?:serve|token|predict|scale|pin))(?![\w-])", rf"\1 --run-dir {run_dir}", line)
        out.append(line)
    return "\n".join(out) + "\n"


def _starts_server(line: str) -> bool:
    return re.search(r"segserve serve(?![\w-])(?! --stop)", line) is not None


def on_one_server(blocks: dict[tuple[str, int], list[str]]) -> list[list[tuple[str, int]]]:
    """The serving walkthroughs grouped by the command that starts their server: blocks that start it the same
    way run as one script on one TorchServe (each start costs tens of seconds and every default worker)."""
    groups: dict[str, list[tuple[str, int]]] = {}
    for where, lines in blocks.items():
        groups.setdefault(next(line for line in lines if _starts_server(line)), []).append(where)

    def builds_first(where: tuple[str, int]) -> bool:  # a block that builds the archives goes before the server starts
        return not any("segserve build" in line or line == "make build" for line in blocks[where])

    return [sorted(group, key=builds_first) for group in groups.values()]


def one_script(blocks: list[list[str]]) -> list[str]:
    """Blocks that start the same server, in order, as one: every command of each, but a start where the server
    runs already (the same command as the first block's) and a stop before the last block's."""
    out: list[str] = []
    for number, lines in enumerate(blocks, 1):
        for line in lines:
            if (_starts_server(line) and any(map(_starts_server, out))) or ("serve --stop" in line and number < len(blocks)):
                continue
            out.append(line)
    return out


def run_walkthrough(command_block: list[str], log) -> str | None:
    """Run a walkthrough block; None when it passed, else what failed. A server it leaves is stopped."""
    with tempfile.TemporaryDirectory(prefix="doccheck-") as scratch:
        run_dir, port_base = Path(scratch) / "run", free_port_base()
        script = walkthrough_script(command_block, run_dir, port_base)
        started = time.monotonic()
        try:
            done = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600)
        finally:  # stop what it started, also when a step failed before its own `serve --stop`
            subprocess.run([SEGSERVE, "serve", "--stop", "--run-dir", str(run_dir)], cwd=ROOT, capture_output=True, timeout=120)
        log(f"  ran in {time.monotonic() - started:.0f}s")
        if done.returncode != 0:
            return f"exit {done.returncode}: {(done.stderr.strip().splitlines() or ['no output'])[-1]}"
    return None


def in_process(args: list[str]) -> tuple[int, str, str]:
    """`segserve ARGS` through the CLI's own main in this process, from the checkout: (exit code, stdout, stderr).
    The documented dry runs share one interpreter (each used to start its own and import torch again, ~5 s apiece)."""
    import contextlib
    import io
    import signal

    from segserve.cli import main

    out, err = io.StringIO(), io.StringIO()
    handler = signal.getsignal(signal.SIGTERM)  # main sets its own
    try:
        with contextlib.chdir(ROOT), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(args)
    finally:
        signal.signal(signal.SIGTERM, handler)
    return code, out.getvalue(), err.getvalue()


def check(run_servers: bool = True, full: bool = False, log=print) -> list[str]:
    found = commands()
    problems = [f"{c.file}: `{c.text}`: {detail}" for c in found for how, detail in [rule_for(c)] if how == "none"]
    problems += [f"segserve/docs/doccheck.py names a test that does not exist: {name}" for name in missing_tests()]
    problems += smoke_problems()
    # the suites a rule sends to the dry run (one needing files a test makes first is named with that test instead)
    dry = [c for c in found if rule_for(c)[0] == "dry-run"]
    suites = sorted({m.group(1) for c in dry if (m := re.search(r"segserve bench (benchmarks/\S+\.yaml)", c.text))})
    for suite in suites:
        log(f"$ segserve bench {suite} --dry-run")
        code, _, err = in_process(["bench", suite, "--dry-run"])
        if code != 0:
            problems.append(f"segserve bench {suite} --dry-run: {err.strip()[-300:]}")
    log("$ segserve bench schema")
    code, out, _ = in_process(["bench", "schema"])
    if code != 0 or '"title": "segserve benchmark suite"' not in out:
        problems.append(f"segserve bench schema: exit {code}")
    if run_servers:
        blocks: dict[tuple[str, int], list[str]] = {}
        for c in found:
            if rule_for(c)[0] == "walkthrough" and c.text != "make run":
                blocks.setdefault((c.file, c.block), []).append(c.text)
        serving = {where: lines for where, lines in blocks.items() if any(_starts_server(line) for line in lines)}
        for group in on_one_server(serving):  # blocks without a server: their commands run in a block with one
            names = " and ".join(f"{file} block {index + 1}" for file, index in group)
            lines = one_script([serving[where] for where in group])
            log(f"walkthrough {names}:")
            for line in lines:
                log(f"  $ {line}")
            failure = run_walkthrough(lines, log)
            if failure:
                problems.append(f"{names}: {failure}")
    for command in sorted({c.text for c in found if rule_for(c)[0] == "full"} if full else []):
        log(f"$ {command}")
        done = subprocess.run(shlex.split(command), cwd=ROOT, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            problems.append(f"{command}: exit {done.returncode}: {(done.stderr.strip().splitlines() or ['no output'])[-1]}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print every documented command and how it is checked, then the smoke tier")
    parser.add_argument("--no-servers", action="store_true", help="skip the walkthroughs (no TorchServe)")
    parser.add_argument("--full", action="store_true", help="also run `make run` as written (make doc-check)")
    args = parser.parse_args(argv)
    if args.list:
        for command in commands():
            how, detail = rule_for(command)
            print(f"{command.file}: {command.text}\n    {how}{': ' + detail if detail else ''}")
        print("\nsmoke tier: every command the docs and the Makefile name, and how make test runs it")
        for command in documented_commands():
            how, detail = SMOKE.get(command, ("none", "no entry in SMOKE"))
            print(f"{command}\n    {how}: {detail}")
        return 0
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    problems = check(run_servers=not args.no_servers, full=args.full)
    for problem in problems:
        print(f"doc check: {problem}", file=sys.stderr)
    print(f"doc check: {len(commands())} documented commands, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
