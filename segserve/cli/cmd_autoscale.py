"""`segserve autoscale`: the autoscaler's loop beside a running server (segserve/autoscale/)."""

from segserve.archives.catalog import unknown
from segserve.cli.common import running_server
from segserve.errors import UsageError
from segserve.serving.launch import DEFAULT_DAG, catalog


def add_parser(sub, common) -> None:
    p = sub.add_parser(
        "autoscale",
        parents=[common],
        help="move workers between a served DAG's nodes (or size a fused pipeline's workers × threads) as the load moves, "
        "within a core budget",
    )
    p.add_argument("--cores", help="the budget: N cores, or a list like 0-3,6 (default: every core available)")
    p.add_argument("--interval-s", type=float, default=5.0, help="seconds between decisions (default: 5)")
    p.add_argument("--min-interval-s", type=float, default=15.0, help="at least this long between two moves (default: 15)")
    p.add_argument("--dry-run", action="store_true", help="decide and log, change nothing")
    p.add_argument(
        "--dag",
        default=DEFAULT_DAG,
        help=f"the served workflow whose nodes it scales, or a fused pipeline (e.g. {DEFAULT_DAG}_fused) whose workers × threads it"
        f" scales (default: {DEFAULT_DAG})",
    )
    p.add_argument("--intervals", type=int, help="stop after this many decisions (default: run until interrupted)")
    p.set_defaults(run=run)


def run(args) -> int:
    from segserve.autoscale.loop import Autoscaler, core_budget, dag_bounds
    from segserve.autoscale.rules import Bounds, Policy

    budget = core_budget(args.cores)
    if args.interval_s <= 0:
        raise UsageError(f"--interval-s must be positive (got {args.interval_s})")
    known = catalog()
    scalable = sorted(t.name for t in known.targets.values() if t.kind in ("workflow", "fused"))
    if args.dag not in scalable:
        raise UsageError(unknown("DAG", args.dag, scalable))
    fused = known.targets[args.dag].kind == "fused"
    # the fused pipeline's workers share the budget's cores (the thread rule): from 1 to one a core
    bounds = {args.dag: Bounds(1, budget)} if fused else dag_bounds(known, args.dag)
    policy = Policy(budget_workers=budget, min_interval_s=args.min_interval_s)
    server = running_server(args, args.dag)
    scaler = Autoscaler(server, bounds, policy, server.run_dir, dry_run=args.dry_run, fused=fused)
    what = f"{args.dag}'s workers × threads" if fused else ", ".join(bounds)
    print(f"autoscaling {what} within {budget} core(s), every {args.interval_s:.0f}s" + (" (dry run)" if args.dry_run else ""))
    try:
        scaler.run(args.interval_s, args.intervals)
    except KeyboardInterrupt:
        pass
    return 0
