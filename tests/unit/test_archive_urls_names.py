"""Names that become paths (a .war node's url, an S3 key, an archive name) stay inside their folder; URLs are shown
and kept without their credentials, whatever their password holds."""

import json

import pytest
import yaml

from segserve.archives.archive_urls import DownloadRules, is_remote, masked, masked_text, safe_relative_name, scheme_problem
from segserve.errors import UsageError


@pytest.mark.parametrize("name", ["seg.mar", "nodes/seg.mar", "a..b.mar", "./seg.mar"])
def test_a_relative_name_is_kept(name):
    assert safe_relative_name(name, "models.seg.url") == name


@pytest.mark.parametrize("name", ["../seg.mar", "nodes/../../seg.mar", "/etc/passwd", "..", ""])
def test_an_absolute_or_climbing_name_is_refused_naming_the_field(name):
    with pytest.raises(UsageError, match=r"^models\.seg\.url: .*no absolute path, no '\.\.'"):
        safe_relative_name(name, "models.seg.url")


# what a password may hold that urlsplit reads as a password all the same (and sends): issue 64
PASSWORDS = ["p,ss", "p'ss", 'p"ss', "p{s}s", "p[s]s", "p ss", "p@ss", "p:ss"]
# and what ends urlsplit's host before it (the URL is refused, but said with the password hidden)
BROKEN = ["p/ss", "p?ss", "p#ss", "123/ss"]  # the last: all digits before the /, which urlsplit reads as a port


@pytest.mark.parametrize("password", PASSWORDS + BROKEN)
def test_a_password_of_any_character_is_masked_alone_and_in_a_suites_text(password):
    url = f"https://u:{password}@h.example:8443/v1/x.mar?X-Amz-Signature=s3cr3t"
    assert masked(url) == "https://***@h.example:8443/v1/x.mar?X-Amz-Signature=***"
    for text in (
        f"targets:\n  - name: a\n    archive: {url}\n",  # block style, plain
        f"targets: [{{name: a, archive: {json.dumps(url)}}}, {{name: b, archive: s3://x/y.war}}]\n",  # flow, quoted
        f"targets: [{{name: a, archive: '{url.replace(chr(39), chr(39) * 2)}'}}]\n",  # single-quoted, '' for '
        repr({"archive": url, "model_store": "https://v:q@h2.example/s/"}),  # a validation error's (got …)
    ):
        shown = masked_text(text)
        assert password not in shown and "s3cr3t" not in shown and "q@" not in shown, shown
        # the host stays; a password that ended urlsplit's host hides all up to the line's last '@' (too much, not too little)
        assert "***@h.example:8443/v1/x.mar" in shown or (password in BROKEN and "https://***@h2.example/s/" in shown), shown


def test_masking_keeps_a_suites_yaml_as_it_was_but_the_secrets():
    text = 'targets: [{name: a, archive: "https://u:p,ss@h/x.mar"}, {name: b, archive: s3://x/y.war}]  # @ here\n'
    assert yaml.safe_load(masked_text(text)) == {
        "targets": [{"name": "a", "archive": "https://***@h/x.mar"}, {"name": "b", "archive": "s3://x/y.war"}]
    }
    assert masked_text("http://127.0.0.1:8080/predictions/seg and http://h:9/x.mar?token=t") == (
        "http://127.0.0.1:8080/predictions/seg and http://h:9/x.mar?token=***"
    )


@pytest.mark.parametrize("password", ["p[ss", *BROKEN])
def test_a_url_whose_host_does_not_read_is_refused_with_its_password_hidden(password):
    problem = scheme_problem(f"https://u:{password}@h.example/x.mar", DownloadRules())
    assert problem == (
        "https://***@h.example/x.mar: its host or port does not read as one: percent-encode a password's '/', '?', '#', '[' or ']'"
    )
    assert is_remote(f"https://u:{password}@h.example/x.mar")  # not taken for a local path (named whole when missing)
