"""Archives in S3 (moto's server on loopback): `build --upload` sends only what changed, `serve --model-store
s3://…` downloads into the run dir's store, verified, again only when an archive changed, and serves from it."""

import boto3

from segserve.archives.model_store_s3 import fetch, upload
from segserve.cli import main
from segserve.serving.http import Connection
from segserve.serving.ts_config import free_port_base
from tests.integration.test_export import aws  # noqa: F401 (the fixture)


def test_upload_and_fetch_send_and_download_only_what_changed(aws, tmp_path):  # noqa: F811
    boto3.client("s3", endpoint_url=aws).create_bucket(Bucket="archives")
    store = tmp_path / "store"
    store.mkdir()
    (store / "a.mar").write_bytes(b"archive a")
    (store / "b.war").write_bytes(b"archive b")
    (store / "notes.txt").write_text("not an archive")
    said = []
    upload(store, "s3://archives/v1", aws, log=said.append)
    upload(store, "s3://archives/v1", aws, log=said.append)
    assert said == [
        "uploaded to s3://archives/v1: 2 archive(s) sent, 0 unchanged",
        "uploaded to s3://archives/v1: 0 archive(s) sent, 2 unchanged",
    ]
    local = tmp_path / "local"
    fetch("s3://archives/v1", local, aws, log=said.append)
    assert sorted(p.name for p in local.iterdir()) == ["a.mar", "b.war"] and (local / "a.mar").read_bytes() == b"archive a"
    (store / "a.mar").write_bytes(b"archive a, rebuilt")
    upload(store, "s3://archives/v1", aws, log=said.append)
    fetch("s3://archives/v1", local, aws, log=said.append)
    assert said[-1].startswith("model store s3://archives/v1: 1 archive(s) downloaded, 1 unchanged")
    assert (local / "a.mar").read_bytes() == b"archive a, rebuilt"


def test_serve_from_an_s3_model_store(aws, model_store, tmp_path, capsys):  # noqa: F811
    boto3.client("s3", endpoint_url=aws).create_bucket(Bucket="served")
    upload(model_store, "s3://served/prod", aws, log=lambda _: None)
    run_dir, port = tmp_path / "run", free_port_base()
    common = ["--run-dir", str(run_dir), "--model-store", "s3://served/prod", "--endpoint-url", aws]
    try:
        assert main(["serve", *common, "--targets", "jpeg", "--port-base", str(port)]) == 0
        assert "archive(s) downloaded" in capsys.readouterr().out
        assert (run_dir / "model_store" / "jpeg.mar").read_bytes() == (model_store / "jpeg.mar").read_bytes()
        assert main(["token", "--run-dir", str(run_dir), "--api", "management"]) == 0
        token = capsys.readouterr().out.strip()
        connection = Connection(f"http://127.0.0.1:{port + 1}", token)  # the management API: what is registered
        try:
            described = connection.request("GET", "/models/jpeg")
            assert described.status == 200 and described.json()[0]["workers"], described.text()
        finally:
            connection.close()
    finally:
        main(["serve", "--stop", "--run-dir", str(run_dir)])


def test_a_missing_bucket_is_one_error_line(aws, tmp_path, capsys):  # noqa: F811
    assert main(["serve", "--run-dir", str(tmp_path), "--model-store", "s3://no-bucket/x", "--endpoint-url", aws, "--targets", "jpeg"]) == 2
    assert capsys.readouterr().err.startswith("error: --model-store s3://no-bucket/x: 404")
