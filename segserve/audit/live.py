"""What a running TorchServe says of itself through its management API, by GET requests only: its version
(/api-description, which TorchServe 0.12 answers before its token check), whether GET /models answers without a
token, and, given its key file, the models it serves."""

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

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


def _get(url: str, key: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as reply:  # noqa: S310 (the user's own server's URL)
            return reply.status, reply.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise RuntimeFailure(f"--management {url.rsplit('/', 1)[0]}: no answer ({reason}): is TorchServe running there?") from None


def observe(management_url: str, token_file: Path | None) -> ServerView:
    base = management_url.rstrip("/")
    key = management_key(token_file) if token_file else None  # a bad key file is a usage error before any request
    status, body = _get(f"{base}/api-description")
    if status != 200:
        raise RuntimeFailure(f"--management {base}: GET /api-description answered {status}: is this TorchServe's management API?")
    version = json.loads(body).get("info", {}).get("version")
    tokenless, _ = _get(f"{base}/models")
    models = None
    if key:
        status, body = _get(f"{base}/models?limit=1000", key)
        if status != 200:
            raise RuntimeFailure(f"--token-file {token_file}: the server refused its management key ({status}): an older key file?")
        models = [model["modelName"] for model in json.loads(body).get("models", [])]
    return ServerView(version, tokenless == 200, models)
