"""What a running TorchServe says of itself through its management API, by GET requests only: its version
(/api-description, which TorchServe 0.12 answers before its token check), whether GET /models answers without a
token, and, given its key file, the models it serves. The key goes to the address given only (no redirect, no proxy),
and over plain http only to this host."""

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from segserve.archives.archive_urls import masked
from segserve.audit.security_rules import beyond_loopback
from segserve.errors import RuntimeFailure, UsageError

TIMEOUT_S = 10


@dataclass(frozen=True)
class ServerView:
    version: str | None
    answers_without_token: bool
    models: list[str] | None  # None: no key file given


def management_key(token_file: Path) -> str:
    """The management key of TorchServe's key_file.json ({"management": {"key": ...}, ...})."""
    try:
        return json.loads(token_file.read_text())["management"]["key"]
    except FileNotFoundError:
        raise UsageError(f"--token-file {token_file}: no such file (TorchServe writes key_file.json in its working folder)") from None
    except (ValueError, KeyError, TypeError):
        raise UsageError(f"--token-file {token_file}: not TorchServe's key_file.json (no management.key)") from None


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args):  # a 3xx comes back as it is: the key goes to the address given and no other
        return None


# no redirect followed, and no proxy from http_proxy/https_proxy: the management key goes to the server's own address
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect)


def _get(url: str, key: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with _OPENER.open(request, timeout=TIMEOUT_S) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as error:
        if 300 <= error.code < 400:
            raise RuntimeFailure(
                f"--management {url.rsplit('/', 1)[0]}: GET {urlsplit(url).path} answered {error.code}, a redirect: the audit "
                "follows none (TorchServe sends none): give the server's own address"
            ) from None
        return error.code, error.read()
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise RuntimeFailure(f"--management {url.rsplit('/', 1)[0]}: no answer ({reason}): is TorchServe running there?") from None


def _checked(management_url: str, sends_key: bool) -> str:
    """The base URL: http(s) only, and a key sent in the clear only to this host."""
    base = management_url.rstrip("/")
    scheme, shown = urlsplit(base).scheme, masked(base)  # a URL's user info is never printed
    if scheme not in ("http", "https") or not urlsplit(base).hostname:
        raise UsageError(f"--management {shown}: not an http:// or https:// address (http://127.0.0.1:8081)")
    if sends_key and scheme == "http" and beyond_loopback(base):
        raise UsageError(
            f"--management {shown}: the management key would cross the network unencrypted: give an https:// address, "
            "or run the audit on the server's host (http://127.0.0.1:...)"
        )
    return base


def observe(management_url: str, token_file: Path | None) -> ServerView:
    key = management_key(token_file) if token_file else None  # a bad key file is a usage error before any request
    base = _checked(management_url, key is not None)
    status, body = _get(f"{base}/api-description")
    if status == 400 and b"InvalidKeyException" in body:  # TorchServe answers it before its key check; the Ray engine does not
        raise UsageError(
            f"--management {masked(base)}: GET /api-description asks for a key, as the Ray engine's management API does (TorchServe "
            "never does): audit a Ray engine by its run folder, `segserve audit --run-dir DIR`"
        )
    if status != 200:
        raise RuntimeFailure(f"--management {masked(base)}: GET /api-description answered {status}: is this TorchServe's management API?")
    version = json.loads(body).get("info", {}).get("version")
    tokenless, _ = _get(f"{base}/models")
    models = None
    if key:
        status, body = _get(f"{base}/models?limit=1000", key)
        if status != 200:
            raise RuntimeFailure(f"--token-file {token_file}: the server refused its management key ({status}): an older key file?")
        models = [model["modelName"] for model in json.loads(body).get("models", [])]
    return ServerView(version, tokenless == 200, models)
