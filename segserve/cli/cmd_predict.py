"""`segserve predict`: images through a served catalog target, the answers saved."""

from pathlib import Path

from segserve.cli.common import image_files, server_from
from segserve.errors import RuntimeFailure
from segserve.serving.served_pipeline import DEFAULT_DAG, catalog


def add_parser(sub, common) -> None:
    p = sub.add_parser("predict", parents=[common], help="send images through the pipeline, save the JPEGs")
    p.add_argument("images", nargs="+", help="image files, or folders: their .jpg/.jpeg/.png files")
    p.add_argument("--out", required=True, help="folder for the returned files")
    p.add_argument("--target", default=DEFAULT_DAG, help=f"any catalog target (default: {DEFAULT_DAG})")
    p.set_defaults(run=run)


def run(args) -> int:
    from segserve.serving.client import predict

    images = image_files(args.images)
    target = catalog().target(args.target)
    server = server_from(args)
    failed = predict(server.url("inference"), server.token("inference"), images, Path(args.out), target)
    if failed:
        raise RuntimeFailure(f"{failed} of {len(images)} request(s) failed")
    return 0
