"""`segserve audit` (#58): each rule fires on a config that breaks it and not on the repository's, the exit codes,
--json, the live check against a stand-in for TorchServe's management API, and docs/security.md's outputs."""

import contextlib
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from segserve.audit.config_file import read_config
from segserve.audit.security_rules import RULES, audit, beyond_loopback, lets_any_url_through
from segserve.cli import main
from tests.conftest import ROOT

# (config lines, what the server says, the rule's key, its severity, words of its message): one case per row of RULES
BREAKING = [
    (["management_address=http://0.0.0.0:8081"], {}, "management_address", "High", "management API"),
    (["grpc_management_address=0.0.0.0"], {}, "grpc_management_address", "High", "gRPC management"),
    (["disable_token_authorization=TRUE"], {}, "disable_token_authorization", "High", "token authorization is off"),
    ([], {"answers_without_token": "true"}, "answers_without_token", "High", "without a token"),
    (["allowed_urls=.*"], {}, "allowed_urls", "High", "POST /workflows always"),  # the model API off: workflows
    ([], {"version": "0.8.1"}, "version", "High", "before 0.8.2"),
    ([], {"version": "0.11.0"}, "version", "High", "before 0.11.1"),
    (["grpc_inference_address=::"], {}, "grpc_inference_address", "Medium", "CVE-2025-55163"),
    (["enable_model_api=true", "allowed_urls=^(?!)$"], {}, "enable_model_api", "Medium", "model API is on"),
    (["install_py_dep_per_model=true"], {}, "install_py_dep_per_model", "Medium", "pip-installed"),
    ([], {"version": "0.12.0"}, "version", "Medium", "archived"),
    (["inference_address=https://my-host.example:8443"], {}, "inference_address", "Low", "inference API"),
    (["metrics_address=http://10.0.0.5:8082"], {}, "metrics_address", "Low", "metrics API"),
]


def findings_of(tmp_path, lines: list[str], observed: dict[str, str]):
    path = tmp_path / "config.properties"
    path.write_text("".join(f"{line}\n" for line in lines))
    return audit(read_config(path, {}), observed, "server")


@pytest.mark.parametrize(("lines", "observed", "key", "severity", "says"), BREAKING)
def test_each_rule_fires_on_a_config_that_breaks_it_and_its_fix_mends_it(tmp_path, lines, observed, key, severity, says):
    found = [f for f in findings_of(tmp_path, lines, observed) if (f.severity, f.key) == (severity, key) and says in f.rule]
    assert len(found) == 1
    if key not in observed:  # the line to write, written last (the last one wins), ends the finding
        assert (severity, key) not in {(f.severity, f.key) for f in findings_of(tmp_path, [*lines, found[0].fix], observed)}


def test_allowed_urls_is_high_with_the_model_api_off_because_post_workflows_fetches_by_url(tmp_path):
    (found,) = [f for f in findings_of(tmp_path, [], {}) if f.key == "allowed_urls"]  # TorchServe's defaults
    assert found.severity == "High" and "POST /workflows always (the model API does not gate it)" in found.rule
    assert not [r for r in RULES if "dormant" in r.message]


def test_every_rule_has_a_breaking_case_and_the_repositorys_file_breaks_only_the_model_api():
    assert sorted((r.severity, r.key) for r in RULES) == sorted((severity, key) for *_, key, severity, _ in BREAKING)
    # segserve registers archives through the management API: the model API stays on, with the token and no URL
    found = audit(read_config(ROOT / "config.properties", {}), {"answers_without_token": "false"}, "server")
    assert [(f.severity, f.key, f.line) for f in found] == [("Medium", "enable_model_api", 24)]


def test_a_finding_names_its_line_or_the_default_and_the_line_to_write(tmp_path):
    lines = ["# comment", "management_address = http://0.0.0.0:9081", "! also a comment", "metrics_address: http://[::]:9082"]
    lines += ["inference_address http://0.0.0.0:1", "inference_address=http://10.1.2.3:\\", "  9080"]  # the last one wins
    found = {f.key: f for f in findings_of(tmp_path, lines, {})}
    assert (found["management_address"].line, found["management_address"].fix) == (2, "management_address=http://127.0.0.1:9081")
    assert (found["metrics_address"].line, found["metrics_address"].fix) == (4, "metrics_address=http://127.0.0.1:9082")
    assert (found["inference_address"].line, found["inference_address"].fix) == (6, "inference_address=http://127.0.0.1:9080")
    assert (found["allowed_urls"].line, found["allowed_urls"].fix) == ("default", "allowed_urls=^(?!)$")


@pytest.mark.parametrize(
    ("address", "beyond"),
    [
        ("http://127.0.0.1:8081", False),
        ("https://localhost:8443", False),
        ("http://[::1]:8081", False),
        ("127.0.0.2", False),
        ("unix:/tmp/ts.sock", False),
        ("http://0.0.0.0:8081", True),
        ("::", True),
        ("http://192.168.1.4:8081", True),
        ("http://my-host:8081", True),
    ],
)
def test_loopback_is_127_8_or_localhost_or_a_unix_socket(address, beyond):
    assert beyond_loopback(address) is beyond


@pytest.mark.parametrize(
    ("allowed_urls", "wide"),
    [
        ("file://.*|http(s)?://.*", True),  # TorchServe's default
        (".*", True),
        ("^(?!)$", False),
        (r"https://my-bucket\.s3\.amazonaws\.com/.*", False),
        (r"https://my-bucket\.s3\.amazonaws\.com/.*,HTTP://.*", True),  # one pattern of the list, any case
        ("file:///srv/models/.*", False),
        ("(unclosed", True),  # unreadable here: counted as letting everything through
    ],
)
def test_allowed_urls_is_wide_when_one_pattern_lets_an_arbitrary_url_through(allowed_urls, wide):
    assert lets_any_url_through(allowed_urls) is wide


def test_exit_status_is_1_on_a_high_finding_0_otherwise_2_on_usage_errors(tmp_path, capsys):
    shelltorch, locked = tmp_path / "shelltorch.properties", tmp_path / "locked.properties"
    shelltorch.write_text("management_address=http://0.0.0.0:8081\n")
    locked.write_text("allowed_urls=^(?!)$\n")
    assert main(["audit", str(shelltorch)]) == 1
    assert main(["audit", str(locked)]) == 0
    capsys.readouterr()
    assert main(["audit", str(tmp_path / "missing.properties")]) == 2
    assert capsys.readouterr().err.startswith(f"error: {tmp_path / 'missing.properties'}: no such file")
    assert main(["audit", str(locked), "--token-file", str(tmp_path / "key_file.json")]) == 2


def test_json_holds_every_finding_with_its_line_and_fix(capsys):
    assert main(["audit", str(ROOT / "samples" / "shelltorch.properties"), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["counts"]["High"] == 3 and report["version_from"] == "installed" and report["models"] is None
    assert {"severity": "High", "key": "management_address", "line": 5} == {
        k: report["findings"][0][k] for k in ("severity", "key", "line")
    }
    assert report["findings"][0]["fix"] == "management_address=http://127.0.0.1:8081"


class StandIn(BaseHTTPRequestHandler):
    """TorchServe 0.12's management API as the audit sees it: /api-description before the token check, /models after."""

    version, key, tokenless, redirect_to = "0.12.0", "M-key", False, None

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.redirect_to and self.path.startswith("/models"):
            self.send_response(302)
            self.send_header("Location", f"{self.redirect_to}{self.path}")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/api-description":
            self.answer(200, {"openapi": "3.0.1", "info": {"title": "TorchServe APIs", "version": self.version}})
        elif self.path.startswith("/models") and (self.tokenless or self.headers.get("Authorization") == f"Bearer {self.key}"):
            self.answer(200, {"models": [{"modelName": "seg", "modelUrl": "seg.mar"}]})
        else:
            self.answer(400, {"code": 400, "type": "InvalidKeyException"})

    def answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


class Elsewhere(StandIn):
    """Another address (a redirect's target, a proxy): it answers as the server would, and keeps what it was sent."""

    seen: list[tuple[str, str | None]] = []
    redirect_to = None

    def do_GET(self):  # noqa: N802 (http.server's name)
        Elsewhere.seen.append((self.path, self.headers.get("Authorization")))
        super().do_GET()


@contextlib.contextmanager
def serving(handler):
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def stand_in():
    with serving(StandIn) as server:
        try:
            yield server
        finally:
            StandIn.version, StandIn.tokenless, StandIn.redirect_to = "0.12.0", False, None


@pytest.fixture
def elsewhere():
    Elsewhere.seen = []
    with serving(Elsewhere) as server:
        yield f"http://127.0.0.1:{server.server_port}"


def test_the_live_check_reads_the_servers_version_models_and_tokenless_answer(stand_in, tmp_path, capsys):
    url = f"http://127.0.0.1:{stand_in.server_port}"
    key_file = tmp_path / "key_file.json"
    key_file.write_text(json.dumps({"management": {"key": "M-key"}, "inference": {"key": "I"}, "API": {"key": "A"}}))
    config = str(ROOT / "config.properties")
    assert main(["audit", config, "--management", url, "--token-file", str(key_file), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["torchserve"], report["version_from"], report["models"]) == ("0.12.0", "server", ["seg"])
    assert [f["key"] for f in report["findings"]] == ["enable_model_api", "version"] and report["findings"][1]["line"] == "server"

    StandIn.version, StandIn.tokenless = "0.8.1", True  # an old server started with its token off
    assert main(["audit", config, "--management", url]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{config}: TorchServe 0.8.1 (at {url}); 5 finding(s): 3 High")
    assert "answers_without_token (the server)" in out and "CVE-2022-1471" in out

    StandIn.tokenless = False
    key_file.write_text(json.dumps({"management": {"key": "old"}}))
    assert main(["audit", config, "--management", url, "--token-file", str(key_file)]) == 1  # refused: a runtime failure
    assert "refused its management key (400)" in capsys.readouterr().err


@pytest.fixture
def key_file(tmp_path):
    path = tmp_path / "key_file.json"
    path.write_text(json.dumps({"management": {"key": "M-key"}}))
    return str(path)


def test_the_live_check_follows_no_redirect_so_the_key_stays_with_the_server(stand_in, elsewhere, key_file, capsys):
    StandIn.redirect_to = elsewhere  # /models answers 302 to another server
    url = f"http://127.0.0.1:{stand_in.server_port}"
    assert main(["audit", str(ROOT / "config.properties"), "--management", url, "--token-file", key_file]) == 1
    assert "GET /models answered 302, a redirect: the audit follows none" in capsys.readouterr().err
    assert Elsewhere.seen == []


def test_the_live_check_takes_no_proxy_from_the_environment(stand_in, elsewhere, key_file, capsys, monkeypatch):
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", elsewhere)
    monkeypatch.setattr(urllib.request, "_opener", None)  # as in a fresh process: urlopen's opener reads them once
    url = f"http://127.0.0.1:{stand_in.server_port}"
    assert main(["audit", str(ROOT / "config.properties"), "--management", url, "--token-file", key_file]) == 0
    assert Elsewhere.seen == []


def test_the_key_goes_over_plain_http_to_this_host_only(key_file, capsys, monkeypatch):
    def no_connection(address, *args, **kwargs):
        raise AssertionError(f"the audit connected to {address}")

    monkeypatch.setattr(socket, "create_connection", no_connection)
    config = str(ROOT / "config.properties")
    assert main(["audit", config, "--management", "http://192.0.2.7:8081", "--token-file", key_file]) == 2
    assert "the management key would cross the network unencrypted" in capsys.readouterr().err
    assert main(["audit", config, "--management", "file:///etc/passwd"]) == 2
    assert "not an http:// or https:// address" in capsys.readouterr().err


def test_a_reader_that_closes_early_ends_the_command_quietly():
    """`segserve audit … | head`: no BrokenPipeError traceback, the exit status of a command SIGPIPE ends."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first byte: every write meets a broken pipe
    try:
        command = [sys.executable, "-m", "segserve.cli", "audit", "samples/shelltorch.properties"]
        done = subprocess.run(command, cwd=ROOT, stdout=write_end, stderr=subprocess.PIPE, timeout=60)
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr.decode()) == (141, "")


def test_a_server_that_does_not_answer_is_a_runtime_failure(capsys):
    stand_in = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    port = stand_in.server_port
    stand_in.server_close()  # nothing listens there any more
    assert main(["audit", str(ROOT / "config.properties"), "--management", f"http://127.0.0.1:{port}"]) == 1
    assert "no answer" in capsys.readouterr().err


def documented_runs() -> list[tuple[str, str, int]]:
    """(command, its output, its exit status) for each `segserve audit` block of docs/security.md shown with its output."""
    text = (ROOT / "docs" / "security.md").read_text()
    pattern = r"```bash\n(\.venv/bin/segserve audit [^\n]*)\n```\n\n```text\n(.*?)```\n\nExit status (\d)"
    return [(command, output, int(status)) for command, output, status in re.findall(pattern, text, re.S)]


def test_the_documented_outputs_are_what_the_command_prints(capsys, monkeypatch):
    runs = documented_runs()
    assert [shlex.split(c)[2] for c, *_ in runs] == ["config.properties", "/dev/null", "samples/shelltorch.properties"]
    monkeypatch.chdir(ROOT)
    for command, output, status in runs:
        assert main(shlex.split(command)[1:]) == status, command
        assert capsys.readouterr().out == output, f"{command}: paste its output into docs/security.md"


def test_the_documented_tables_list_every_rule():
    from segserve.audit.ray_engine import RAY_RULES  # the Ray engine's table (`audit --run-dir`)

    text = (ROOT / "docs" / "security.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| (High|Medium|Low) \|", text, re.M)
    assert sorted(rows) == sorted((r.key, r.severity) for r in (*RULES, *RAY_RULES))


def test_a_management_url_with_user_info_is_never_printed_with_it(tmp_path, capsys):
    # the second reading of #64: --management's user:password went whole into the refusal (refused before any request)
    keys = tmp_path / "key_file.json"
    keys.write_text(json.dumps({"management": {"key": "m"}, "inference": {"key": "i"}, "API": {"key": "a"}}))
    command = ["audit", str(ROOT / "config.properties"), "--management", "http://user:pw@10.0.0.1:8081", "--token-file", str(keys)]
    assert main(command) == 2
    err = capsys.readouterr().err
    assert "pw" not in err and "http://***@10.0.0.1:8081" in err, err
