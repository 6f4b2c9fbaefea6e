"""The first exception of TorchServe's worker log, with its chain, innermost first: parsed from model_log.log text
that TorchServe 0.12 wrote for two handlers of ours (one imports a helper that imports a module the environment
lacks, one raises from a raise while it answers)."""

from pathlib import Path

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
