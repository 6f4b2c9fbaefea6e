"""`segserve scale`: a model's or workflow node's workers, through the management API."""

from segserve.archives.catalog import unknown
from segserve.cli.common import server_from
from segserve.errors import UsageError
from segserve.serving.served_pipeline import catalog


def add_parser(sub, common) -> None:
    p = sub.add_parser("scale", parents=[common], help="set the workers of a model or workflow node")
    p.add_argument("model", help="a registered model or workflow node (seg, seg_jpeg__seg), or a catalog target: all its models")
    p.add_argument("--workers", type=int, required=True, help="workers (min = max): the management API's synchronous scale")
    p.set_defaults(run=run)


def run(args) -> int:
    if args.workers < 0:
        raise UsageError(f"--workers must be ≥ 0 (got {args.workers})")
    known = catalog()
    # a catalog target: every model it registers (a workflow's nodes); else one registered model or node by name
    models = known.targets[args.model].models if args.model in known.targets else (args.model,)
    registered = {m for t in known.targets.values() for m in t.models}
    if models[0] not in registered:
        raise UsageError(unknown("model", args.model, sorted(registered | set(known.targets))))
    server = server_from(args)
    for model in models:
        server.scale(model, args.workers)
        print(f"{model}: {args.workers} worker(s)")
    return 0
