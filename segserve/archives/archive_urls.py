"""A user's archive at a URL, fetched into a local cache before TorchServe registers it: `s3://bucket/key`
(boto3: credentials, region and endpoint the usual AWS way, `AWS_ENDPOINT_URL` included) or `https://host/path`
(user:password in the URL is sent as basic auth, to that origin only, never after a redirect to another; plain
`http://` to loopback only unless the target allows it). Each download is capped in size and may be pinned by its
SHA-256 (DownloadRules): an archive is code that runs in the server (docs/benchmarking.md). The cache is one folder
per URL prefix under `$SEGSERVE_CACHE` (default `~/.cache/segserve`)/archives, so that a .war and the node archives
beside it land together. A URL that does not answer is a RuntimeFailure naming it with its credentials masked."""

import base64
import hashlib
import ipaddress
import os
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from segserve.errors import RuntimeFailure, UsageError

REMOTE_SCHEMES = ("s3", "http", "https")
FETCH_TIMEOUT_S = 60
CHUNK_BYTES = 2**20
# The largest archive downloaded unless an archive target says otherwise (`max_download_mb`): a body without end
# must not fill the disk. Models served by TorchServe on a CPU are rarely over a few hundred MB.
MAX_DOWNLOAD_MB = 2048


@dataclass(frozen=True)
class DownloadRules:
    """What a download of a user's archive may do (its archive target's keys, bench/suite/target_spec.py)."""

    max_download_mb: float = MAX_DOWNLOAD_MB
    plain_http: bool = False  # http:// beyond loopback
    sha256: tuple[tuple[str, str], ...] = ()  # (an archive's file name, the SHA-256 its bytes must have)

    @property
    def max_bytes(self) -> int:
        return int(self.max_download_mb * 2**20)

    def pin(self, name: str) -> str | None:
        return dict(self.sha256).get(name)


def safe_relative_name(name: str, what: str) -> str:
    """`name` when it stays inside the folder it is joined to; a UsageError naming `what` when it is absolute or
    climbs out with `..` (a .war node's url, an S3 key, an archive name: names that become paths)."""
    if not name or name.startswith("/") or ".." in PurePosixPath(name).parts:
        raise UsageError(f"{what}: {name!r} is not a relative name inside its folder (no absolute path, no '..')")
    return name


def is_remote(location: str) -> bool:
    return urlsplit(location).scheme in REMOTE_SCHEMES


def masked(url: str) -> str:
    """The URL as it may be printed: no user:password, no query values (a presigned URL's signature)."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    netloc = f"***@{host}" if "@" in parts.netloc else host
    query = "&".join(f"{key}=***" for key, _ in parse_qsl(parts.query, keep_blank_values=True))
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


URL = re.compile(r"\b(?:s3|https?)://[^\s\"'{}\[\],]+")


def masked_text(text: str) -> str:
    """A suite's text with every URL in it masked: what a result folder or a shared study keeps of it."""
    return URL.sub(lambda found: masked(found.group(0)), text)


def folder_of(url: str) -> str:
    """The URL's prefix: where the archives beside it are (a .war's default model store)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, str(PurePosixPath(parts.path).parent).rstrip("/") + "/", parts.query, ""))


def joined(prefix: str, name: str) -> str:
    parts = urlsplit(prefix)
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/") + "/" + name, parts.query, ""))


def cache_folder(prefix: str) -> Path:
    root = Path(os.environ.get("SEGSERVE_CACHE") or Path.home() / ".cache" / "segserve")
    return root / "archives" / hashlib.sha1(prefix.encode()).hexdigest()[:16]


def md5_hex(body: bytes) -> str:
    return hashlib.md5(body).hexdigest()  # noqa: S324 (S3's ETag of a single-part upload, not security)


def file_name(url: str) -> str:
    return safe_relative_name(PurePosixPath(urlsplit(url).path).name, masked(url))


def local_path(url: str, folder: Path) -> Path:
    return folder / file_name(url)


def fetch(url: str, folder: Path, rules: DownloadRules = DownloadRules()) -> Path:
    """The file at `url` in `folder`, downloaded now (an S3 object whose bytes are there already is kept), within
    `rules`: a larger body, other bytes than its pin or a scheme it forbids is a RuntimeFailure. A failed fetch
    leaves no file."""
    target = local_path(url, folder)
    folder.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".part")
    try:
        downloaded = _s3_object(url, target, partial, rules) if urlsplit(url).scheme == "s3" else _http_body(url, partial, rules)
        _check_pin(url, partial if downloaded else target, rules)
    except (RuntimeFailure, UsageError):
        _remove(partial, target)
        raise
    except Exception as error:  # whatever the transport says, as one line naming the URL without its secrets
        _remove(partial, target)
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise RuntimeFailure(f"{masked(url)} does not answer: {reason.replace(url, masked(url))}") from None
    if downloaded:
        partial.replace(target)  # a reader never sees half an archive, nor one that failed its checks
    return target


def _remove(*paths: Path) -> None:
    """A fetch that failed leaves nothing: no half body, and no older copy measured in place of the one refused."""
    for path in paths:
        path.unlink(missing_ok=True)


def scheme_problem(url: str, rules: DownloadRules) -> str | None:
    """Why `url` may not be fetched, else None: https, s3, or http to loopback (or anywhere with rules.plain_http),
    since a plain http download crosses the network readable and changeable, credentials and code alike."""
    parts = urlsplit(url)
    if parts.scheme == "http" and not rules.plain_http and not is_loopback(parts.hostname or ""):
        return f"{masked(url)}: plain http goes to loopback only: use https:// (or `plain_http: true` in the archive target)"
    if parts.scheme not in REMOTE_SCHEMES:
        return f"{masked(url)}: give an https://, http:// (loopback) or s3:// URL"
    return None


def check_scheme(url: str, rules: DownloadRules, what: str = "") -> None:
    problem = scheme_problem(url, rules)
    if problem:
        raise RuntimeFailure(what + problem)


def is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _origin(url: str) -> tuple:
    parts = urlsplit(url)
    return parts.scheme, parts.hostname, parts.port or {"http": 80, "https": 443}.get(parts.scheme)


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Redirects followed within the rules; the credentials of the first URL go to its own origin only."""

    def __init__(self, rules: DownloadRules):
        self.rules = rules

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        check_scheme(newurl, self.rules, f"{masked(req.full_url)} redirected to ")
        redirected = super().redirect_request(req, fp, code, msg, headers, newurl)
        if redirected is not None and _origin(newurl) != _origin(req.full_url):
            redirected.remove_header("Authorization")
        return redirected


def _http_body(url: str, partial: Path, rules: DownloadRules) -> bool:
    """The body of `url` written to `partial`, at most rules.max_bytes of it (CA certificates: the system's, or the
    bundle named by SSL_CERT_FILE)."""
    check_scheme(url, rules)
    parts = urlsplit(url)
    plain = urlunsplit((parts.scheme, parts.netloc.rsplit("@", 1)[-1], parts.path, parts.query, ""))
    request = urllib.request.Request(plain)
    if parts.username:
        secret = f"{parts.username}:{parts.password or ''}".encode()
        request.add_header("Authorization", "Basic " + base64.b64encode(secret).decode())
    opener = urllib.request.build_opener(_Redirects(rules))
    try:
        with opener.open(request, timeout=FETCH_TIMEOUT_S) as response:
            _check_size(url, int(response.headers.get("Content-Length") or 0), rules)
            _write_capped(url, iter(lambda: response.read(CHUNK_BYTES), b""), partial, rules)
    except urllib.error.HTTPError as error:
        raise RuntimeFailure(f"{masked(url)} answered HTTP {error.code} {error.reason}") from None
    return True


def _check_size(url: str, size_bytes: int, rules: DownloadRules) -> None:
    if size_bytes > rules.max_bytes:
        raise RuntimeFailure(
            f"{masked(url)}: {size_bytes} bytes or more is over the download limit of {rules.max_bytes} bytes "
            f"(`max_download_mb: {rules.max_download_mb:g}` in the archive target)"
        )


def _write_capped(url: str, chunks, partial: Path, rules: DownloadRules) -> None:
    """The chunks into `partial`, refused as soon as they pass the limit (a body need not say its length)."""
    written = 0
    with open(partial, "wb") as out:
        for chunk in chunks:
            written += len(chunk)
            _check_size(url, written, rules)
            out.write(chunk)


def _check_pin(url: str, path: Path, rules: DownloadRules) -> None:
    """Nothing when the file has the SHA-256 pinned for its name (or none is); else a RuntimeFailure."""
    pinned = rules.pin(file_name(url))
    if pinned is None:
        return
    digest = hashlib.sha256()
    with open(path, "rb") as body:
        for chunk in iter(lambda: body.read(CHUNK_BYTES), b""):
            digest.update(chunk)
    if digest.hexdigest() != pinned:
        raise RuntimeFailure(f"{masked(url)}: its sha256 is {digest.hexdigest()}, not the pinned {pinned}: refused")


def _s3_object(url: str, target: Path, partial: Path, rules: DownloadRules) -> bool:
    """The object written to `partial` (True), or False when `target` has its bytes already (its MD5 is the
    object's ETag)."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError

    parts = urlsplit(url)
    # the key as written after the bucket: `s3://bucket//etc/x.mar` is not quietly another object
    bucket, key = parts.netloc, safe_relative_name(parts.path[1:], f"{masked(url)}: key")
    client = boto3.client("s3", config=Config(retries={"mode": "standard"}, connect_timeout=10, read_timeout=FETCH_TIMEOUT_S))
    try:
        head = client.head_object(Bucket=bucket, Key=key)
        _check_size(url, head.get("ContentLength", 0), rules)
        if target.is_file() and md5_hex(target.read_bytes()) == head["ETag"].strip('"'):
            return False
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        _write_capped(url, body.iter_chunks(CHUNK_BYTES), partial, rules)
        return True
    except ClientError as error:
        info = error.response.get("Error", {})
        raise RuntimeFailure(f"{masked(url)}: {info.get('Code', '?')}: {info.get('Message') or 'refused'}") from None
