"""`segserve autoscale`: the autoscaler's loop beside a running server (segserve/autoscale/)."""

from pathlib import Path

from segserve.archives.catalog import unknown
from segserve.archives.registration import WORKERS_WORKFLOW
from segserve.cli.common import running_server
from segserve.errors import RuntimeFailure, UsageError
from segserve.serving.served_pipeline import DEFAULT_DAG, catalog


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
        help=f"the served workflow whose nodes it scales, or a fused pipeline (e.g. {DEFAULT_DAG}_fused) whose workers × threads it"
        f" scales (default: {DEFAULT_DAG})",
    )
    p.add_argument(
        "--workflow",
        help="a workflow of your own registered on the server: its nodes are the models NAME__<node> (default with --war: the"
        " .war's file name); read from TorchServe's metrics alone",
    )
    p.add_argument(
        "--war",
        help=f"your workflow's .war (a path or URL): its spec names the nodes and each node's {'/'.join(WORKERS_WORKFLOW)} (without"
        " it: 1 to the budget)",
    )
    p.add_argument("--intervals", type=int, help="stop after this many decisions (default: run until interrupted)")
    p.set_defaults(run=run)


def run(args) -> int:
    from segserve.autoscale.loop import Autoscaler, core_budget, dag_bounds
    from segserve.autoscale.rules import Bounds, Policy

    budget = core_budget(args.cores)
    if args.interval_s <= 0:
        raise UsageError(f"--interval-s must be positive (got {args.interval_s})")
    policy = Policy(budget_workers=budget, min_interval_s=args.min_interval_s)
    if args.war or args.workflow:
        if args.dag:
            raise UsageError("--dag names a catalog DAG; --workflow/--war a workflow of your own: give one or the other")
        (server, bounds), fused = foreign_workflow(args, budget), False
    else:
        dag = args.dag or DEFAULT_DAG
        known = catalog()
        scalable = sorted(t.name for t in known.targets.values() if t.is_workflow or t.is_fused)
        if dag not in scalable:
            raise UsageError(unknown("DAG", dag, scalable))
        fused = known.targets[dag].is_fused
        # the fused pipeline's workers share the budget's cores (the thread rule): from 1 to one a core
        bounds = {dag: Bounds(1, budget)} if fused else dag_bounds(known, dag)
        server = running_server(args, dag, "autoscale")
    if sum(b.min_workers for b in bounds.values()) > budget:
        minimums = ", ".join(f"{model} {b.min_workers}" for model, b in bounds.items())
        raise UsageError(f"--cores: a budget of {budget} worker(s) is below the nodes' {WORKERS_WORKFLOW[0]} ({minimums})")
    scaler = Autoscaler(server, bounds, policy, server.run_dir, dry_run=args.dry_run, fused=fused)
    what = f"{next(iter(bounds))}'s workers × threads" if fused else ", ".join(bounds)
    print(f"autoscaling {what} within {budget} core(s), every {args.interval_s:.0f}s" + (" (dry run)" if args.dry_run else ""))
    try:
        scaler.run(args.interval_s, args.intervals)
    except KeyboardInterrupt:
        pass
    return 0


def foreign_workflow(args, budget: int):
    """A workflow of the user's own on the running server: (server, bounds per registered node model). Its
    nodes come from the .war's spec (--war) or from the server's models <workflow>__<node> (--workflow alone)."""
    from segserve.archives.foreign import read_archive
    from segserve.autoscale.loop import war_bounds
    from segserve.autoscale.rules import Bounds

    archive = None
    if args.war:
        if not args.war.endswith(".war"):
            raise UsageError(f"--war {args.war}: give a workflow archive (.war); a .mar has one model, nothing to move between")
        from segserve.archives.archive_urls import is_remote

        if not is_remote(args.war) and not Path(args.war).is_file():
            raise UsageError(f"--war {args.war}: no such file")
        archive = read_archive(Path(args.war).stem, args.war, None)
    name = args.workflow or archive.name
    try:
        server = running_server(args, name, "autoscale")
    except RuntimeFailure:
        raise RuntimeFailure(
            f"no TorchServe runs from {Path(args.run_dir).resolve()}: start one with `segserve serve --run-dir {args.run_dir}`, then "
            f"register your workflow there (POST /workflows?url={name}.war, the .war in its model store)"
        ) from None
    if archive is not None:
        bounds = war_bounds(archive, name)
        if len(bounds) < 2:
            raise UsageError(f"--war {args.war}: {len(bounds)} model node(s) ({', '.join(bounds)}): nothing to move workers between")
        return server, bounds
    registered = server.workflow_nodes()
    nodes = [model for model in registered if model.startswith(f"{name}__")]
    if not nodes:
        workflows = sorted({model.split("__")[0] for model in registered})
        raise RuntimeFailure(f"{unknown('workflow', name, workflows)} registered on the server from {server.run_dir}")
    return server, {model: Bounds(1, budget) for model in nodes}
