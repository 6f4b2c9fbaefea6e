"""A user's archive at a URL, fetched into a local cache before TorchServe registers it: `s3://bucket/key`
(boto3: credentials, region and endpoint the usual AWS way, `AWS_ENDPOINT_URL` included) or `https://host/path`
(user:password in the URL is sent as basic auth, to that origin only, never after a redirect to another; plain
`http://` to loopback only unless the target allows it; a redirect neither from https to http nor inward:
redirect_problem). Each download is capped in size and may be pinned by its SHA-256 (DownloadRules): an archive is
code that runs in the server (docs/benchmarking.md). The cache is one folder per URL prefix under `$SEGSERVE_CACHE`
(default `~/.cache/segserve`)/archives, this user's alone (0700), so that a .war and the node archives beside it
land together. A URL that does not answer is a RuntimeFailure naming it with its credentials masked."""

import base64
import hashlib
import ipaddress
import os
import re
import socket
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
    # the scheme alone, read before any '//': urlsplit raises on a stray '[' in a password, and such a URL is remote
    return urlsplit(location.split("//", 1)[0]).scheme in REMOTE_SCHEMES


# where a URL starts in a text; its authority (user info and host) ends at the first '/', '?' or '#' (RFC 3986),
# or at a line's end (a URL does not span lines): the user info is all of it before its last '@', whatever the
# password holds (',', quotes, brackets, spaces), since urlsplit would take it so and send it
URL_START = re.compile(r"\b[a-z][a-z0-9+.-]*://", re.IGNORECASE)
AUTHORITY_END = re.compile(r"[/?#\r\n]")
LINE_END = re.compile(r"[\r\n]")
# where a URL's query ends in a text (a quote, a bracket or a comma of the YAML or repr around it); in a URL alone,
# at its fragment
TEXT_QUERY_END = re.compile(r"[#\s\"'{}\[\],]")
URL_QUERY_END = re.compile(r"#")


def masked(url: str) -> str:
    """The URL as it may be printed: no user:password, no query values (a presigned URL's signature)."""
    return _masked_urls(url, URL_QUERY_END)


def masked_text(text: str) -> str:
    """A text (a suite, an error) with every URL in it masked: what a result folder, an export or a shared study
    keeps of it. It masks too much rather than too little: an '@' after a URL without a path, on its line, hides
    what comes between."""
    return _masked_urls(text, TEXT_QUERY_END)


def _masked_urls(text: str, query_end: re.Pattern) -> str:
    pieces, done = [], 0
    for start in URL_START.finditer(text):
        begin = start.end()
        if begin < done:  # inside what the URL before it masked already
            continue
        authority_end = _found_or_end(AUTHORITY_END, text, begin)
        at = text.rfind("@", begin, authority_end)
        host_end = min(authority_end, _found_or_end(query_end, text, begin))  # where the text around it resumes
        if at < 0 and not (_valid_authority(text[begin:host_end]) and not _password_cut(text, begin, authority_end)):
            # a password's raw '/', '?' or '#' ended it
            at = text.rfind("@", authority_end, _found_or_end(LINE_END, text, authority_end))
            if at < 0:  # no host after it on its line (a quoted line cut short): the whole of it hidden
                pieces += [text[done:begin], "***"]
                done = host_end
                continue
            authority_end = _found_or_end(AUTHORITY_END, text, at)
        if at >= 0:
            pieces += [text[done:begin], "***"]
            done = at  # the '@' and the host stay
        end = _found_or_end(query_end, text, authority_end)
        question = text.find("?", authority_end, end)
        if question >= 0:
            query = "&".join(f"{key}=***" for key, _ in parse_qsl(text[question + 1 : end], keep_blank_values=True))
            pieces += [text[done : question + 1], query]
            done = end
    return "".join(pieces) + text[done:]


def _password_cut(text: str, begin: int, authority_end: int) -> bool:
    """Whether an authority `user:123` ends at a '/' whose path segment holds an '@': `u:123/ss@h` is a password
    `123/ss` cut by its raw '/' (urlsplit reads port 123), not a host and a port."""
    if ":" not in text[begin:authority_end] or not text.startswith("/", authority_end):
        return False
    segment_end = _found_or_end(re.compile(r"[/?#\s\"'{}\[\],]"), text, authority_end + 1)
    return "@" in text[authority_end + 1 : segment_end]


def _valid_authority(authority: str) -> bool:
    """Whether urlsplit reads `authority` as a host and a port that is a number: `user:pa` of `user:pa/ss@host` is
    not (nor is a raw '[' of a password)."""
    try:
        urlsplit("//" + authority).port  # noqa: B018 (raises on a port that is not a number, urlsplit on a stray '[')
    except ValueError:
        return False
    return True


def _found_or_end(pattern: re.Pattern, text: str, start: int) -> int:
    found = pattern.search(text, start)
    return found.start() if found else len(text)


def folder_of(url: str) -> str:
    """The URL's prefix: where the archives beside it are (a .war's default model store)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, str(PurePosixPath(parts.path).parent).rstrip("/") + "/", parts.query, ""))


def joined(prefix: str, name: str) -> str:
    parts = urlsplit(prefix)
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/") + "/" + name, parts.query, ""))


def cache_folder(prefix: str) -> Path:
    """The cache folder of a URL prefix, made now where missing. It and the folders above it up to the cache's root
    are this user's and no one else's (0700): what is there is code segserve runs, and another local user who could
    write there could change it."""
    root = Path(os.environ.get("SEGSERVE_CACHE") or Path.home() / ".cache" / "segserve")
    folder = root / "archives" / hashlib.sha1(prefix.encode()).hexdigest()[:16]
    for path in (root, root / "archives", folder):
        _private_folder(path)
    return folder


def _private_folder(path: Path) -> None:
    """`path` a folder of this user's only: made 0700, or an existing one of ours closed to others; one of another
    user's is a UsageError."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    if info.st_uid != os.getuid():
        raise UsageError(
            f"{path}: the archive cache belongs to user id {info.st_uid}, not to you ({os.getuid()}), who could change the "
            "archives segserve runs: set SEGSERVE_CACHE to a folder of yours"
        )
    if info.st_mode & 0o077:  # made before by a umask, or by hand
        path.chmod(0o700)


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
        raise RuntimeFailure(f"{masked(url)} does not answer: {masked_text(reason.replace(url, masked(url)))}") from None
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
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises on a port that is not a number)
    except ValueError:  # a raw '/', '?', '#' or '[' in a password: urllib would read the host wrong
        return f"{masked(url)}: its host or port does not read as one: percent-encode a password's '/', '?', '#', '[' or ']'"
    if _password_cut(url, len(parts.scheme) + 3, len(parts.scheme) + 3 + len(parts.netloc)):
        return f"{masked(url)}: its host or port does not read as one: percent-encode a password's '/', '?', '#', '[' or ']'"
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


def redirect_problem(first: str, to: str, rules: DownloadRules) -> str | None:
    """Why a download of `first` may not follow a redirect to `to`, else None: what scheme_problem refuses; https
    to plain http (the archive, which is code, would cross the network changeable); and a loopback, link-local
    (a cloud's metadata address) or private host unless `first` is of that kind too: an origin on the internet
    must not point segserve at the services that trust whoever reaches them from this machine or its network."""
    problem = scheme_problem(to, rules)
    if problem:
        return problem
    if urlsplit(first).scheme == "https" and urlsplit(to).scheme == "http":
        return f"{masked(to)}: a redirect from https to plain http is refused"
    kind, first_kind = address_kind(to), address_kind(first)
    if kind != "public" and kind != first_kind:
        return f"{masked(to)}: a redirect to a {kind} address is refused (the download began at a {first_kind} one)"
    return None


def address_kind(url: str) -> str:
    """The URL's host as seen from here: loopback, link-local, private (any other address the internet does not
    reach) or public; for a name, the most inward of the addresses it resolves to now (one that does not resolve:
    public, and its connection fails)."""
    parts = urlsplit(url)
    try:  # an address as it is written, its IPv6 zone (%eth0) aside
        return _kind(ipaddress.ip_address((parts.hostname or "").split("%")[0]))
    except ValueError:
        pass
    try:
        found = {info[4][0] for info in socket.getaddrinfo(parts.hostname, parts.port or 443, type=socket.SOCK_STREAM)}
    except (OSError, UnicodeError):
        return "public"
    kinds = {_kind(ipaddress.ip_address(address.split("%")[0])) for address in found}
    return next((kind for kind in ("loopback", "link-local", "private") if kind in kinds), "public")


def _kind(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1 is 127.0.0.1
    address = mapped or address
    if address.is_loopback or address.is_unspecified:  # 0.0.0.0 reaches this machine
        return "loopback"
    if address.is_link_local:
        return "link-local"
    return "public" if address.is_global else "private"


def _origin(url: str) -> tuple:
    parts = urlsplit(url)
    return parts.scheme, parts.hostname, parts.port or {"http": 80, "https": 443}.get(parts.scheme)


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Redirects followed within the rules and redirect_problem's; the credentials of the first URL go to its own
    origin only."""

    def __init__(self, first: str, rules: DownloadRules):
        self.first, self.rules = first, rules

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        problem = redirect_problem(self.first, newurl, self.rules)
        if problem:
            raise RuntimeFailure(f"{masked(req.full_url)} redirected to {problem}")
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
    opener = urllib.request.build_opener(_Redirects(url, rules))
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
