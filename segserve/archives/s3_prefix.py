"""One S3 prefix (`s3://bucket/prefix`) through boto3: checked, listed with each object's MD5, written only where
the local bytes differ, read back verified. Credentials and region come the usual AWS way (environment,
profile); `endpoint_url` points it at another S3 endpoint. Results (`--export`) and archives (`build --upload`,
`serve --model-store s3://`) both use it."""

from pathlib import Path
from urllib.parse import urlsplit

from segserve.archives.archive_urls import md5_hex, safe_relative_name
from segserve.errors import UsageError


def aws_call(naming: str, action):
    """An AWS call whose failure is one `error:` line starting with `naming` (no credentials, no bucket, a
    wrong endpoint, a refused namespace)."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return action()
    except ClientError as error:
        info = error.response.get("Error", {})
        raise UsageError(f"{naming}: {info.get('Code', '?')}: {info.get('Message') or 'refused'}") from None
    except BotoCoreError as error:
        raise UsageError(f"{naming}: {error}") from None


class S3Prefix:
    def __init__(self, url: str, endpoint_url: str | None = None, what: str = "--export"):
        import boto3
        from botocore.config import Config

        parts = urlsplit(url)
        self.url, self.what, self.bucket, self.prefix = url, what, parts.netloc, parts.path[1:].rstrip("/")
        if parts.scheme != "s3" or not self.bucket:
            raise UsageError(f"{what} {url}: give s3://bucket/prefix")
        if self.prefix:  # as written: `s3://bucket//x` or `s3://bucket/a/../b` is not quietly another prefix
            safe_relative_name(self.prefix, f"{what} {url}: prefix")
        self.client = boto3.client("s3", endpoint_url=endpoint_url, config=Config(retries={"mode": "standard"}))

    def call(self, action):
        return aws_call(f"{self.what} {self.url}", action)

    def check(self) -> None:
        self.call(lambda: self.client.head_bucket(Bucket=self.bucket))

    def key(self, relative: str) -> str:
        return f"{self.prefix}/{relative}" if self.prefix else relative

    def relative(self, key: str) -> str:
        """A listed key's name below the prefix, checked before it becomes a local path: a key that climbs out
        (`prefix/../x.mar`) or is absolute (`prefix//x.mar`) is refused with its name."""
        return safe_relative_name(key[len(self.prefix) + 1 :] if self.prefix else key, f"{self.what} {self.url}: key {key!r}")

    def etags(self) -> dict[str, str]:
        """Key → MD5 (ETag) of every object under the prefix."""

        def listed() -> dict[str, str]:
            # the prefix as a folder: `v1` lists v1/a.mar, not v10/a.mar or v1x.mar
            folder = self.prefix + "/" if self.prefix else ""
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=folder)
            return {item["Key"]: item["ETag"].strip('"') for page in pages for item in page.get("Contents", [])}

        return self.call(listed)

    def put_if_changed(self, key: str, body: bytes, content_type: str, remote: dict[str, str]) -> bool:
        """Send unless the object there has these bytes already; True when sent."""
        if remote.get(key) == md5_hex(body):
            return False
        self.call(lambda: self.client.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType=content_type))
        return True

    def get_verified(self, key: str, etag: str, target: Path) -> None:
        """Download to target through a temporary file, refusing bytes whose MD5 is not the object's ETag."""
        body = self.call(lambda: self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read())
        if md5_hex(body) != etag:
            raise UsageError(f"{self.what} {self.url}: {key} arrived with another checksum than S3's ({etag}): not used")
        partial = target.with_name(target.name + ".part")
        partial.write_bytes(body)
        partial.replace(target)  # a reader never sees half an archive
