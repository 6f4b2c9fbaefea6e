"""A user's archive is code (issue 58): the server it runs in starts with a minimal environment, so that segserve's
credentials never reach its workers unless the suite names them; `segserve bench` says so first. (That a worker of a
real TorchServe sees exactly this: tests/system/test_foreign_archives.py, whose handler reports its environment.)"""

import ast
import os
import stat
from pathlib import Path

import pytest

from segserve.bench.run.targets import torchserve_targets
from segserve.cli import main
from segserve.serving import processes
from segserve.serving.server import SERVER_ENV, TorchServe
from tests.conftest import ROOT
from tests.unit.test_fuse import mar, war

SECRETS = {"AWS_SECRET_ACCESS_KEY": "s3cr3t", "AWS_ACCESS_KEY_ID": "AKIA", "GITHUB_TOKEN": "ghp_x", "HF_TOKEN": "hf_x"}


def environment(tmp_path, monkeypatch, **fields) -> dict[str, str]:
    for name, value in {**SECRETS, "PATH": "/usr/bin", "HOME": "/home/u", "MALLOC_ARENA_MAX": "2", "MY_SETTING": "1"}.items():
        monkeypatch.setenv(name, value)
    server = TorchServe(tmp_path, tmp_path, ROOT / "config.properties", env={"OMP_NUM_THREADS": "2"}, **fields)
    return server._environment(tmp_path / "logs")


def test_a_users_archives_server_gets_what_torchserve_needs_and_what_the_suite_names_only(tmp_path, monkeypatch):
    env = environment(tmp_path, monkeypatch, worker_env=("MY_SETTING",))
    assert not set(SECRETS) & set(env), sorted(env)
    assert "MALLOC_ARENA_MAX" not in env  # not named: not passed on
    assert env["PATH"] == "/usr/bin" and env["MY_SETTING"] == "1"
    assert env["OMP_NUM_THREADS"] == "2" and env["TMPDIR"] == str(tmp_path / "tmp")  # segserve's own settings stay
    assert {name: env[name] for name in SERVER_ENV} == SERVER_ENV and env[processes.MARKER] == str(tmp_path.resolve())
    named = environment(tmp_path, monkeypatch, worker_env=("AWS_SECRET_ACCESS_KEY",))
    assert named["AWS_SECRET_ACCESS_KEY"] == "s3cr3t" and "AWS_ACCESS_KEY_ID" not in named  # the suite said so


def test_segserves_own_archives_keep_the_whole_environment(tmp_path, monkeypatch):
    env = environment(tmp_path, monkeypatch)
    assert set(SECRETS) <= set(env) and env["MALLOC_ARENA_MAX"] == "2"


def test_a_users_archives_server_gets_a_scratch_home_of_mode_0700_for_its_caches_removed_at_stop(tmp_path, monkeypatch):
    """HOME is where boto3 and the like find the user's credentials (~/.aws/credentials): not passed on. The server's
    processes, and the import check of a handler that did not load on it, get a home of their own."""
    env = environment(tmp_path, monkeypatch, worker_env=())
    home = Path(env["HOME"])
    assert home != Path("/home/u") and home.parent == tmp_path, home  # in the server's run folder, not the user's
    found = os.lstat(home)
    assert stat.S_ISDIR(found.st_mode) and stat.S_IMODE(found.st_mode) == 0o700 and list(home.iterdir()) == []
    caches = ("XDG_CACHE_HOME", "TORCH_HOME", "MPLCONFIGDIR", "PIP_CACHE_DIR")  # torch hub, matplotlib, pip's installs
    assert all(Path(env[name]).is_relative_to(home) for name in caches), {name: env[name] for name in caches}
    server = TorchServe(tmp_path, tmp_path, ROOT / "config.properties", worker_env=())
    assert server.code_environment()["HOME"] == str(home)
    (home / ".cache" / "torch").mkdir(parents=True)
    (home / ".cache" / "torch" / "weights.pt").write_bytes(b"kept by a handler")
    server.stop(timeout_s=1)
    assert not home.exists()
    assert environment(tmp_path, monkeypatch, worker_env=("HOME",))["HOME"] == "/home/u"  # the suite named it


def test_segserve_fuse_imports_the_handlers_with_the_archive_environment_and_the_names_given(tmp_path, monkeypatch, capsys):
    """`segserve fuse` (and so `segserve bench`, for a .war's best point) imports a user's handlers: with what their
    workers would get, the names of --worker-env, a scratch HOME; never segserve's credentials."""
    for name, value in {**SECRETS, "MY_SETTING": "1", "HOME": str(tmp_path / "user")}.items():
        monkeypatch.setenv(name, value)
    seen = "import os\nraise RuntimeError(repr({n: os.environ.get(n) for n in sorted(os.environ) if n in NAMES}))\n"
    mar(tmp_path, "a", seen.replace("NAMES", repr({*SECRETS, "MY_SETTING", "HOME"})))  # refused: before the archiver
    path = war(tmp_path, "models:\n  a: {url: a.mar}\ndag:\n  a: []\n")
    assert main(["fuse", str(path), "--model-store", str(tmp_path), "--worker-env", "MY_SETTING"]) == 2
    err = capsys.readouterr().err
    found = ast.literal_eval(err[err.index("RuntimeError: ") + len("RuntimeError: ") : err.index("}") + 1])
    assert set(found) == {"HOME", "MY_SETTING"} and found["MY_SETTING"] == "1", found  # no secret
    assert Path(found["HOME"]) != tmp_path / "user" and not Path(found["HOME"]).exists()  # a scratch one, gone after
    with pytest.raises(SystemExit, match="2"):  # argparse's refusal
        main(["fuse", str(path), "--model-store", str(tmp_path), "--worker-env", "NOT A NAME"])
    assert "'NOT A NAME': an environment variable's name" in capsys.readouterr().err


def test_the_bench_starts_a_users_archive_on_a_server_with_the_suites_worker_env(tmp_path, monkeypatch, capsys):
    """The first line says that an archive is code; its points' server gets worker_env, a catalog target's none."""
    started = []

    class Recorded:
        def __init__(self, run_dir, *args, **fields):
            self.run_dir = run_dir
            started.append(fields.get("worker_env"))

        def start(self, **_):
            pass

        def stop(self):
            pass

    monkeypatch.setattr(torchserve_targets, "TorchServe", Recorded)
    (tmp_path / "mine.mar").write_bytes(b"not opened by segserve")
    (tmp_path / "blob.bin").write_bytes(b"\x00")
    suite = tmp_path / "mine.yaml"
    archive, inputs = tmp_path / "mine.mar", tmp_path / "blob.bin"
    suite.write_text(f"targets: [seg, {{name: mine, archive: {archive}, worker_env: [AWS_PROFILE]}}]\ninputs: [{{files: [{inputs}]}}]\n")
    assert main(["bench", str(suite), "--dry-run"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("note: an archive runs its own Python with the server's rights (mine): bench only archives you trust")
    from segserve.archives.catalog import Catalog
    from segserve.bench.suite.plan import Point
    from segserve.bench.suite.spec import load_suite

    catalog = Catalog(ROOT)
    targets = torchserve_targets.TorchServeTargets(load_suite(suite, catalog), catalog, tmp_path / "w.pt", {"restarts": 0})
    try:
        for name in ("mine", "seg", "seg", "mine"):
            targets.ensure_server(Point(name, (), (), (), ()))
    finally:
        targets.close()
    assert started == [("AWS_PROFILE",), None, ("AWS_PROFILE",)]  # a change of environment is a restart
