"""A suite's `targets:` besides the catalog's names: an http endpoint, a peer server's command, a user's .mar/.war;
each entry is told apart by its keys (TargetEntry), so a wrong one gets only its own kind's errors."""

import re
from pathlib import PurePosixPath
from typing import Annotated, Literal, Union
from urllib.parse import urlsplit

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from segserve.archives.archive_urls import MAX_DOWNLOAD_MB, DownloadRules, file_name, is_loopback, is_remote, scheme_problem
from segserve.bench.suite.input_spec import InputSpec
from segserve.bench.suite.params import PARAMS
from segserve.bench.suite.strict_model import Strict


class HttpTarget(Strict):
    """An endpoint segserve did not deploy: only load parameters apply. ${VAR} in headers: the environment's."""

    name: Annotated[str, Field(pattern=r"^[\w.-]+$")]
    """The target's name in the results (not a catalog target's)"""
    url: str
    """Plain http:// on loopback, with the path requests are sent to"""
    headers: dict[str, str] = {}
    """Sent with every request; ${VAR} is taken from the environment"""

    @field_validator("url")
    @classmethod
    def loopback_http(cls, url: str) -> str:
        parts = urlsplit(url)
        try:
            parts.port  # noqa: B018 (raises on a port that is not a number)
        except ValueError:
            raise ValueError(f"{url!r}: the port is not a number") from None
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"{url!r}: the load generator speaks plain HTTP: give a URL like http://127.0.0.1:8080/predictions/x")
        if not is_loopback(parts.hostname):
            raise ValueError(f"{url!r}: the load generator sends to loopback only (127.0.0.1, ::1, localhost)")
        return url


PEER_PROTOCOLS = ("plain", "kserve-v2-binary")
PLACEHOLDER = re.compile(r"\{(\w+)\}")
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"  # a variable worker_env names (segserve fuse --worker-env too)


class CommandTarget(Strict):
    """A server segserve does not deploy but starts: for each point its command runs in a process group of its own,
    is measured once its health path answers 200, and is stopped by its group (a peer server: benchmarks/peers/)."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z][\w-]*$")]
    """The target's name in the results"""
    command: Annotated[list[str], Field(min_length=1)]
    """The command, run from the working directory; `{port}` is a free loopback port, `{<param>}` a value of params"""
    path: str = "/predict"
    """Where requests are POSTed"""
    health: str = "/health"
    """Answers GET with 200 once the server is ready"""
    params: dict[Annotated[str, Field(pattern=r"^[a-z]\w*$")], Annotated[list[str | int | float | bool], Field(min_length=1)]] = {}
    """The server's own knobs, as it names them: every combination is a point, and a change starts the command again"""
    protocol: Literal["plain", "kserve-v2-binary"] = "plain"
    """plain: the input is the body; kserve-v2-binary: a KServe v2 / Triton request with the input as one BYTES
    element of tensor `v2_input` in the binary extension (the JSON header padded to a fixed length)"""
    v2_input: str = "image"
    """kserve-v2-binary: the input tensor's name"""
    v2_output: str = "jpeg"
    """kserve-v2-binary: the output tensor's name"""
    env: dict[str, str] = {}
    """Added to the command's environment"""
    packages: list[str] = []
    """Python packages whose versions go into every record, read by the command's interpreter (command[0])"""
    start_timeout_s: Annotated[float, Field(gt=0)] = 180.0
    """How long the health path may take to answer 200"""

    @field_validator("path", "health")
    @classmethod
    def absolute_path(cls, path: str) -> str:
        if not path.startswith("/"):
            raise ValueError(f"{path!r}: a path starts with '/'")
        return path

    @model_validator(mode="after")
    def placeholders_known(self) -> "CommandTarget":
        taken = [name for name in self.params if name in PARAMS or name == "port"]
        if taken:
            raise ValueError(f"params: {', '.join(taken)} is a segserve name: use the server's own name for its knob")
        known = {"port", *self.params}
        unknown_names = [name for part in self.command for name in PLACEHOLDER.findall(part) if name not in known]
        if unknown_names:
            raise ValueError(f"command: {{{unknown_names[0]}}} is neither {{port}} nor one of params ({', '.join(self.params) or 'none'})")
        if not any("{port}" in part for part in self.command):
            raise ValueError("command: give the server its port as {port}")
        return self

    def argv(self, port: int, values: dict) -> list[str]:
        """The command with {port} and the point's values in place."""
        given = {"port": port, **values}
        return [PLACEHOLDER.sub(lambda m: str(given[m.group(1)]), part) for part in self.command]


class ArchiveTarget(Strict):
    """A .mar or .war segserve did not build, registered with TorchServe as it is (the file is never changed)."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z][\w-]*$")]
    """The model or workflow name it is registered under, and its name in the results"""
    archive: str
    """The .mar or .war: a path (relative to the working directory), `s3://bucket/key` or `http(s)://host/path`
    (fetched into a local cache; the usual AWS credentials, user:password in an http URL)"""
    model_store: str | None = None
    """The folder or URL prefix holding the .mar files a .war's nodes name (default: the .war's folder)"""
    inputs: Annotated[list[InputSpec], Field(min_length=1)] | None = None
    """What this target is sent, round-robin (default: the suite's inputs)"""
    members: bool = False
    """A .war: measure each model node's .mar alone too, as target `<name>-<node>`, sent what the workflow sends it:
    the start node this target's inputs, every other node what the DAG makes of them (model nodes' answers captured
    through a registration of each, function nodes run from the .war's own function file in a process of their own, a
    join one form field per parent): the efficiency table's bounds, and the auto search's probes"""
    install_requirements: bool = False
    """Install the requirements file the archive brings (torch-model-archiver --requirements-file; a .war's node
    .mar files' own) as TorchServe does with install_py_dep_per_model=true: `pip install -U -t` into the folder
    TorchServe extracts the archive to, which its workers have on their PYTHONPATH. segserve's environment is not
    changed. It runs the archive's own dependency list, from its package index: only for archives you trust. Its
    points get a TorchServe of their own. Unset: a worker that lacks a module the file lists fails its point,
    which says so"""

    sha256: dict[str, Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]] = {}
    """Pins of archives fetched from a URL: file name (the archive's own, a .war's node .mar) → the SHA-256 its bytes
    must have (`sha256sum`); a download with other bytes is refused"""
    max_download_mb: Annotated[float, Field(gt=0)] = MAX_DOWNLOAD_MB
    """The largest archive downloaded from a URL; a larger one is refused"""
    plain_http: bool = False
    """Allow http:// URLs to hosts beyond loopback (the archive, which is code, and its credentials cross the network
    readable and changeable)"""
    worker_env: list[Annotated[str, Field(pattern=ENV_NAME)]] = []
    """Names of variables of segserve's environment this archive's workers get besides what TorchServe needs
    (docs/benchmarking.md): say AWS_PROFILE for a handler that reads S3; credentials reach them only so. The archive
    targets of a suite share their servers: each one's workers get the names any of them lists"""

    @field_validator("archive")
    @classmethod
    def archive_file(cls, archive: str) -> str:
        if _archive_suffix(archive) not in (".mar", ".war", None):
            raise ValueError(f"{archive!r}: give a .mar or .war file")
        return archive

    @model_validator(mode="after")
    def downloads(self) -> "ArchiveTarget":
        for key, location in (("archive", self.archive), ("model_store", self.model_store)):
            problem = is_remote(location or "") and scheme_problem(location, self.download_rules())
            if problem:
                raise ValueError(f"{key}: {problem}")
        if self.sha256 and not (is_remote(self.archive) or is_remote(self.model_store or "")):
            raise ValueError("sha256: pins the archives fetched from a URL, and this target's archive and model_store are local")
        pinned_elsewhere = sorted(name for name in self.sha256 if _archive_suffix(name) not in (".mar", ".war") or "/" in name)
        if pinned_elsewhere:
            raise ValueError(f"sha256: {pinned_elsewhere[0]!r}: give an archive's file name, like {file_name(self.archive)!r}")
        return self

    def download_rules(self) -> DownloadRules:
        return DownloadRules(self.max_download_mb, self.plain_http, tuple(sorted(self.sha256.items())))

    @model_validator(mode="after")
    def members_of_a_workflow(self) -> "ArchiveTarget":
        if self.members and _archive_suffix(self.archive) != ".war":
            raise ValueError(f"members: only a .war has members (got {self.archive!r})")
        return self


def _archive_suffix(archive: str) -> str | None:
    """.mar or .war, of a path or of a URL's path (a presigned URL's query after it); None for a URL whose host
    urllib does not read (a password's raw '['): the download keys' check says why."""
    try:
        return PurePosixPath(urlsplit(archive).path).suffix
    except ValueError:
        return None


def _target_kind(value) -> str:
    """Which kind of target a `targets:` entry is, so that a wrong one gets only that kind's errors."""
    if isinstance(value, HttpTarget | ArchiveTarget | CommandTarget):
        return type(value).__name__
    if isinstance(value, dict):
        return "ArchiveTarget" if "archive" in value else "CommandTarget" if "command" in value else "HttpTarget"
    return "str"


TARGET_KINDS = ("str", "HttpTarget", "ArchiveTarget", "CommandTarget")
TargetEntry = Annotated[
    Union[  # noqa: UP007 (tags)
        Annotated[str, Tag("str")],
        Annotated[HttpTarget, Tag("HttpTarget")],
        Annotated[ArchiveTarget, Tag("ArchiveTarget")],
        Annotated[CommandTarget, Tag("CommandTarget")],
    ],
    Discriminator(_target_kind),
]
