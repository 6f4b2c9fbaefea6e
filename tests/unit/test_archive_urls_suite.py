"""An archive target's download keys (issue 58): plain http beyond loopback refused when the suite is read, the pins
and the size cap carried to the download (a .war's members' too), worker_env checked as names."""

import hashlib

import pytest

from segserve.archives.archive_urls import cache_folder
from segserve.archives.catalog import Catalog
from segserve.bench.suite.spec import load_suite
from segserve.errors import UsageError
from tests.conftest import ROOT
from tests.unit.test_archive_urls_downloads import ARCHIVE, origin  # noqa: F401 (the fixture)
from tests.unit.test_foreign import write_war


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
        # a validator's own message quotes the URL, and YAML's quotes the line (cut short): masked too (issue 64)
        ("{name: x, archive: 'https://u:p@h/x.zip'}", "archive: 'https://***@h/x.zip': give a .mar or .war file"),
        ("{name: x, archive: 'https://u:p,ss@h/x.mar', members: true}", "members: only a .war has members (got 'https://***@h/x.mar')"),
        ("{name: x, archive: https://u:p,ss@h/x.mar, oops", "not valid YAML"),
        ("{name: x, archive: 'https://u:p[ss@h/x.mar'}", "https://***@h/x.mar: its host or port does not read as one"),
    ],
)
def test_bad_download_keys_are_refused_when_the_suite_is_read(tmp_path, monkeypatch, target, says):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as refused:
        load(tmp_path, target)
    assert says in str(refused.value), str(refused.value)
    assert "u:p@" not in str(refused.value) and "p,ss" not in str(refused.value)  # masked in "(got …)" and the message
    assert "p[ss" not in str(refused.value)


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


def test_a_wars_members_keep_its_download_keys_and_worker_env(tmp_path, monkeypatch):
    """Members of a .war whose node archives are at a plain-http URL beyond loopback (plain_http: true): read as
    targets with the .war's plain_http, pins, size cap and worker_env (issue 64: refused by pydantic, with a
    traceback that printed the URL and its password). The node archives are in the cache already: nothing is fetched."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SEGSERVE_CACHE", str(tmp_path / "cache"))
    store = "http://u:p,ss@example.com/store/"
    (folder := cache_folder(store)).mkdir(parents=True, exist_ok=True)
    for name in ("pre.mar", "post.mar"):
        (folder / name).write_bytes(b"a node's archive")
    write_war(tmp_path / "flow.war", {"models": {"pre": {"url": "pre.mar"}, "post": {"url": "post.mar"}}, "dag": {"pre": ["post"]}})
    keys = f"plain_http: true, max_download_mb: 3, worker_env: [AWS_PROFILE], sha256: {{pre.mar: {'ab' * 32}}}"
    suite, catalog = load(tmp_path, f"{{name: flow, archive: flow.war, model_store: '{store}', members: true, {keys}}}")
    for member in ("flow-pre", "flow-post"):
        target = suite.archive_targets[member]
        assert target.archive == f"{store}{member.removeprefix('flow-')}.mar"
        assert (target.plain_http, target.max_download_mb, target.worker_env) == (True, 3, ["AWS_PROFILE"])
        assert target.download_rules() == catalog.foreign["flow"].rules == catalog.foreign[member].rules
    assert suite.archive_targets["flow-pre"].sha256 == {"pre.mar": "ab" * 32}


def test_a_member_that_is_no_valid_target_is_refused_in_one_line_without_the_url(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SEGSERVE_CACHE", str(tmp_path / "cache"))
    store = "https://u:s3cret@example.com/store/"
    (folder := cache_folder(store)).mkdir(parents=True, exist_ok=True)
    (folder / "pre.mar").write_bytes(b"a node's archive")
    write_war(tmp_path / "flow.war", {"models": {"pre.v2": {"url": "pre.mar"}}, "dag": {"pre.v2": []}})  # '.': no target name
    with pytest.raises(UsageError) as refused:
        load(tmp_path, f"{{name: flow, archive: flow.war, model_store: '{store}', members: true}}")
    assert str(refused.value).startswith("targets.flow.members: flow-pre.v2: name: String should match pattern"), refused.value
    assert len(str(refused.value).splitlines()) == 1 and "s3cret" not in str(refused.value)
