"""The unit tier's promise, kept by force: no TorchServe, no trained weights, no archives, no server processes.
A unit test that asks for such a fixture fails at collection; one that starts TorchServe, an archiver or Java fails
where it tries. Such a test belongs in tests/integration/ or tests/system/."""

import subprocess

import pytest

from segserve.serving.server import TorchServe

HEAVY_FIXTURES = {"trained_weights", "model_store", "server", "postgres_url"}
HEAVY_PROGRAMS = ("torchserve", "torch-model-archiver", "torch-workflow-archiver", "java")


def heavy_fixtures(item) -> list[str]:
    """The shared heavy fixtures (tests/conftest.py's) an item asks for; a test file's own fixture of the same name
    (a loopback HTTP server called `server`) is not one."""
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    return sorted(n for n in HEAVY_FIXTURES if n in defs and defs[n][-1].func.__module__ == "tests.conftest")


def pytest_collection_modifyitems(config, items):
    for item in items:
        asked = heavy_fixtures(item)
        if asked and "/tests/unit/" in str(item.path):
            raise pytest.UsageError(f"{item.nodeid} is in tests/unit/ but asks for {asked}: move it to tests/integration/")


def _refuse(*args, **kwargs):
    raise AssertionError("a unit test started TorchServe: move it to tests/integration/")


@pytest.fixture(autouse=True)
def no_servers(monkeypatch):
    real_init = subprocess.Popen.__init__

    def checked_init(self, args, *rest, **kwargs):
        words = [args] if isinstance(args, str | bytes) else [str(a) for a in args]
        program = next(iter(words), "").split("/")[-1].split()[0] if words else ""
        if any(program == name or program.startswith(f"{name} ") for name in HEAVY_PROGRAMS):
            raise AssertionError(f"a unit test ran {program}: move it to tests/integration/")
        real_init(self, args, *rest, **kwargs)

    monkeypatch.setattr(TorchServe, "start", _refuse)
    monkeypatch.setattr(subprocess.Popen, "__init__", checked_init)
