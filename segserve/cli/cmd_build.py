"""`segserve build`: weights (trained if missing), the node .mar files, each workflow's .war and its fused .mar."""

from pathlib import Path

from segserve.errors import UsageError


def add_parser(sub, common) -> None:
    p = sub.add_parser(
        "build", parents=[common], help="weights (trained if missing), node .mar files, workflow .war files and their fused .mar"
    )
    p.add_argument("--weights", help="your TorchScript file or state_dict (default: weights/seg.pt, trained if missing)")
    p.add_argument("--backbone", choices=["mobilenet_v3_small", "mobilenet_v3_large"], help="architecture of a state_dict")
    p.add_argument("--num-classes", type=int, help="classes of your model (default 2)")
    p.add_argument("--upload", metavar="s3://BUCKET/PREFIX", help="then send the archives there (only those S3 does not have)")
    p.add_argument("--endpoint-url", help="--upload: the S3 endpoint (default: AWS's)")
    p.set_defaults(run=run)


def run(args) -> int:
    from segserve.archives.build import build

    if args.model_store.startswith("s3://"):
        raise UsageError("build --model-store is a local folder; send it to S3 with --upload s3://bucket/prefix")
    if args.upload:  # checked before building, not after
        from segserve.archives.s3_prefix import S3Prefix

        S3Prefix(args.upload, args.endpoint_url, "--upload").check()
    build(
        Path.cwd(),
        Path(args.model_store),
        weights=Path(args.weights) if args.weights else None,
        backbone=args.backbone,
        num_classes=args.num_classes,
    )
    if args.upload:
        from segserve.archives.model_store_s3 import upload

        upload(Path(args.model_store), args.upload, args.endpoint_url)
    return 0
