"""A TorchServe config.properties read the way TorchServe reads it (java.util.Properties), each key with its line,
and TorchServe 0.12.0's default for each key the audit's rules read."""

from dataclasses import dataclass
from pathlib import Path

from segserve.errors import UsageError

# ConfigManager.java of TorchServe 0.12.0 (frontend/server/src/main/java/org/pytorch/serve/util/): the value a
# key takes when the file leaves it out. gRPC has no key that turns it off (ModelServer.startAndWait always
# starts it), so its addresses are the only way to keep it off the network.
DEFAULTS = {
    "inference_address": "http://127.0.0.1:8080",
    "management_address": "http://127.0.0.1:8081",
    "metrics_address": "http://127.0.0.1:8082",
    "grpc_inference_address": "127.0.0.1",
    "grpc_management_address": "127.0.0.1",
    "disable_token_authorization": "false",
    "enable_model_api": "false",
    "allowed_urls": "file://.*|http(s)?://.*",
    "install_py_dep_per_model": "false",
}


@dataclass(frozen=True)
class Setting:
    value: str
    line: int | None  # None: the file leaves the key out and TorchServe's default applies


def read_config(path: Path) -> dict[str, Setting]:
    """Every key of the file (the last one wins, as in Java) and every key of DEFAULTS the file leaves out."""
    if not path.exists() or path.is_dir():  # /dev/null is a file here: TorchServe's defaults
        raise UsageError(f"{path}: no such file (give a TorchServe config.properties; an empty file means TorchServe's defaults)")
    found: dict[str, Setting] = {}
    lines = path.read_text(errors="replace").splitlines()
    number = 0
    while number < len(lines):
        first, text = number + 1, lines[number].lstrip()
        while text.endswith("\\") and number + 1 < len(lines):  # a value continued on the next line
            number += 1
            text = text[:-1] + lines[number].lstrip()
        number += 1
        if not text or text.startswith(("#", "!")):
            continue
        key, value = _split(text)
        found[key] = Setting(value, first)
    return {**{key: Setting(value, None) for key, value in DEFAULTS.items()}, **found}


def _split(text: str) -> tuple[str, str]:
    """key and value: the key ends at the first '=', ':' or blank, and one '=' or ':' after blanks goes (Java's rule)."""
    end = next((index for index, char in enumerate(text) if char in "=: \t"), len(text))
    rest = text[end:].lstrip(" \t")
    return text[:end], (rest[1:] if rest[:1] in ("=", ":") else rest).strip()
