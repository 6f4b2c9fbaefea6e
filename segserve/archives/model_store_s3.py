"""Archives in S3: `segserve build --upload s3://bucket/prefix` sends the model store's .mar/.war files (only
those whose bytes S3 does not have), and `segserve serve --model-store s3://bucket/prefix` brings them into a
local model store first (`<run dir>/model_store`), each download verified against S3's checksum and done again
only when the archive in S3 changed."""

from pathlib import Path

from segserve.archives.archive_urls import md5_hex
from segserve.archives.s3_prefix import S3Prefix
from segserve.errors import UsageError

ARCHIVE_SUFFIXES = (".mar", ".war")


def upload(model_store: Path, url: str, endpoint_url: str | None = None, log=print) -> None:
    store = S3Prefix(url, endpoint_url, "--upload")
    store.check()
    remote = store.etags()
    archives = sorted(p for p in model_store.iterdir() if p.suffix in ARCHIVE_SUFFIXES)
    if not archives:
        raise UsageError(f"{model_store}: no .mar/.war archives to upload (run `segserve build` first)")
    sent = [p.name for p in archives if store.put_if_changed(store.key(p.name), p.read_bytes(), "application/zip", remote)]
    log(f"uploaded to {url}: {len(sent)} archive(s) sent, {len(archives) - len(sent)} unchanged")


def fetch(url: str, local: Path, endpoint_url: str | None = None, log=print) -> Path:
    """The archives under the prefix in `local` (downloaded where missing or changed); returns `local`."""
    store = S3Prefix(url, endpoint_url, "--model-store")
    store.check()
    local.mkdir(parents=True, exist_ok=True)
    # each key's name below the prefix is checked (store.relative) before it becomes a path in `local`
    listed = {store.relative(key): etag for key, etag in store.etags().items() if key.endswith(ARCHIVE_SUFFIXES)}
    archives = {name: etag for name, etag in listed.items() if "/" not in name}  # the prefix's own, not a sub-folder's
    if not archives:
        raise UsageError(f"--model-store {url}: no .mar/.war archives there (`segserve build --upload {url}` puts them there)")
    fetched = 0
    for name, etag in sorted(archives.items()):
        target = local / name
        if target.is_file() and md5_hex(target.read_bytes()) == etag:
            continue
        store.get_verified(store.key(name), etag, target)
        fetched += 1
    log(f"model store {url}: {fetched} archive(s) downloaded, {len(archives) - fetched} unchanged, in {local}")
    return local
