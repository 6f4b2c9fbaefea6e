"""`segserve audit` reads a config.properties as TorchServe 0.12.0 does: java.util.Properties' escapes, continuations
and line ends (issue #64; tests/integration/test_audit_properties.py compares every key and value with Java itself),
then `$$NAME$$` and, with `enable_envvars_config=true`, the `TS_*` environment variables."""

import json

import pytest

from segserve.audit.config_file import read_config
from segserve.audit.java_properties import load, parse_boolean
from segserve.cli import main

LOCKED = b"allowed_urls=^(?!)$\n"  # so that the only High finding left is the one under test

# each turns token authorization off in TorchServe (Java agrees: test_the_issue_files_turn_token_authorization_off_in_java_too)
TOKEN_OFF = {
    "unicode_escape": (b"disable_token_authorization=\\u0074rue\n", 1),
    "escaped_key": (b"disable\\_token_authorization=true\n", 1),
    "even_backslashes": (b"path=C:\\\\\ndisable_token_authorization=true\n", 2),
    "comment_backslash": (b"# the next line is mine \\\ndisable_token_authorization=true\n", 2),
    "cr_line_ends": (b"a=1\rdisable_token_authorization=true\r", 2),
}


def audit_json(tmp_path, capsys, data: bytes) -> tuple[int, dict]:
    path = tmp_path / "config.properties"
    path.write_bytes(LOCKED + data)
    status = main(["audit", str(path), "--json"])
    return status, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", TOKEN_OFF)
def test_each_way_java_turns_token_authorization_off_is_a_high_finding(tmp_path, capsys, name):
    data, line = TOKEN_OFF[name]
    status, report = audit_json(tmp_path, capsys, data)
    assert status == 1
    assert [(f["severity"], f["key"], f["line"]) for f in report["findings"] if f["severity"] == "High"] == [
        ("High", "disable_token_authorization", line + 1)  # LOCKED is line 1
    ]


def test_lines_are_numbered_as_cr_lf_and_crlf_end_them_and_a_continued_key_has_its_first():
    data = b"a=1\r\nb=2\rc=3\n\n  d=four\\\n    more\\\r\n  still\ne=5"
    assert [(e.key, e.value, e.line) for e in load(data)] == [
        ("a", "1", 1),
        ("b", "2", 2),
        ("c", "3", 3),
        ("d", "fourmorestill", 5),
        ("e", "5", 8),
    ]


def test_a_value_keeps_its_trailing_blanks_and_parse_boolean_does_not_trim():
    (entry,) = load(b"disable_token_authorization = true \n")
    assert entry.value == "true " and not parse_boolean(entry.value)  # TorchServe keeps its token here
    assert parse_boolean("TRUE") and not parse_boolean("yes")


def test_a_malformed_unicode_escape_is_a_usage_error_as_java_refuses_the_file(tmp_path, capsys):
    path = tmp_path / "config.properties"
    path.write_bytes(b"a=1\nb=\\u00zz\n")
    assert main(["audit", str(path)]) == 2
    assert capsys.readouterr().err == f"error: {path}: line 2: malformed \\uxxxx escape (Java refuses the whole file)\n"


def test_ts_variables_count_only_with_enable_envvars_config_and_override_the_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TS_DISABLE_TOKEN_AUTHORIZATION", "true")
    monkeypatch.setenv("TS_MANAGEMENT_ADDRESS", "http://0.0.0.0:8081")
    status, report = audit_json(tmp_path, capsys, b"disable_token_authorization=false\n")
    assert status == 0  # without enable_envvars_config TorchServe reads no TS_* variable
    status, report = audit_json(tmp_path, capsys, b"disable_token_authorization=false\nenable_envvars_config=true\n")
    high = {f["key"]: (f["line"], f["fix"]) for f in report["findings"] if f["severity"] == "High"}
    assert status == 1 and high == {
        "disable_token_authorization": ("TS_DISABLE_TOKEN_AUTHORIZATION", "TS_DISABLE_TOKEN_AUTHORIZATION=false"),
        "management_address": ("TS_MANAGEMENT_ADDRESS", "TS_MANAGEMENT_ADDRESS=http://127.0.0.1:8081"),
    }
    path = tmp_path / "config.properties"
    assert main(["audit", str(path)]) == 1
    assert "disable_token_authorization (environment TS_DISABLE_TOKEN_AUTHORIZATION)" in capsys.readouterr().out


def test_ts_allowed_urls_counts_only_with_use_env_allowed_urls(tmp_path):
    path = tmp_path / "config.properties"
    environ = {"TS_ALLOWED_URLS": ".*"}
    path.write_bytes(LOCKED + b"enable_envvars_config=true\n")
    assert read_config(path, environ)["allowed_urls"].value == "^(?!)$"
    path.write_bytes(LOCKED + b"enable_envvars_config=true\nuse_env_allowed_urls=TRUE\n")
    assert read_config(path, environ)["allowed_urls"].variable == "TS_ALLOWED_URLS"


def test_a_dollar_reference_takes_the_variable_as_java_appends_a_replacement(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TOKEN_OFF", raising=False)
    path = tmp_path / "config.properties"
    path.write_bytes(b"disable_token_authorization=$$TOKEN_OFF$$\nenable_envvars_config=$$ENVS$$\n")
    config = read_config(path, {"TOKEN_OFF": "tru\\e", "ENVS": "$1", "TS_ENABLE_MODEL_API": "true"})
    assert (config["disable_token_authorization"].value, config["disable_token_authorization"].line) == ("true", 1)
    assert config["enable_envvars_config"].value == "ENVS" and config["enable_model_api"].value == "false"
    status = main(["audit", str(path)])  # TOKEN_OFF is not set here: TorchServe would not start
    assert status == 2 and "names $$TOKEN_OFF$$, not set here" in capsys.readouterr().err
