"""`segserve token`: the key TorchServe generated for an API."""

from segserve.cli.common import server_from


def add_parser(sub, common) -> None:
    p = sub.add_parser("token", parents=[common], help="print the key TorchServe generated")
    p.add_argument("--api", default="inference", choices=["inference", "management"], help="which API's key")
    p.set_defaults(run=run)


def run(args) -> int:
    print(server_from(args).token(args.api))
    return 0
