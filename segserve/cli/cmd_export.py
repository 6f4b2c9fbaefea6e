"""`segserve export`: a result folder sent to S3, CloudWatch or a Pushgateway."""

from pathlib import Path

from segserve.errors import UsageError


def add_parser(sub, common) -> None:
    p = sub.add_parser("export", help="send a result folder to s3://, cloudwatch:// or pushgateway:// (again: finishes it)")
    p.add_argument("results", metavar="RESULTS", help="a result folder written by `segserve bench`")
    p.add_argument("dest", nargs="+", metavar="DEST", help="s3://bucket/prefix, cloudwatch://Namespace, pushgateway://host:port")
    p.add_argument("--endpoint-url", help="the S3 / CloudWatch endpoint (default: AWS's)")
    p.set_defaults(run=run)


def run(args) -> int:
    from segserve.bench.results.export import export

    folder = Path(args.results)
    if not (folder / "summary.jsonl").is_file():
        raise UsageError(f"{folder}: not a result folder (no summary.jsonl)")
    export(folder, args.dest, args.endpoint_url)
    return 0
