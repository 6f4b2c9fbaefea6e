"""A TorchServe config.properties read the way TorchServe 0.12.0's ConfigManager reads it: java.util.Properties
(java_properties.py), then `$$NAME$$` in a value replaced by that environment variable, then, with
`enable_envvars_config=true`, a `TS_<KEY>` environment variable over the file's key; each key with its line (or the
variable it came from), and TorchServe's default for each key the audit's rules read."""

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from segserve.audit.java_properties import load, parse_boolean
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


# ConfigManager.setSystemVars: with enable_envvars_config, each of its `TS_*` constants names an environment variable
# that sets the key it holds; in 0.12.0 every key above has one, spelt TS_ and the key in capitals. allowed_urls
# only when the file says use_env_allowed_urls=true.
ENVIRONMENT = {f"TS_{key.upper()}": key for key in DEFAULTS}
# ConfigManager.resolveEnvVarVals, before anything else reads a value: $$NAME$$ (two characters or more) is NAME's value
ENV_REFERENCE = re.compile(r"\$\$([^$]+[^$])\$\$")
REPLACEMENT = re.compile(r"\\(.)|\$([01])|([\\$])|([^\\$]+)", re.DOTALL)  # an escape, a group, a refusal, text


@dataclass(frozen=True)
class Setting:
    value: str
    line: int | None  # None: the file leaves the key out and TorchServe's default applies
    variable: str | None = None  # the TS_* environment variable the value came from, over the file's line


def read_config(path: Path, environ: Mapping[str, str]) -> dict[str, Setting]:
    """Every key TorchServe ends with (the file's, the last one wins as in Java, then `environ`'s) and every key of
    DEFAULTS it leaves out. `environ`: the server's environment (the audit's own, which should be the same)."""
    if not path.exists() or path.is_dir():  # /dev/null is a file here: TorchServe's defaults
        raise UsageError(f"{path}: no such file (give a TorchServe config.properties; an empty file means TorchServe's defaults)")
    try:
        entries = load(path.read_bytes())
    except ValueError as error:
        raise UsageError(f"{path}: {error}") from None
    found = {entry.key: Setting(entry.value, entry.line) for entry in entries}
    found = {key: Setting(_resolve(path, key, setting, environ), setting.line) for key, setting in found.items()}
    values = {key: setting.value for key, setting in found.items()}
    if parse_boolean(values.get("enable_envvars_config", "false")):
        from_env = parse_boolean(values.get("use_env_allowed_urls", "false"))
        for variable, key in ENVIRONMENT.items():
            if variable in environ and (key != "allowed_urls" or from_env):
                found[key] = Setting(environ[variable], None, variable)
    return {**{key: Setting(value, None) for key, value in DEFAULTS.items()}, **found}


def _resolve(path: Path, key: str, setting: Setting, environ: Mapping[str, str]) -> str:
    """The value with each $$NAME$$ replaced by NAME's value read as Java's Matcher.appendReplacement reads a
    replacement ('\\x' is x, '$0' the reference, '$1' the name); TorchServe refuses to start when NAME is not set or
    its value is no valid replacement."""

    def one(match: re.Match) -> str:
        name, where = match.group(1), f"{path}: line {setting.line}: {key}"
        if name not in environ:
            raise UsageError(f"{where} names $${name}$$, not set here: run the audit with the server's environment")
        out = []
        for escaped, group, refused, plain in REPLACEMENT.findall(environ[name]):
            if refused:
                raise UsageError(f"{where}: ${name} holds a '{refused}' Java refuses in a replacement (TorchServe would not start)")
            out.append(match.group(int(group)) if group else escaped + plain)
        return "".join(out)

    return ENV_REFERENCE.sub(one, setting.value)
