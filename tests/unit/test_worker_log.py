"""The first exception of TorchServe's worker log, with its chain, innermost first: parsed from model_log.log text
that TorchServe 0.12 wrote for two handlers of ours (one imports a helper that imports a module the environment
lacks, one raises from a raise while it answers); and a failed registration's reason, that exception first."""

import json
import zipfile
from pathlib import Path

import pytest

from segserve.errors import RuntimeFailure
from segserve.serving.http import Response
from segserve.serving.management import ManagementClient
from segserve.serving.worker_log import first_exception

LOGS = Path(__file__).with_name("worker_logs")
# registering an archive whose handler imports helper_missing_dep.py, which imports not_installed_xyz: the loader's
# fallback (ts.torch_handler.<name>) is the last exception the worker logged
LOAD_FAILED = (LOGS / "load_failed.log").read_text()
# answering b"abc": int() fails, the handler raises KeyError from it, then RuntimeError while handling that
ANSWER_FAILED = (LOGS / "answer_failed.log").read_text()


def test_a_failed_load_reports_the_missing_module_first_and_the_loaders_fallback_after_it():
    assert first_exception(LOAD_FAILED) == (
        "ModuleNotFoundError: No module named 'not_installed_xyz' ← helper_missing_dep.py:1 ← loadfail_handler.py:2 "
        "← ts/model_loader.py:153 ← ModuleNotFoundError: No module named 'ts.torch_handler.loadfail_handler' "
        "← ts/model_loader.py:159 ← ts/model_service_worker.py:133"
    )


def test_a_failed_answer_reports_the_first_exception_then_each_link_of_its_chain():
    assert first_exception(ANSWER_FAILED) == (
        "ValueError: invalid literal for int() with base 10: b'abc' ← answerfail_handler.py:3 ← KeyError: 'not a number' "
        "← answerfail_handler.py:5 ← answerfail_handler.py:11 ← answerfail_handler.py:11 ← RuntimeError: handler gave up "
        "← answerfail_handler.py:13 ← ts/service.py:135"
    )


def test_the_first_traceback_wins_and_another_workers_lines_between_its_lines_are_not_mixed_in():
    other = ANSWER_FAILED.replace("W-45901-answerfail_1", "W-45902-other_1").replace("handler gave up", "other gave up")
    mine, theirs = ANSWER_FAILED.splitlines(), other.splitlines()
    interleaved = "\n".join(line for pair in zip(mine, theirs, strict=True) for line in pair)
    assert first_exception(interleaved) == first_exception(ANSWER_FAILED)
    # a later traceback of the same worker is not part of the first one's chain
    assert first_exception(ANSWER_FAILED + LOAD_FAILED.replace("W-45900-loadfail_1", "W-45901-answerfail_1")) == first_exception(
        ANSWER_FAILED
    )


def test_a_message_over_several_lines_keeps_its_first_line_and_its_chain():
    lines = ANSWER_FAILED.splitlines()
    at = next(i for i, line in enumerate(lines) if line.endswith("KeyError: 'not a number'"))
    lines.insert(at + 1, lines[at].replace("KeyError: 'not a number'", "  and a second line of the message"))
    assert first_exception("\n".join(lines)) == first_exception(ANSWER_FAILED)


def test_a_log_without_a_traceback_has_no_exception():
    quiet = "\n".join(line for line in ANSWER_FAILED.splitlines() if "Traceback" not in line and "  File" not in line)
    assert first_exception(LOAD_FAILED.splitlines()[0]) is None and first_exception("") is None
    assert first_exception(quiet) is None


class Client(ManagementClient):
    """A management client whose server answered a registration with TorchServe's 500 (no server runs)."""

    def __init__(self, run_dir: Path, model_store: Path | None = None):
        self.run_dir, self.model_store, self.venv = run_dir, model_store, None
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)

    def log_tail(self, lines: int = 40) -> str:
        return "(the server's log tail)"


FAILED_TO_START = Response(500, {}, b'{"code": 500, "message": "Failed to start workers for model loadfail version: 1"}')


def test_a_failed_registration_puts_the_workers_first_exception_first(tmp_path):
    client = Client(tmp_path)
    log = tmp_path / "logs" / "model_log.log"
    log.write_text(ANSWER_FAILED)  # before the call: not this registration's
    since = client.model_log_size()
    with log.open("a") as more:
        more.write(LOAD_FAILED)
    with pytest.raises(RuntimeFailure) as raised:
        client._expect_ok(FAILED_TO_START, "registering loadfail.mar as loadfail", since, "loadfail.mar")
    first = str(raised.value).splitlines()[0]
    assert raised.value.cause == first_exception(LOAD_FAILED) and first.startswith(raised.value.cause + "; registering loadfail.mar")
    assert first.endswith("failed: HTTP 500: Failed to start workers for model loadfail version: 1"), first


def test_a_failed_registration_of_an_archive_in_the_store_imports_its_handler_for_the_cause(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    manifest = {"runtime": "python", "model": {"modelName": "m", "handler": "h.py", "modelVersion": "1"}}
    with zipfile.ZipFile(store / "m.mar", "w") as zipped:
        zipped.writestr("MAR-INF/MANIFEST.json", json.dumps(manifest))
        zipped.writestr("h.py", "import not_a_module_xyz\n")
    client = Client(tmp_path / "run", store)
    (tmp_path / "run" / "logs" / "model_log.log").write_text(LOAD_FAILED)  # what the log says comes second
    with pytest.raises(RuntimeFailure) as raised:
        client._expect_ok(FAILED_TO_START, "registering m.mar as m", 0, "m.mar")
    assert str(raised.value).startswith("ModuleNotFoundError: No module named 'not_a_module_xyz' ← h.py:1; registering m.mar as m failed")
    # a server that installs each archive's requirements first (install_py_dep_per_model): its log, not a fresh import
    (tmp_path / "run" / "config.properties").write_text("install_py_dep_per_model=true\n")
    with pytest.raises(RuntimeFailure) as raised:
        client._expect_ok(FAILED_TO_START, "registering m.mar as m", 0, "m.mar")
    assert raised.value.cause == first_exception(LOAD_FAILED) and raised.value.import_failures == []
