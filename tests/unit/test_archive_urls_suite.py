"""An archive target's download keys (issue 58): plain http beyond loopback refused when the suite is read, the pins
and the size cap carried to the download, worker_env checked as names."""

import hashlib

import pytest

from segserve.archives.catalog import Catalog
from segserve.bench.suite.spec import load_suite
from segserve.errors import UsageError
from tests.conftest import ROOT
from tests.unit.test_archive_urls_downloads import ARCHIVE, origin  # noqa: F401 (the fixture)


def load(tmp_path, target: str):
    (tmp_path / "blob.bin").write_bytes(b"\x00")
    (tmp_path / "mine.mar").write_bytes(b"not opened by segserve")
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"targets: [{target}]\ninputs: [{{files: [{tmp_path / 'blob.bin'}]}}]\n")
    catalog = Catalog(ROOT)
    return load_suite(suite, catalog), catalog


@pytest.mark.parametrize(
    ("target", "says"),
    [
        ("{name: x, archive: 'http://u:p@example.com/x.mar'}", "archive: http://***@example.com/x.mar: plain http goes to loopback only"),
        ("{name: x, archive: mine.mar, model_store: 'http://example.com/store/'}", "model_store: http://example.com/store/: plain http"),
        ("{name: x, archive: mine.mar, sha256: {mine.mar: " + "ab" * 32 + "}}", "sha256: pins the archives fetched from a URL"),
        (
            "{name: x, archive: 'https://h/x.mar', sha256: {notes.txt: " + "ab" * 32 + "}}",
            "sha256: 'notes.txt': give an archive's file name",
        ),
        ("{name: x, archive: 'https://h/x.mar', sha256: {x.mar: abc}}", "String should match pattern"),
        ("{name: x, archive: 'https://h/x.mar', worker_env: ['AWS KEY']}", "String should match pattern"),
    ],
)
def test_bad_download_keys_are_refused_when_the_suite_is_read(tmp_path, monkeypatch, target, says):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as refused:
        load(tmp_path, target)
    assert says in str(refused.value), str(refused.value)
    assert "u:p@" not in str(refused.value)  # the message's "(got …)" masks a URL's credentials too


def test_the_pins_and_the_cap_of_a_target_reach_its_download(origin, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SEGSERVE_CACHE", str(tmp_path / "cache"))
    base, _ = origin()
    right = hashlib.sha256(ARCHIVE).hexdigest()
    _, catalog = load(tmp_path, f"{{name: x, archive: '{base}/x.mar', sha256: {{x.mar: {'ab' * 32}}}}}")
    assert not catalog.foreign["x"].path.exists()  # refused: its points fail with the reason
    _, catalog = load(tmp_path, f"{{name: x, archive: '{base}/x.mar', max_download_mb: 0.001}}")
    assert not catalog.foreign["x"].path.exists()
    _, catalog = load(tmp_path, f"{{name: x, archive: '{base}/x.mar', sha256: {{x.mar: {right}}}, plain_http: true}}")
    assert catalog.foreign["x"].path.read_bytes() == ARCHIVE
