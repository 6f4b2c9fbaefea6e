"""Downloads of a user's archive (issue 58): https, or http to loopback only; credentials to their own origin only,
never after a redirect to another; a size cap; an optional SHA-256 pin. Against servers on loopback (https with a
certificate made here, trusted through SSL_CERT_FILE)."""

import base64
import datetime
import hashlib
import http.server
import ipaddress
import os
import ssl
import stat
import threading

import pytest

from segserve.archives.archive_urls import DownloadRules, cache_folder, fetch, redirect_problem
from segserve.errors import RuntimeFailure, UsageError

ARCHIVE = b"PK\x03\x04 a user's archive " * 256  # 6 KB


class Origin(http.server.BaseHTTPRequestHandler):
    """/x.mar: the archive (Content-Length given); /unsized.mar: the same without a length; /to/<url>: a redirect there.
    Each request's path and Authorization header are kept in `seen`."""

    seen: list

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.seen.append((self.path, self.headers.get("Authorization")))
        if self.path.startswith("/to/"):
            self.send_response(302)
            self.send_header("Location", self.path[len("/to/") :])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        if self.path != "/unsized.mar":
            self.send_header("Content-Length", str(len(ARCHIVE)))
        self.end_headers()
        self.wfile.write(ARCHIVE)
        self.close_connection = True

    def log_message(self, *args):
        pass


@pytest.fixture
def origin():
    """Start a loopback server; yields a function that starts one more (its base URL, its `seen` list)."""
    servers = []

    def start(tls: ssl.SSLContext | None = None) -> tuple[str, list]:
        seen: list = []
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (Origin,), {"seen": seen}))
        if tls is not None:
            server.socket = tls.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()  # a quick shutdown
        servers.append(server)
        return f"{'https' if tls else 'http'}://127.0.0.1:{server.server_address[1]}", seen

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_plain_http_is_refused_beyond_loopback_before_anything_is_sent(tmp_path):
    with pytest.raises(RuntimeFailure, match=r"^http://\*\*\*@example\.com/x\.mar: plain http goes to loopback only"):
        fetch("http://user:secret@example.com/x.mar", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_credentials_go_to_their_own_origin_and_never_after_a_redirect_to_another(origin, tmp_path):
    first, seen_first = origin()
    other, seen_other = origin()  # another port: another origin
    auth = "Basic " + base64.b64encode(b"user:secret").decode()
    user = first.replace("http://", "http://user:secret@")
    assert fetch(f"{user}/to/{first}/x.mar", tmp_path / "same").read_bytes() == ARCHIVE
    assert seen_first == [(f"/to/{first}/x.mar", auth), ("/x.mar", auth)]  # the same origin: asked again with them
    assert fetch(f"{user}/to/{other}/x.mar", tmp_path / "other").read_bytes() == ARCHIVE
    assert seen_other == [("/x.mar", None)]


def test_a_redirect_to_plain_http_beyond_loopback_is_refused(origin, tmp_path):
    first, _ = origin()
    with pytest.raises(RuntimeFailure, match=r"redirected to http://example\.com/x\.mar: plain http goes to loopback only"):
        fetch(f"{first}/to/http://example.com/x.mar", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_an_https_download_redirected_to_plain_http_on_loopback_is_refused_before_anything_is_asked(origin, tmp_path, monkeypatch):
    ca_file, server_tls = certificates(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
    secure, _ = origin(server_tls)
    plain, seen_plain = origin()
    with pytest.raises(RuntimeFailure, match=rf"redirected to {plain}/x\.mar: a redirect from https to plain http is refused$"):
        fetch(f"{secure}/to/{plain}/x.mar", tmp_path / "cache")
    assert seen_plain == [] and list((tmp_path / "cache").iterdir()) == []


PUBLIC = "https://93.184.216.34/x.mar"  # an address on the internet, written as one: nothing to resolve


@pytest.mark.parametrize(
    ("first", "to", "says"),
    [
        (PUBLIC, "http://93.184.216.35/x.mar", "a redirect from https to plain http"),  # with plain_http: true too
        (PUBLIC, "https://127.0.0.1:8081/models", "a redirect to a loopback address is refused (the download began at a public one)"),
        (PUBLIC, "https://localhost:8081/models", "a redirect to a loopback address"),
        (PUBLIC, "https://[::ffff:127.0.0.1]:8081/x.mar", "a redirect to a loopback address"),
        (PUBLIC, "https://0.0.0.0:8081/x.mar", "a redirect to a loopback address"),
        (PUBLIC, "https://169.254.169.254/latest/meta-data/", "a redirect to a link-local address"),  # a cloud's metadata
        (PUBLIC, "https://10.0.0.7/x.mar", "a redirect to a private address"),
        (
            "https://10.0.0.7/x.mar",
            "https://127.0.0.1/x.mar",
            "a redirect to a loopback address is refused (the download began at a private one)",
        ),
        (PUBLIC, "https://93.184.216.35/x.mar", None),
        ("https://10.0.0.7/x.mar", "https://10.0.0.8/x.mar", None),  # an archive store inside: its redirects stay inside
        ("http://127.0.0.1:1/x.mar", "http://localhost:2/x.mar", None),
    ],
)
def test_a_redirect_may_not_downgrade_nor_reach_inward_from_where_the_download_began(first, to, says):
    problem = redirect_problem(first, to, DownloadRules(plain_http=True))
    assert problem is None if says is None else says in (problem or ""), problem


def test_the_cache_is_made_for_this_user_alone_and_one_of_another_user_is_refused(origin, tmp_path, monkeypatch):
    base, _ = origin()
    root = tmp_path / "cache"
    monkeypatch.setenv("SEGSERVE_CACHE", str(root))
    root.mkdir()
    root.chmod(0o755)  # as a usual umask left it
    fetched = fetch(f"{base}/x.mar", cache_folder(f"{base}/"))
    for path in (root, root / "archives", fetched.parent):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    monkeypatch.setattr(os, "getuid", lambda: os.stat(root).st_uid + 1)
    with pytest.raises(UsageError, match=rf"^{root}: the archive cache belongs to user id \d+, not to you \(\d+\)"):
        cache_folder("https://h.example/v1/")


@pytest.mark.parametrize("path", ["/x.mar", "/unsized.mar"])
def test_a_body_over_the_size_cap_is_refused_and_leaves_no_file(origin, tmp_path, path):
    base, _ = origin()
    rules = DownloadRules(max_download_mb=4096 / 2**20)  # 4 KB
    with pytest.raises(
        RuntimeFailure,
        match=r"bytes or more is over the download limit of 4096 bytes \(`max_download_mb: 0\.00390625` in the archive target\)",
    ):
        fetch(base + path, tmp_path, rules)
    assert list(tmp_path.iterdir()) == []
    assert fetch(base + path, tmp_path, DownloadRules(max_download_mb=1)).read_bytes() == ARCHIVE


def test_a_pinned_archive_with_other_bytes_is_refused(origin, tmp_path):
    base, _ = origin()
    right = hashlib.sha256(ARCHIVE).hexdigest()
    assert fetch(f"{base}/x.mar", tmp_path, DownloadRules(sha256=(("x.mar", right),))).read_bytes() == ARCHIVE
    wrong = "0" * 64
    with pytest.raises(RuntimeFailure, match=rf"/x\.mar: its sha256 is {right}, not the pinned {wrong}: refused"):
        fetch(f"{base}/x.mar", tmp_path, DownloadRules(sha256=(("x.mar", wrong),)))
    assert list(tmp_path.iterdir()) == []  # nor is the copy fetched before kept


def test_https_with_a_ca_bundle_from_ssl_cert_file(origin, tmp_path, monkeypatch):
    ca_file, server_tls = certificates(tmp_path)
    base, seen = origin(server_tls)
    with pytest.raises(RuntimeFailure, match="CERTIFICATE_VERIFY_FAILED"):  # not trusted: refused
        fetch(f"{base}/x.mar", tmp_path / "untrusted")
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
    assert fetch(f"{base}/x.mar", tmp_path / "trusted").read_bytes() == ARCHIVE


@pytest.mark.parametrize("url", ["s3://bucket/a/../x.mar", "s3://bucket//etc/x.mar"])
def test_an_s3_key_that_climbs_or_is_absolute_is_refused_with_its_name(tmp_path, url):
    with pytest.raises(UsageError, match=r"^s3://bucket/.*x\.mar: key: .* is not a relative name inside its folder"):
        fetch(url, tmp_path)


def certificates(folder):
    """(a CA's certificate file, a server context with a certificate for 127.0.0.1 that the CA signed)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def name(text):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])

    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())

    def signed(subject, public_key, extensions):
        builder = x509.CertificateBuilder().subject_name(name(subject)).issuer_name(name("test CA")).public_key(public_key)
        builder = (
            builder.serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(now + datetime.timedelta(hours=1))
        )
        for extension, critical in extensions:
            builder = builder.add_extension(extension, critical)
        return builder.sign(ca_key, hashes.SHA256())

    ca = signed("test CA", ca_key.public_key(), [(x509.BasicConstraints(ca=True, path_length=None), True)])
    leaf = signed(
        "127.0.0.1", key.public_key(), [(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)]
    )
    ca_file, cert_file, key_file = folder / "ca.pem", folder / "server.pem", folder / "server.key"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_file.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert_file, key_file)
    return ca_file, tls
