"""handler_import_failure: an archive's handler imported as TorchServe 0.12's worker imports it, in a separate
process, and the real error reported innermost first. The handlers are written here, as an archive's files."""

import importlib
import json
import os
import sys
import zipfile
from pathlib import Path

import pytest

from segserve.archives.handler_check import archive_import_failures, handler_import_failure

# an archive file named captum.py that fails stands in for an environment without captum (it comes first on sys.path)
MISSING_CAPTUM = "raise ModuleNotFoundError(\"No module named 'captum'\", name='captum')\n"


def archive(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def test_a_handler_that_imports_a_missing_module_reports_that_module_first_then_the_files_outward(tmp_path):
    # TorchServe's loader would log only "No module named 'ts.torch_handler.my_handler'" for this archive
    folder = archive(tmp_path, {"my_handler.py": "import helper\n", "helper.py": "\n\nimport not_a_module_xyz\n"})
    assert handler_import_failure(folder, "my_handler.py") == (
        "ModuleNotFoundError: No module named 'not_a_module_xyz' ← helper.py:3 ← my_handler.py:1"
    )


def test_a_raise_from_keeps_the_cause_first_and_the_wrapping_error_after_it(tmp_path):
    wrapped = 'try:\n    import not_a_module_xyz\nexcept ImportError as e:\n    raise RuntimeError("needs\\n xyz") from e\n'
    folder = archive(tmp_path, {"wrapped.py": wrapped})
    assert handler_import_failure(folder, "wrapped.py:handle") == (
        "ModuleNotFoundError: No module named 'not_a_module_xyz' ← wrapped.py:2 ← RuntimeError: needs xyz ← wrapped.py:4"
    )


def test_a_syntax_error_names_the_file_and_line(tmp_path):
    folder = archive(tmp_path, {"handler.py": "def handle(data, context):\n    return [\n"})
    failure = handler_import_failure(folder, "handler.py")
    assert failure.startswith("SyntaxError: ") and "(handler.py, line 2)" in failure, failure


def test_a_good_handler_imports_with_the_archive_folder_as_the_working_directory(tmp_path):
    # the worker's cwd is the extracted archive: a handler may read its own files at import
    reads_cwd = "from pathlib import Path\nLABELS = Path('labels.txt').read_text()\ndef handle(data, context):\n    return data\n"
    folder = archive(tmp_path, {"good.py": reads_cwd, "labels.txt": "a\n"})
    assert handler_import_failure(folder, "good.py:handle") is None
    assert handler_import_failure(folder, "good") is None  # TorchServe strips ".py" and any folder: both forms work


def test_what_the_handler_prints_while_it_imports_does_not_hide_the_answer(tmp_path):
    folder = archive(tmp_path, {"loud.py": 'print(\'{"failure": "fake"}\')\nimport not_a_module_xyz\n'})
    assert handler_import_failure(folder, "loud.py") == "ModuleNotFoundError: No module named 'not_a_module_xyz' ← loud.py:2"


def test_a_name_that_is_neither_a_file_nor_a_torchserve_handler_says_both(tmp_path):
    failure = handler_import_failure(tmp_path, "image_clasifier")
    assert (
        failure
        == "ModuleNotFoundError: no handler image_clasifier: neither image_clasifier.py in the archive nor ts.torch_handler.image_clasifier"
    )


def test_a_handler_that_hangs_at_import_is_reported_after_the_timeout(tmp_path):
    folder = archive(tmp_path, {"slow.py": "import time\ntime.sleep(30)\n"})
    assert handler_import_failure(folder, "slow.py", timeout_s=0.5) == "importing handler slow.py did not finish in 0.5 s"


def test_a_handler_that_kills_its_process_is_reported_with_the_exit_code(tmp_path):
    folder = archive(tmp_path, {"dies.py": "import os, sys\nsys.stderr.write('bye\\n')\nos._exit(3)\n"})
    assert handler_import_failure(folder, "dies.py", python=sys.executable) == "importing handler dies.py ended with exit code 3: bye"


def test_a_torchserve_module_the_handler_imports_is_named_from_ts_and_the_missing_module_first(tmp_path):
    # cheap: ts/utils/util.py imports yaml first thing; an archive file named yaml.py that fails stands in for an
    # environment without it
    missing = "raise ModuleNotFoundError(\"No module named 'yaml'\", name='yaml')\n"
    folder = archive(tmp_path, {"yaml.py": missing, "h.py": "from ts.utils.util import list_classes_from_module\n"})
    failure = handler_import_failure(folder, "h.py")
    assert failure == "ModuleNotFoundError: No module named 'yaml' ← yaml.py:1 ← ts/utils/util.py:14 ← h.py:1"


@pytest.mark.long  # torch, torchvision and TorchServe's vision handlers imported in a child process: seconds, more when busy
def test_torchserves_own_handler_failing_under_an_archive_file_reports_the_module_it_lacks(tmp_path):
    # the dog-breed example's shape: the archive's handler subclasses a TorchServe vision handler, whose
    # module imports captum
    subclass = "from ts.torch_handler.image_classifier import ImageClassifier\nclass Breed(ImageClassifier):\n    pass\n"
    folder = archive(tmp_path, {"captum.py": MISSING_CAPTUM, "breed_handler.py": subclass})
    failure = handler_import_failure(folder, "breed_handler.py")
    assert failure.startswith("ModuleNotFoundError: No module named 'captum' ← captum.py:1 ← ts/torch_handler/vision_handler.py:"), failure
    assert " ← ts/torch_handler/image_classifier.py:" in failure and failure.endswith(" ← breed_handler.py:1"), failure


@pytest.mark.long  # a second torch import in a child process: seconds on a busy 2-core machine
def test_torchserves_own_handler_named_as_the_handler_reports_its_fallback_import_whole(tmp_path):
    # a built-in handler name: TorchServe's fallback import is the one that fails, and it is reported whole
    folder = archive(tmp_path, {"captum.py": MISSING_CAPTUM})
    failure = handler_import_failure(folder, "image_segmenter")
    assert failure.startswith("ModuleNotFoundError: No module named 'captum' ← captum.py:1 ← ts/torch_handler/vision_handler.py:"), failure
    assert failure.split(" ← ")[-1].startswith("ts/torch_handler/image_segmenter.py:"), failure


def mar(path: Path, handler: str, files: dict[str, str], requirements: str | None = None) -> Path:
    """A .mar as torch-model-archiver writes one: its files at the top, MAR-INF/MANIFEST.json naming the handler."""
    model = {
        "modelName": path.stem,
        "handler": handler,
        "modelVersion": "1",
        **({"requirementsFile": "requirements.txt"} if requirements else {}),
    }
    with zipfile.ZipFile(path, "w") as zipped:
        zipped.writestr("MAR-INF/MANIFEST.json", json.dumps({"runtime": "python", "model": model}))
        for name, text in {**files, **({"requirements.txt": requirements} if requirements else {})}.items():
            zipped.writestr(name, text)
    return path


def test_a_mar_whose_requirements_file_lists_the_missing_module_says_so(tmp_path):
    archive = mar(tmp_path / "m.mar", "h.py", {"h.py": "import not_a_module_xyz\n"}, "# pinned\nNot-A-Module-Xyz==1.0\n")
    (failure,) = archive_import_failures(archive, tmp_path)
    assert failure.line() == (
        "ModuleNotFoundError: No module named 'not_a_module_xyz' ← h.py:1; "
        "the archive lists it in its requirements.txt (Not-A-Module-Xyz==1.0)"
    )
    other = mar(tmp_path / "o.mar", "h.py", {"h.py": "import not_a_module_xyz\n"}, "something_else\n")
    assert archive_import_failures(other, tmp_path)[0].line().endswith("← h.py:1; the archive brings a requirements.txt")
    assert archive_import_failures(mar(tmp_path / "ok.mar", "h.py", {"h.py": "X = 1\n"}), tmp_path) == []


def test_a_war_names_each_node_whose_mar_fails_and_its_function_file(tmp_path):
    mar(tmp_path / "good.mar", "g.py", {"g.py": "X = 1\n"})
    mar(tmp_path / "bad.mar", "b.py:handle", {"b.py": "import not_a_module_xyz\n"})
    spec = "models:\n  min-workers: 1\n  first: {url: good.mar}\n  second: {url: bad.mar}\ndag:\n  pre: [first]\n  first: [second]\n"
    manifest = {"workflow": {"workflowName": "w", "specFile": "w.yaml", "handler": "w_functions.py"}}
    with zipfile.ZipFile(tmp_path / "w.war", "w") as zipped:
        zipped.writestr("WAR-INF/MANIFEST.json", json.dumps(manifest))
        zipped.writestr("w.yaml", spec)
        zipped.writestr("w_functions.py", "def pre(data, context):\n    return [\n")
    lines = [failure.line() for failure in archive_import_failures(tmp_path / "w.war", tmp_path)]
    assert lines == [
        "node second: ModuleNotFoundError: No module named 'not_a_module_xyz' ← b.py:1",
        "function file w_functions.py: SyntaxError: '[' was never closed (w_functions.py, line 2)",
    ]


@pytest.mark.parametrize("url", ["../outside.mar", "OUTSIDE"])
def test_a_war_node_url_that_leaves_the_model_store_is_said_and_its_mar_never_imported(tmp_path, url):
    # the suite's reader refuses such a url (foreign.py); the check after a failed registration must not import it either
    store, marker = tmp_path / "store", tmp_path / "imported"
    store.mkdir()
    outside = mar(tmp_path / "outside.mar", "h.py", {"h.py": f"open({str(marker)!r}, 'w').close()\n"})
    url = str(outside) if url == "OUTSIDE" else url  # absolute, or climbing out with '..'
    manifest = {"workflow": {"workflowName": "w", "specFile": "w.yaml", "handler": "w_functions.py"}}
    with zipfile.ZipFile(store / "w.war", "w") as zipped:
        zipped.writestr("WAR-INF/MANIFEST.json", json.dumps(manifest))
        zipped.writestr("w.yaml", json.dumps({"models": {"n": {"url": url}}, "dag": {"n": []}}))
    (failure,) = archive_import_failures(store / "w.war", store)
    assert failure.line() == f"w.war: models.n.url: {url!r} is not a relative name inside its folder (no absolute path, no '..')"
    assert not marker.exists()


def test_what_is_not_an_archive_is_left_for_torchserve_to_name(tmp_path):
    (tmp_path / "junk.mar").write_bytes(b"not a zip")
    assert archive_import_failures(tmp_path / "junk.mar", tmp_path) == []
    assert archive_import_failures(tmp_path / "absent.war", tmp_path) == []


def test_torchserves_built_in_vision_handlers_import_in_segserves_environment():
    # they import captum and packaging at module level, which torchserve does not depend on: setup.cfg installs them
    # as TorchServe's docker images do (requirements/common.txt)
    for name in ("image_classifier", "image_segmenter", "object_detector"):
        assert importlib.import_module(f"ts.torch_handler.{name}").__name__ == f"ts.torch_handler.{name}"


def test_the_handler_is_imported_in_the_environment_it_is_given_not_segserves(tmp_path, monkeypatch):
    # a user's archive's workers get a minimal environment (server.py archive_environment): so does its import here
    monkeypatch.setenv("SEGSERVE_TEST_SECRET", "s3cr3t")
    folder = archive(tmp_path, {"nosy.py": "import os\nif 'SEGSERVE_TEST_SECRET' in os.environ:\n    raise RuntimeError('saw it')\n"})
    assert handler_import_failure(folder, "nosy.py") == "RuntimeError: saw it ← nosy.py:3"
    assert handler_import_failure(folder, "nosy.py", env={"PATH": os.environ["PATH"]}) is None
