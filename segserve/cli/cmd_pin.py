"""`segserve pin`: the live CPU affinity of a server's processes (--show), or a core plan from bench results."""

import sys
from pathlib import Path

from segserve.cli.common import running_server
from segserve.errors import UsageError
from segserve.serving.served_pipeline import DEFAULT_DAG, catalog


def add_parser(sub, common) -> None:
    p = sub.add_parser("pin", parents=[common], help="show live CPU affinity (--show), or write a core plan from bench results")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--show", action="store_true", help="the frontend and every worker with its pid and allowed cores")
    what.add_argument(
        "--plan-from", metavar="RESULTS", help="a bench result folder (or its summary.jsonl): cores in proportion to seg and jpeg cost"
    )
    p.add_argument("--cores", help="cores to plan: N (the first N available) or a list like 0-3,6 (default: every available core)")
    p.add_argument("--frontend-cores", type=int, default=1, help="cores for TorchServe's frontend, taken first (default: 1)")
    p.add_argument("--dag", default=DEFAULT_DAG, help=f"the workflow whose nodes get cores (default: {DEFAULT_DAG})")
    p.add_argument("--out", help="write the plan here (default: print it)")
    p.set_defaults(run=run)


def run(args) -> int:
    if args.plan_from:
        from segserve.bench.results.core_plan_from import node_targets, plan_from_results
        from segserve.serving.cores import parse_cores

        nodes = node_targets(catalog(), args.dag)
        text = plan_from_results(Path(args.plan_from), parse_cores(args.cores), nodes, args.frontend_cores)
        if args.out:
            Path(args.out).write_text(text)
            print(f"wrote {args.out}; serve with `segserve serve --core-plan {args.out}`", file=sys.stderr)
        else:
            print(text, end="")
        return 0
    if args.cores or args.out or args.frontend_cores != 1 or args.dag != DEFAULT_DAG:
        raise UsageError("--cores, --frontend-cores, --dag and --out go with --plan-from, not --show")
    from segserve.autoscale.loop import last_decisions
    from segserve.serving.cores import live_affinity

    server = running_server(args, DEFAULT_DAG, "pin --show")
    rows = live_affinity(server)
    print(f"{'model':24s} {'pid':>8s}  cpus")
    for row in rows:
        print(f"{row['model']:24s} {row['pid']:>8d}  {row['cpus']}")
    decisions = last_decisions(server.run_dir)
    if decisions:
        print("\nautoscaler, last decisions:")
        for decision in decisions:
            move = ", ".join(f"{model} → {workers}" for model, workers in decision["move"]) or "no move"
            print(f"{decision['time']}  {move}: {decision['why']}" + (f" (failed: {decision['error']})" if decision["error"] else ""))
    return 0
