"""Shared fixtures: a real TorchServe Context for handler tests, built archives, a live server."""

import os
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from ts.context import Context, RequestProcessor

from handlers.segnet import SegNet
from segserve.archives.build import build, ensure_weights
from segserve.model.worker_context import worker_context
from segserve.serving.served_pipeline import check_archives, register, served_targets
from segserve.serving.server import VMARGS_ENV, TorchServe

ROOT = Path(__file__).resolve().parents[1]

# Every TorchServe the tests start (here, in CLI subprocesses, in the GPU bundle's dry run) lives for a minute or so:
# its frontend with C1 only and the serial collector spends about a third less CPU over such a life (start,
# registration, load: 4.4–4.6 CPU-s instead of 6.4–7.5, docs/testing.md) than with C2's compile threads,
# which pay off only in longer runs. Users' servers keep the JVM's defaults (docs/testing.md).
TEST_VMARGS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
os.environ.setdefault(VMARGS_ENV, TEST_VMARGS)


@pytest.fixture(scope="session", autouse=True)
def empty_inductor_cache(tmp_path_factory):
    """Every compile in a test session (in-process, in workers, in CLI subprocesses) starts from an empty inductor
    cache of its own, as on a fresh CI machine: a cache left in /tmp by earlier runs skipped the C++ compiles and
    made the int8 test 62 s instead of 179 s (make test, 2026-12-03), so local timings hid CI's."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path_factory.mktemp("inductor"))


make_context = worker_context  # TorchServe's own Context, as a worker builds it


@contextmanager
def serving(instance):
    """A stdlib HTTP server of a test's, answering on its own thread until the block ends, then closed."""
    thread = threading.Thread(target=instance.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield instance
    finally:
        instance.shutdown()
        instance.server_close()
        thread.join()


def with_rows(context: Context, rows: int) -> Context:
    context.request_processor = [RequestProcessor({}) for _ in range(rows)]
    return context


def status_of(context: Context, idx: int) -> int:
    return context.get_response_status(idx)[0]


@pytest.fixture(scope="session")
def tiny_weights(tmp_path_factory) -> Path:
    """An untrained SegNet state_dict: enough for shape and protocol tests."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("weights") / "tiny.pt"
    torch.save(SegNet(2).state_dict(), path)
    return path


@pytest.fixture(scope="session")
def trained_weights() -> Path:
    """The repository's trained weights (trained on first use, ~3 minutes on 2 cores)."""
    return ensure_weights(ROOT / "weights" / "seg.pt", None)


@pytest.fixture(scope="session")
def model_store(tmp_path_factory, trained_weights) -> Path:
    store = tmp_path_factory.mktemp("model_store")
    build(ROOT, store, weights=trained_weights)
    return store


@pytest.fixture(scope="session")
def server(tmp_path_factory, model_store):
    """A real TorchServe on free loopback ports with seg, jpeg and the seg_jpeg workflow."""
    instance = TorchServe(
        run_dir=tmp_path_factory.mktemp("ts"), model_store=model_store, config_template=ROOT / "config.properties", free_ports=True
    )
    targets = served_targets(None)
    check_archives(instance, targets)
    with instance:  # stopped by process id however the session ends
        register(instance, targets)
        yield instance


TIERS = ("unit", "integration", "system")
# make test runs the tests on two processes (pytest-xdist, a file to a process): the longest files first, so that
# neither process is left with a long one at the end while the other has nothing (durations measured on 2 cores)
LONGEST_FIRST = ("test_gpu_bundle.py", "test_fuzz.py", "test_bench_run.py", "test_optimize.py", "test_study_postgres.py")
# The files whose tests send requests to the session `server` above. They go to one xdist process as one unit, so a
# make test starts that TorchServe (a frontend and ten workers, ~35 CPU-s) once, not once in each process; together
# they take ~140 s, so they are handed out right after the longest files. A file that takes `server` and is not
# listed here fails the collection (pytest_collection_modifyitems).
SESSION_SERVER_FILES = (
    "tests/integration/test_autoscale_server.py",
    "tests/integration/test_cli.py",
    "tests/integration/test_fanout.py",
    "tests/integration/test_integration.py",
    "tests/integration/test_profile.py",
)
SESSION_SERVER_UNIT = "session-server"


@pytest.hookimpl(optionalhook=True)  # where pytest-xdist is not installed (the GPU bundle's venv), no such hook
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile, with the SESSION_SERVER_FILES as one unit of work."""
    if config.getvalue("dist") != "loadfile":
        return None  # xdist's own scheduler for the other modes
    from xdist.scheduler import LoadFileScheduling

    class SessionServerScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = super()._split_scope(nodeid)
            return SESSION_SERVER_UNIT if file in SESSION_SERVER_FILES else file

    return SessionServerScheduling(config, log)


def uses_session_server(item) -> bool:
    definitions = getattr(item, "_fixtureinfo", None) and item._fixtureinfo.name2fixturedefs.get("server")
    return bool(definitions) and Path(definitions[-1].func.__code__.co_filename).resolve() == Path(__file__).resolve()


def file_of(item) -> str:
    """The test file as the scheduler names it: its path from the repository root."""
    return item.path.relative_to(ROOT).as_posix()


def tier_of(item) -> str | None:
    """The tier is the folder: `-m unit` is tests/unit/."""
    return next((t for t in TIERS if f"/tests/{t}/" in str(item.path)), None)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if tier := tier_of(item):
            item.add_marker(tier)
        if uses_session_server(item) and (file := file_of(item)) not in SESSION_SERVER_FILES:
            raise pytest.UsageError(f"{item.nodeid} uses the session server: add {file} to SESSION_SERVER_FILES in tests/conftest.py")

    def rank(item) -> int:  # the longest files, then the session server's unit, then the rest
        if item.path.name in LONGEST_FIRST:
            return LONGEST_FIRST.index(item.path.name)
        return len(LONGEST_FIRST) + (file_of(item) not in SESSION_SERVER_FILES)

    def cost(item) -> tuple:  # the system tier, then integration, then unit (short tests fill the gaps)
        return (-TIERS.index(tier_of(item) or "unit"), rank(item))

    items.sort(key=cost)  # stable: within a file, its own order
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (run `make gpu-check` on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
