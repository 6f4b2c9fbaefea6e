"""The docs cannot drift (#18): generated pages match the code, every suite names its JSON Schema and an editor's
validator flags a typo with it, and every documented command is run here or by a named test."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from segserve.docs import doccheck
from segserve.docs import reference as docs
from segserve.docs import smoke as smoke_module
from tests.conftest import ROOT


def schema_validator() -> str:
    """check-jsonschema (an editor's validator; setup-dev installs it) beside the tests' Python, in the project's venv
    or on PATH."""
    for folder in (str(Path(sys.executable).parent), str(ROOT / ".venv" / "bin"), None):
        if found := shutil.which("check-jsonschema", path=folder):
            return found
    raise AssertionError("check-jsonschema is not installed: run `make setup-dev`")


def test_generated_reference_pages_and_the_schema_are_up_to_date():
    assert docs.out_of_date() == [], "run `make docs`"


def test_the_cli_reference_names_every_command_and_the_suite_reference_every_phase_key():
    cli, suite = docs.cli_reference(), docs.suite_reference()
    for command in ("train", "build", "serve", "predict", "bench", "optimize", "profile", "autoscale", "export", "results"):
        assert f"## segserve {command}\n" in cli
    for key in ("load.phases[].duration_s", "grid.runtime.autoscale", "autoscaler.min_interval_s", "inputs[].synthetic.height"):
        assert f"| `{key}` |" in suite, key
    assert "| `load.warmup_s` | number (≥ 0) | `2.0` | seconds |" in suite


def test_every_suite_starts_with_the_schema_comment_and_validates_against_the_schema():
    validator = schema_validator()
    suites = sorted((ROOT / "benchmarks").glob("*.yaml")) + sorted((ROOT / "benchmarks" / "foreign").glob("*.yaml"))
    assert len(suites) > 20
    for suite in suites:
        schema = os.path.relpath(ROOT / docs.SCHEMA_FILE, suite.parent)  # the comment's path is the file's own
        assert suite.read_text().splitlines()[0] == docs.SCHEMA_COMMENT.replace("suite.schema.json", schema), suite
        assert isinstance(yaml.safe_load(suite.read_text()), dict)
    done = subprocess.run([validator, "--schemafile", str(ROOT / docs.SCHEMA_FILE), *map(str, suites)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_typo_in_a_suite_is_flagged_by_a_json_schema_validator(tmp_path):
    validator = schema_validator()
    typo = tmp_path / "typo.yaml"
    typo.write_text('targets: [seg_jpeg]\ninputs:\n  - images: ["samples/*.jpg"]\ngrid:\n  archive: {batch_sise: [8]}\n')
    done = subprocess.run([validator, "--schemafile", str(ROOT / docs.SCHEMA_FILE), str(typo)], capture_output=True, text=True)
    assert done.returncode == 1 and "'batch_sise' was unexpected" in done.stdout, done.stdout


def test_bench_schema_prints_the_committed_schema():
    done = subprocess.run([sys.executable, "-m", "segserve.cli", "bench", "schema"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == (ROOT / docs.SCHEMA_FILE).read_text()


def test_a_command_without_a_rule_and_a_rule_naming_a_missing_test_are_found(tmp_path, monkeypatch):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("```bash\n.venv/bin/segserve frobnicate --now   # new\nmake test\n```\n")
    found = doccheck.commands(tmp_path)
    assert [c.text for c in found] == [".venv/bin/segserve frobnicate --now", "make test"]
    assert doccheck.rule_for(found[0])[0] == "none" and doccheck.rule_for(found[1])[0] == "prerequisite"  # SMOKE's entry
    monkeypatch.setattr(doccheck, "RULES", [("x", "test", "tests/test_docs.py::test_that_does_not_exist")])
    assert doccheck.missing_tests() == ["tests/test_docs.py::test_that_does_not_exist"]


def test_a_walkthrough_runs_on_its_own_ports_and_run_folder(tmp_path):
    script = doccheck.walkthrough_script(
        [
            ".venv/bin/segserve serve",
            "TOKEN=$(.venv/bin/segserve token)",
            "curl http://127.0.0.1:8080/ping",
            ".venv/bin/segserve serve --stop",
        ],
        tmp_path,
        18500,
    )
    assert f"TOKEN=$(.venv/bin/segserve token --run-dir {tmp_path})" in script
    assert f".venv/bin/segserve serve --run-dir {tmp_path} --port-base 18500\n" in script
    assert "curl http://127.0.0.1:18500/ping" in script and f"serve --run-dir {tmp_path} --stop\n" in script


def test_a_documented_suite_whose_dry_run_fails_is_reported_with_its_error(monkeypatch):
    broken = doccheck.Command("docs/x.md", 0, ".venv/bin/segserve bench benchmarks/missing.yaml")
    monkeypatch.setattr(doccheck, "commands", lambda root=ROOT: [broken])
    problems = doccheck.check(run_servers=False, log=lambda _: None)
    assert len(problems) == 1 and problems[0].startswith("segserve bench benchmarks/missing.yaml --dry-run: error: ")


def test_walkthroughs_that_start_the_same_server_run_as_one_script_on_one_server():
    readme = ["segserve serve", "TOKEN=$(segserve token)", "segserve predict a.jpg --target fused", "segserve serve --stop"]
    serving = ["make build", "segserve serve", "segserve predict a.jpg", "segserve serve --stop"]
    other = ["segserve serve --targets seg", "segserve scale seg --workers 2", "segserve serve --stop"]
    blocks = {("README.md", 1): readme, ("docs/serving.md", 0): serving, ("docs/x.md", 3): other}
    groups = doccheck.on_one_server(blocks)
    # the block that builds goes first; a server started another way is a group of its own
    assert groups == [[("docs/serving.md", 0), ("README.md", 1)], [("docs/x.md", 3)]]
    script = doccheck.one_script([blocks[where] for where in groups[0]])
    assert script == [
        "make build", "segserve serve", "segserve predict a.jpg",
        "TOKEN=$(segserve token)", "segserve predict a.jpg --target fused", "segserve serve --stop",
    ]  # fmt: skip
    assert doccheck.one_script([other]) == other


def test_every_documented_command_and_make_target_has_a_smoke_run():
    """#52: `make chaos` was dead while make test was green. Every .PHONY target, `segserve` command and action,
    and documented module and script is run by a test in make test, is a prerequisite of it, or says why not."""
    documented = smoke_module.documented_commands()
    for command in ("make chaos", "make mix", "make fuzz", "make clean", "make setup-dev", "segserve train", "segserve results query"):
        assert command in documented, command
    assert smoke_module.smoke_problems() == []
    assert doccheck.missing_tests() == []


def test_a_command_without_a_smoke_run_a_stale_entry_and_a_smoke_test_outside_make_test_are_found(tmp_path, monkeypatch):
    (tmp_path / "docs").mkdir()
    (tmp_path / "Makefile").write_text(
        ".PHONY: test lint newtarget long\nSTAMP := .venv/.installed\ntest: $(STAMP)\n\tpytest\nlint:\n\truff check .\n"
        "newtarget:\n\ttrue\nlong:\n\tpytest -m long\n$(STAMP):\n\ttouch $@\n"
    )
    (tmp_path / "README.md").write_text("Run `python -m segserve.qa.newtool` or `make missing`, then make them all.\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("import pytest\n\n\n@pytest.mark.long\ndef test_long():\n    pass\n")
    monkeypatch.setattr(smoke_module, "cli_commands", lambda: ["segserve frob"])
    smoke = {
        "make test": ("prerequisite", ""),
        "make lint": ("prerequisite", ""),  # not one of test's
        "make long": ("test", "tests/test_x.py::test_long"),  # marked long: make test does not run it
        "make stale": ("cannot", "nothing names it"),
    }
    monkeypatch.setattr(smoke_module, "SMOKE", smoke)
    assert smoke_module.documented_commands(tmp_path) == [
        "make test", "make lint", "make newtarget", "make long", "segserve frob", "python -m segserve.qa.newtool",
    ]  # fmt: skip
    no_run = ": add it to SMOKE in segserve/docs/smoke.py (its test, or why it cannot run here)"
    assert smoke_module.smoke_problems(tmp_path) == [
        f"`make newtarget` has no smoke run{no_run}",
        f"`segserve frob` has no smoke run{no_run}",
        f"`python -m segserve.qa.newtool` has no smoke run{no_run}",
        "SMOKE in segserve/docs/smoke.py lists `make stale`, which nothing names any more: remove it",
        "SMOKE: `make lint` is no prerequisite of `make test` in the Makefile",
        "SMOKE: `make long`: tests/test_x.py::test_long is marked long: not run by make test",
        "README.md: `make missing`: the Makefile has no such .PHONY target",
    ]


def test_the_doc_check_lists_every_command_and_the_smoke_tier(capsys):
    assert doccheck.main(["--list"]) == 0
    out = capsys.readouterr().out
    tier = out.split("\nsmoke tier: ")[1]
    assert all(f"\n{command}\n    " in tier for command in smoke_module.documented_commands())
    assert "\n    none" not in out


def test_the_readme_is_read_in_five_minutes():
    """#59: what segserve does, the two commands, calling it, the commands and one table of headline figures — at
    most 900 words and no commit hashes (the history lives in docs/measurements.md)."""
    text = (ROOT / "README.md").read_text()
    assert len(text.split()) <= 900, f"README.md has {len(text.split())} words: move history to docs/measurements.md"
    hashes = re.findall(r"`[0-9a-f]{7,40}`", text)
    assert not hashes, f"README.md names commits {hashes}: keep them in docs/measurements.md"
