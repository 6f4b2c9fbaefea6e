"""A user's archive at a URL, fetched into a local cache before TorchServe registers it: `s3://bucket/key`
(boto3: credentials, region and endpoint the usual AWS way, `AWS_ENDPOINT_URL` included) or `http(s)://host/path`
(user:password in the URL is sent as basic auth). The cache is one folder per URL prefix under
`$SEGSERVE_CACHE` (default `~/.cache/segserve`)/archives, so that a .war and the node archives beside it land
together. A URL that does not answer is a RuntimeFailure naming it with its credentials masked."""

import base64
import hashlib
import os
import re
import urllib.error
import urllib.request
from pathlib import Path, PurePosixPath
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from segserve.archives.s3_prefix import md5_hex
from segserve.errors import RuntimeFailure, UsageError

REMOTE_SCHEMES = ("s3", "http", "https")
FETCH_TIMEOUT_S = 60


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


def local_path(url: str, folder: Path) -> Path:
    return folder / PurePosixPath(urlsplit(url).path).name


def fetch(url: str, folder: Path) -> Path:
    """The file at `url` in `folder`, downloaded now (an S3 object whose bytes are there already is kept)."""
    target = local_path(url, folder)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        body = _s3_object(url, target) if urlsplit(url).scheme == "s3" else _http_body(url)
    except RuntimeFailure:
        raise
    except Exception as error:  # whatever the transport says, as one line naming the URL without its secrets
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise RuntimeFailure(f"{masked(url)} does not answer: {reason.replace(url, masked(url))}") from None
    if body is not None:
        partial = target.with_name(target.name + ".part")
        partial.write_bytes(body)
        partial.replace(target)  # a reader never sees half an archive
    return target


def _http_body(url: str) -> bytes:
    parts = urlsplit(url)
    plain = urlunsplit((parts.scheme, parts.netloc.rsplit("@", 1)[-1], parts.path, parts.query, ""))
    request = urllib.request.Request(plain)
    if parts.username:
        secret = f"{parts.username}:{parts.password or ''}".encode()
        request.add_header("Authorization", "Basic " + base64.b64encode(secret).decode())
    try:
        with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT_S) as response:
            return response.read()
    except urllib.error.HTTPError as error:
        raise RuntimeFailure(f"{masked(url)} answered HTTP {error.code} {error.reason}") from None


def _s3_object(url: str, target: Path) -> bytes | None:
    """The object's bytes, or None when `target` has them already (its MD5 is the object's ETag)."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError

    parts = urlsplit(url)
    bucket, key = parts.netloc, parts.path.lstrip("/")
    client = boto3.client("s3", config=Config(retries={"mode": "standard"}, connect_timeout=10, read_timeout=FETCH_TIMEOUT_S))
    try:
        etag = client.head_object(Bucket=bucket, Key=key)["ETag"].strip('"')
        if target.is_file() and md5_hex(target.read_bytes()) == etag:
            return None
        return client.get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as error:
        info = error.response.get("Error", {})
        raise RuntimeFailure(f"{masked(url)}: {info.get('Code', '?')}: {info.get('Message') or 'refused'}") from None
