"""docs/architecture.md names every folder of the code and of the tests, and no folder that is gone."""

import re

from tests.conftest import ROOT
from tests.unit.test_layers import FOLDERS

PAGE = ROOT / "docs" / "architecture.md"


def code_folders() -> set[str]:
    packages = {p.parent for p in (ROOT / "segserve").rglob("__init__.py")}
    return {f"{p.relative_to(ROOT)}/" for p in packages} | {"handlers/", "tests/unit/", "tests/integration/", "tests/system/"}


def named_folders(text: str) -> set[str]:
    """The folders in the first column of the page's folder table."""
    return set(re.findall(r"^\| `([\w/]+/)` \|", text, flags=re.M))


def test_the_architecture_page_names_every_folder_and_only_those():
    named = named_folders(PAGE.read_text())
    assert sorted(code_folders() - named) == []  # a folder added without a line on the page
    assert sorted(named - code_folders()) == []  # a line for a folder that is gone


def test_every_folder_on_the_page_has_its_layer():
    layered = {"handlers/" if f == "handlers" else f.replace(".", "/") + "/" for f in FOLDERS}
    assert sorted(f for f in named_folders(PAGE.read_text()) if not f.startswith("tests/") and f not in layered) == []


def test_the_check_sees_a_missing_and_a_stale_folder():
    text = PAGE.read_text().replace("| `segserve/qa/` |", "| `segserve/quality/` |")
    named = named_folders(text)
    assert "segserve/qa/" in code_folders() - named and named - code_folders() == {"segserve/quality/"}
