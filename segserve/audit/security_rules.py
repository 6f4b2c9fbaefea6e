"""The security rules for a TorchServe (issue #58, docs/security.md), as one table: the key each reads, when it is
broken, how bad that is, why, and the line that mends it. A rule reads a config.properties key or what the server
itself says (`version`, `answers_without_token`)."""

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from segserve.audit.config_file import Setting
from segserve.audit.java_properties import parse_boolean

SEVERITIES = ("High", "Medium", "Low")
NO_URL = "^(?!)$"  # a pattern no URL matches: archives are registered by file name from the model store only
# URLs an attacker would have TorchServe fetch: any host over http(s), the cloud's metadata address, a local file
PROBE_URLS = ("http://attacker.example/x.mar", "https://attacker.example/x.mar", "http://169.254.169.254/latest/", "file:///etc/passwd")


def beyond_loopback(address: str) -> bool:
    """An HTTP address (http://host:port, or unix:/path) or a gRPC host that other machines can reach."""
    if address.startswith("unix:"):
        return False
    host = (urlsplit(address).hostname if "://" in address else address.strip("[]")) or ""
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True  # a host name: the addresses of this machine it names


def loopback(address: str) -> str:
    """The same address on 127.0.0.1 (its scheme and port kept)."""
    if "://" not in address:
        return "127.0.0.1"
    parts = urlsplit(address)
    return f"{parts.scheme}://127.0.0.1" + (f":{parts.port}" if parts.port else "")


def lets_any_url_through(allowed_urls: str) -> bool:
    """TorchServe splits allowed_urls at ',' and lets a URL through when one pattern matches all of it, ignoring
    case (ArchiveUtils.validateURL). A pattern Python cannot read counts as letting everything through."""
    for pattern in allowed_urls.split(","):
        try:
            if any(re.fullmatch(pattern, url, re.IGNORECASE) for url in PROBE_URLS):
                return True
        except re.error:
            return True
    return False


def version_below(version: str, bound: str) -> bool:
    def numbers(text: str) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", re.match(r"[\d.]*", text).group(0)))

    return numbers(version) < numbers(bound)


@dataclass(frozen=True)
class Rule:
    key: str
    breaks: Callable[[str, dict[str, str]], bool]  # (the key's value, every value) -> the rule is broken
    severity: str
    message: str
    fix: str  # the line to write; {loopback} is the key's address on 127.0.0.1


NETTY = (
    "TorchServe is archived and 0.12.0 is its last release: its netty 4.1.53 (HTTP ports) and grpc 1.50's netty 4.1.79 "
    "(gRPC ports, HTTP/2) keep CVE-2025-55163, CVE-2025-58056 and CVE-2025-58057 (fixed in netty 4.1.124/4.1.125, never here)"
)

RULES = (
    Rule(
        "management_address",
        lambda v, _: beyond_loopback(v),
        "High",
        "the management API (register, delete, scale models) answers beyond this host",
        "management_address={loopback}",
    ),
    Rule(
        "grpc_management_address",
        lambda v, _: beyond_loopback(v),
        "High",
        "gRPC management answers beyond this host (TorchServe always starts gRPC: its address is the only switch)",
        "grpc_management_address=127.0.0.1",
    ),
    Rule(
        "disable_token_authorization",
        lambda v, _: parse_boolean(v),
        "High",
        "token authorization is off: whoever reaches a port manages and calls the models",
        "disable_token_authorization=false",
    ),
    Rule(
        "answers_without_token",
        lambda v, c: parse_boolean(v) and not parse_boolean(c["disable_token_authorization"]),
        "High",
        "the server answered GET /models without a token, whatever this file says: start it without --disable-token-auth",
        "disable_token_authorization=false",
    ),
    Rule(  # POST /workflows fetches by URL whether the model API is on or off (WorkflowMgmtRequestHandler)
        "allowed_urls",
        lambda v, _: lets_any_url_through(v),
        "High",
        "a registration fetches an archive from any URL, and an archive runs its own Python: POST /workflows always "
        "(the model API does not gate it), POST /models with the model API on (CVE-2023-43654, ShellTorch's SSRF: "
        "0.8.2's fix is this key)",
        f"allowed_urls={NO_URL}",
    ),
    Rule(
        "version",
        lambda v, _: version_below(v, "0.8.2"),
        "High",
        "before 0.8.2: no allowed_urls (CVE-2023-43654) and SnakeYAML 1.x (CVE-2022-1471: code from a model's YAML)",
        "upgrade to torchserve 0.12.0",
    ),
    Rule(
        "version",
        lambda v, _: version_below(v, "0.11.1"),
        "High",
        "before 0.11.1: no token authorization and the model API always on; before 0.11.0, gRPC on every address",
        "upgrade to torchserve 0.12.0",
    ),
    Rule(
        "grpc_inference_address",
        lambda v, _: beyond_loopback(v),
        "Medium",
        "gRPC inference answers beyond this host over HTTP/2, where netty's CVE-2025-55163 is reached; "
        "keep it on loopback unless clients use gRPC",
        "grpc_inference_address=127.0.0.1",
    ),
    Rule(
        "enable_model_api",
        lambda v, _: parse_boolean(v),
        "Medium",
        "the model API is on: the management API registers and deletes models (default off; load_models registers at start without it)",
        "enable_model_api=false",
    ),
    Rule(
        "install_py_dep_per_model",
        lambda v, _: parse_boolean(v),
        "Medium",
        "an archive's requirements are pip-installed at registration: each package's own code runs with the server's rights",
        "install_py_dep_per_model=false",
    ),
    Rule("version", lambda v, _: not version_below("0.12.0", v), "Medium", NETTY, "no release fixes them: keep every address on 127.0.0.1"),
    Rule(
        "inference_address",
        lambda v, _: beyond_loopback(v),
        "Low",
        "the inference API answers beyond this host: right when clients are elsewhere, with its token kept",
        "inference_address={loopback}",
    ),
    Rule(
        "metrics_address",
        lambda v, _: beyond_loopback(v),
        "Low",
        "the metrics API answers beyond this host (model names, workers, memory)",
        "metrics_address={loopback}",
    ),
)


@dataclass(frozen=True)
class Finding:
    severity: str
    key: str
    # the file's line; "default" (the key is absent); "server" or "installed" (not from the file); or the TS_*
    # environment variable that set it (enable_envvars_config=true)
    line: int | str
    rule: str
    fix: str


def audit(config: dict[str, Setting], observed: dict[str, str], source: str) -> list[Finding]:
    """The rules `config` (the file, defaults filled in) and `observed` (what `source` says: the server, or the
    torchserve installed here) break, High first."""
    values = {key: setting.value for key, setting in config.items()} | observed
    findings = []
    for rule in RULES:
        if rule.key in values and rule.breaks(values[rule.key], values):
            fix = rule.fix.format(loopback=loopback(values[rule.key]))
            setting = config.get(rule.key)
            if rule.key in observed:
                line = source
            elif setting.variable:  # the variable overrides the file's line: the fix goes where the value came from
                line, fix = setting.variable, fix.replace(f"{rule.key}=", f"{setting.variable}=", 1)
            else:
                line = setting.line or "default"
            findings.append(Finding(rule.severity, rule.key, line, rule.message, fix))
    return sorted(findings, key=lambda f: SEVERITIES.index(f.severity))
