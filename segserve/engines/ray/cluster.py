"""Joining a user's running Ray cluster (`segserve serve --engine ray --ray-address HOST:PORT`, #67): which address,
which token, which folder every node reads the archives from, and the refusals, as clear lines before anything starts.

- The address is the GCS's (`ray start --head --port`, 6379 by default), and segserve's driver joins the cluster as
  a driver: it runs where `segserve serve` runs, which must be a node of the cluster (the head, typically), since a
  Ray driver attaches to its machine's raylet, as `ray job submit`'s entrypoint does. Not Ray Client's `ray://`: a
  driver through the client server holds its objects on the head and proxies every call (Ray documents it for
  interactive work), and a long-running driver on a node needs none of that.
- The token, as Ray 2.60 looks for it (ray/_private/authentication/authentication_token_setup.py and the
  AuthenticationTokenLoader's messages): RAY_AUTH_TOKEN, else the file RAY_AUTH_TOKEN_PATH names, else
  ~/.ray/auth_token. A cluster with token auth off (an RPC without a token is answered) is refused unless
  `--ray-allow-no-auth` says so: anyone who reaches its ports runs code on it.
- Archives: from a folder every node mounts at the same path (`--ray-shared-dir`, NFS or the like): the model store
  must be inside it; the key file and the replicas' extracted archives go into a folder of this engine's there (a
  replica on any node reads the key and its archive). Ray's runtime_env packages stop at 512 MiB, and an S3 model
  store is synced into the shared folder first (`aws s3 sync`), as k8s.yaml's init container copies it.

What the cluster is is kept in the run folder's `ray_cluster.json`, so `scale`, `token`, `predict` and `serve --stop`
act on the same engine.
"""

import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from segserve.errors import RuntimeFailure, UsageError

CLUSTER_FILE = "ray_cluster.json"
ADDRESS = re.compile(r"^(?:\[(?P<ipv6>[0-9a-fA-F:.]+)\]|(?P<host>[A-Za-z0-9.-]+)):(?P<port>\d{1,5})$")
DEFAULT_TOKEN_FILE = Path(".ray") / "auth_token"  # under HOME: Ray's _get_default_token_path
AUTH_REFUSED = "InvalidAuthToken"  # what Ray's GCS answers an RPC without the right token


@dataclass(frozen=True)
class Cluster:
    """A running Ray cluster that the engine deploys onto."""

    address: str  # the GCS's HOST:PORT
    shared_dir: str  # a folder every node mounts at this path: the model store, the key file, extracted archives
    allow_no_auth: bool = False  # --ray-allow-no-auth: deploy onto a cluster with token auth off

    def save(self, run_dir: Path) -> None:
        (run_dir / CLUSTER_FILE).write_text(json.dumps(asdict(self), indent=2) + "\n")


def recorded(run_dir: Path) -> Cluster | None:
    """The cluster the Ray engine of run_dir was deployed onto (None: a local Ray of its own)."""
    try:
        return Cluster(**json.loads((Path(run_dir) / CLUSTER_FILE).read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as error:
        raise RuntimeFailure(f"{Path(run_dir) / CLUSTER_FILE}: unreadable ({error}): remove it, or serve with --ray-address") from None


def parse_address(text: str) -> str:
    """The GCS's HOST:PORT, or a line saying what to give instead."""
    text = text.strip()
    if text.startswith("ray://"):
        raise UsageError(
            f"--ray-address {text}: Ray Client's ray:// is not taken: give the GCS's HOST:PORT (the head's `ray start --head --port`,"
            " 6379 by default) and run segserve on a node of the cluster (docs/ray.md)"
        )
    match = ADDRESS.match(text)
    if not match or not 0 < int(match["port"]) < 65536:
        raise UsageError(f"--ray-address {text!r}: not HOST:PORT (the GCS's address, e.g. 10.0.0.5:6379)")
    return text


def from_options(address: str | None, shared_dir: str | None, allow_no_auth: bool) -> Cluster | None:
    """The cluster of `serve`'s --ray-address, --ray-shared-dir and --ray-allow-no-auth (None: a local Ray)."""
    if address is None:
        if shared_dir or allow_no_auth:
            raise UsageError("--ray-shared-dir and --ray-allow-no-auth go with --ray-address HOST:PORT (a running Ray cluster)")
        return None
    if not shared_dir:
        raise UsageError(
            "--ray-address needs --ray-shared-dir DIR: a folder every node of the cluster mounts at the same path, holding the"
            " model store (the replicas on other nodes read the archives from there)"
        )
    folder = Path(shared_dir).resolve()
    if not folder.is_dir():
        raise UsageError(f"--ray-shared-dir {shared_dir}: no such folder")
    return Cluster(parse_address(address), str(folder), allow_no_auth)


def outside_shared(cluster: Cluster, archives: list[Path]) -> str | None:
    """Why an archive (or the model store) cannot reach every node: a path not under the shared folder (None: all are)."""
    shared = Path(cluster.shared_dir).resolve()
    for path in archives:
        if not Path(path).resolve().is_relative_to(shared):
            return f"{path} is not under --ray-shared-dir {cluster.shared_dir}: the cluster's other nodes cannot read it (move it there)"
    return None


def token_environment(environ: dict[str, str], home: Path) -> dict[str, str] | None:
    """The driver's token settings, where Ray looks (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH's file, ~/.ray/auth_token):
    the variables that name it, None where there is none. A named file that is missing or empty is refused."""
    if environ.get("RAY_AUTH_TOKEN", "").strip():
        return {"RAY_AUTH_TOKEN": environ["RAY_AUTH_TOKEN"]}
    if named := environ.get("RAY_AUTH_TOKEN_PATH"):
        if not _has_token(Path(named)):
            raise UsageError(f"RAY_AUTH_TOKEN_PATH={named}: no token in that file")
        return {"RAY_AUTH_TOKEN_PATH": named}
    default = home / DEFAULT_TOKEN_FILE
    return {"RAY_AUTH_TOKEN_PATH": str(default)} if _has_token(default) else None


def _has_token(path: Path) -> bool:
    try:
        return bool(path.read_text().strip())
    except OSError:
        return False


def driver_environment(cluster: Cluster, environ: dict[str, str], home: Path, probe=None) -> dict[str, str]:
    """The Ray auth variables of a driver of `cluster` (the caller's other RAY_AUTH_* dropped), after asking the
    cluster (probe: auth_required's signature) whether it takes RPCs without a token and whether it takes ours."""
    probe = probe or auth_answer
    if probe(cluster.address, {"RAY_AUTH_MODE": "disabled"}) == "answered":
        if not cluster.allow_no_auth:
            raise UsageError(
                f"the Ray cluster at {cluster.address} has token authentication off: anyone who reaches its ports runs code on it"
                " (start its nodes with RAY_AUTH_MODE=token), or pass --ray-allow-no-auth to deploy anyway"
            )
        return {"RAY_AUTH_MODE": "disabled"}
    token = token_environment(environ, home)
    if token is None:
        raise UsageError(
            f"the Ray cluster at {cluster.address} asks for a token: set RAY_AUTH_TOKEN, or RAY_AUTH_TOKEN_PATH, or put it in"
            f" {home / DEFAULT_TOKEN_FILE} (`ray get-auth-token` on its head prints it)"
        )
    settings = {"RAY_AUTH_MODE": "token", **token}
    if probe(cluster.address, settings) != "answered":
        raise UsageError(f"the Ray cluster at {cluster.address} refuses the token of {next(iter(token))}: not this cluster's")
    return settings


def auth_answer(address: str, settings: dict[str, str], timeout_s: float = 60) -> str:
    """What the GCS at `address` does with one RPC sent with these auth settings: "answered" or "refused" (the
    token); a cluster that cannot be reached is a RuntimeFailure. In a process of its own: Ray reads its auth mode
    once per process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH_") and k != "RAY_ADDRESS"} | settings
    command = [sys.executable, "-m", "segserve.engines.ray.cluster", "ask", address]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise RuntimeFailure(f"the Ray cluster at {address} did not answer in {timeout_s:.0f} s: is its head running?") from None
    if done.returncode == 0:
        return "answered"
    if AUTH_REFUSED in done.stderr:
        return "refused"
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    raise RuntimeFailure(f"could not reach the Ray cluster at {address}: {last[:300]}")


def _ask(address: str) -> None:
    """One GCS RPC (the nodes' list), with this process's auth settings; exit 1 with Ray's error when refused."""
    from ray._raylet import GcsClient

    GcsClient(address=address).get_all_node_info(timeout=20)


if __name__ == "__main__":
    if sys.argv[1:2] == ["ask"]:
        _ask(sys.argv[2])
