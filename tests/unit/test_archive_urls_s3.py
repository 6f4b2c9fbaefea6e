"""S3 keys that become local paths (issue 58): a key that climbs out of its prefix or is absolute is refused with its
name, never written; archive downloads from S3 keep the size cap and the pin. moto's S3 in process."""

import hashlib

import boto3
import pytest
from moto import mock_aws

from segserve.archives import model_store_s3
from segserve.archives.archive_urls import DownloadRules, fetch
from segserve.archives.s3_prefix import S3Prefix
from segserve.errors import RuntimeFailure, UsageError


@pytest.fixture
def s3(monkeypatch):
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        client = boto3.client("s3")
        client.create_bucket(Bucket="models")
        yield client


@pytest.mark.parametrize("key", ["v1/../evil.mar", "v1//evil.mar"])
def test_a_model_store_key_that_climbs_or_is_absolute_is_refused_with_its_name(s3, tmp_path, key):
    s3.put_object(Bucket="models", Key="v1/a.mar", Body=b"a")
    s3.put_object(Bucket="models", Key=key, Body=b"evil")
    local = tmp_path / "deep" / "store"
    with pytest.raises(UsageError, match=rf"^--model-store s3://models/v1: key '{key}': .* is not a relative name inside its folder"):
        model_store_s3.fetch("s3://models/v1", local, log=lambda _: None)
    assert not list(tmp_path.rglob("evil.mar"))


def test_a_model_store_prefix_is_a_folder(s3, tmp_path):
    for key in ("v1/a.mar", "v10/b.mar", "v1x.mar", "v1/sub/c.mar"):
        s3.put_object(Bucket="models", Key=key, Body=key.encode())
    model_store_s3.fetch("s3://models/v1", tmp_path, log=lambda _: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.mar"]


@pytest.mark.parametrize("url", ["s3://models/a/../b", "s3://models//etc"])
def test_a_prefix_that_climbs_or_is_absolute_is_refused_with_its_name(s3, url):
    with pytest.raises(UsageError, match=rf"^--upload {url}: prefix: .* is not a relative name inside its folder"):
        S3Prefix(url, what="--upload")


def test_an_archive_from_s3_keeps_the_size_cap_and_the_pin(s3, tmp_path):
    body = b"archive bytes " * 100
    s3.put_object(Bucket="models", Key="v1/x.mar", Body=body)
    with pytest.raises(RuntimeFailure, match=r"^s3://models/v1/x\.mar: 1400 bytes or more is over the download limit of 1024 bytes"):
        fetch("s3://models/v1/x.mar", tmp_path, DownloadRules(max_download_mb=1 / 1024))
    with pytest.raises(RuntimeFailure, match=r"its sha256 is [0-9a-f]{64}, not the pinned 0{64}: refused"):
        fetch("s3://models/v1/x.mar", tmp_path, DownloadRules(sha256=(("x.mar", "0" * 64),)))
    assert list(tmp_path.iterdir()) == []
    pinned = DownloadRules(sha256=(("x.mar", hashlib.sha256(body).hexdigest()),))
    assert fetch("s3://models/v1/x.mar", tmp_path, pinned).read_bytes() == body
