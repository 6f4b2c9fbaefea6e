"""make test's two xdist processes: the files that use the session server are one unit of work, so one process
starts that TorchServe; every other file is a unit of its own (tests/conftest.py)."""

from tests.conftest import ROOT, SESSION_SERVER_FILES, SESSION_SERVER_UNIT, pytest_xdist_make_scheduler


class Options:
    """What xdist's scheduler reads of pytest's config for `-n 2 --dist <dist>`."""

    def __init__(self, dist: str):
        self.values = {"dist": dist, "tx": ["popen"] * 2, "numprocesses": 2}

    def getvalue(self, name):
        return self.values.get(name)

    getoption = getvalue


def test_the_session_server_files_are_one_unit_and_every_other_file_its_own():
    scheduler = pytest_xdist_make_scheduler(Options("loadfile"), None)
    units = {scheduler._split_scope(f"{file}::test_x") for file in SESSION_SERVER_FILES}
    assert units == {SESSION_SERVER_UNIT}
    assert scheduler._split_scope("tests/system/test_fuse.py::test_x") == "tests/system/test_fuse.py"
    assert scheduler._split_scope("tests/unit/test_cli.py::test_x") == "tests/unit/test_cli.py"  # a namesake elsewhere


def test_the_listed_files_exist_and_other_dist_modes_keep_xdists_scheduler():
    assert all((ROOT / file).is_file() for file in SESSION_SERVER_FILES)
    assert pytest_xdist_make_scheduler(Options("load"), None) is None
