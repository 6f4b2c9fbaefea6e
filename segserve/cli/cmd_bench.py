"""`segserve bench`: a suite run, and the actions on suites and results, each a subcommand of its own:
`bench [run] SUITE.yaml`, `bench compare OLD NEW`, `bench ab SUITE --a REF --b REF`, `bench replay RESULTS`,
`bench collect STUDY` and `bench schema`. `segserve bench SUITE.yaml` is `segserve bench run SUITE.yaml`."""

import argparse
import os
from pathlib import Path

from segserve.errors import UsageError
from segserve.serving.served_pipeline import catalog

ACTIONS = ("run", "compare", "ab", "replay", "collect", "schema")


def with_run_action(argv: list[str]) -> list[str]:
    """`bench SUITE.yaml …` as `bench run SUITE.yaml …`: a suite's path is never one of the actions' names."""
    if len(argv) > 1 and argv[0] == "bench" and argv[1] not in (*ACTIONS, "-h", "--help"):
        return ["bench", "run", *argv[1:]]
    return argv


def add_parser(sub, common) -> None:
    p = sub.add_parser(
        "bench",
        help="run a benchmark suite, `bench compare OLD NEW`, `bench ab SUITE --a REF --b REF`, `bench replay RESULTS`, "
        "`bench collect STUDY`, or `bench schema` (the suite format's JSON Schema, for editors)",
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="{SUITE.yaml,run,compare,ab,replay,collect,schema}")
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--results", default="results", help="where result folders go (default: results)")
    weights = argparse.ArgumentParser(add_help=False)
    weights.add_argument("--weights", default="weights/seg.pt", help="weights used for every seg archive")
    storage = argparse.ArgumentParser(add_help=False)
    storage.add_argument(
        "--storage",
        metavar="URL",
        help="optuna search, collect: the Optuna storage of the study; postgresql://user:password@host/db shares it between bench "
        "processes (default: study.log in the result folder)",
    )
    effect = argparse.ArgumentParser(add_help=False)
    effect.add_argument("--min-effect", type=float, default=0.05, help="the smallest relative throughput change that counts (default 0.05)")
    add_run_parser(actions, [where, weights, storage])
    add_result_parsers(actions, where, weights, storage, effect)


def add_run_parser(actions, parents: list) -> None:
    from segserve.bench.search.study import HEARTBEAT_S

    q = actions.add_parser("run", parents=parents, help="run a suite (the default: `segserve bench SUITE.yaml`)")
    q.add_argument("suite", metavar="SUITE.yaml", help="a suite file (benchmarks/*.yaml)")
    q.add_argument("--dry-run", action="store_true", help="print the plan: points, restarts, estimated time")
    q.add_argument("--resume", metavar="DIR", help="continue a result folder, skipping finished points")
    q.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure the whole grid N times, the order reversed every other round, workers fresh each round; "
        "each point: the median of its rounds and its interval (default 1)",
    )
    q.add_argument("--port-base", type=int, help="TorchServe's HTTP APIs on N, N+1, N+2, gRPC on N+3, N+4 (default: free ports)")
    q.add_argument(
        "--export",
        action="append",
        default=[],
        metavar="DEST",
        help="send the results to s3://bucket/prefix, cloudwatch://Namespace or pushgateway://host:port (repeatable)",
    )
    q.add_argument("--endpoint-url", help="--export: the S3 / CloudWatch endpoint (default: AWS's)")
    q.add_argument(
        "--ray-address",
        metavar="HOST:PORT",
        help="the suite's Ray points (grid.server.engine ray) onto this running Ray cluster: its GCS's address; run the bench "
        "on a node of it (docs/ray.md)",
    )
    q.add_argument(
        "--ray-shared-dir", metavar="DIR", help="--ray-address: a folder every node mounts at this path (the archives are built in it)"
    )
    q.add_argument("--ray-allow-no-auth", action="store_true", help="--ray-address: deploy onto a cluster with token auth off")
    q.add_argument(
        "--heartbeat-s",
        type=int,
        default=HEARTBEAT_S,
        help=f"database storage: seconds between a running trial's heartbeats; silent for 3, it goes to another process ({HEARTBEAT_S})",
    )
    q.set_defaults(run=run_suite)


def add_result_parsers(actions, where, weights, storage, effect) -> None:
    """compare, ab, replay, collect and schema: the actions on results, versions and suites."""
    q = actions.add_parser("compare", parents=[effect], help="did NEW get slower than OLD, point by point (exit 1: a slowdown)")
    q.add_argument("old", metavar="OLD", help="a result folder")
    q.add_argument("new", metavar="NEW", help="a result folder of the same suite")
    q.add_argument("--across-machines", action="store_true", help="compare runs from different machines (CPU, ISA, cores, GPU) anyway")
    q.set_defaults(run=run_compare)

    q = actions.add_parser("ab", parents=[where, weights, effect], help="two versions of the project, measured in turn on a suite's points")
    q.add_argument("suite", metavar="SUITE.yaml", help="a suite file")
    q.add_argument(
        "--a",
        required=True,
        help="the version to compare against: a git ref or a project folder (refs name segserve's checkout when run from "
        "a folder of your archives)",
    )
    q.add_argument("--b", required=True, help="the version under test: a git ref or a project folder (`.`: this working tree)")
    q.add_argument("--rounds", type=int, default=3, help="A/B measurements of each point, interleaved (default 3)")
    q.add_argument("--b-env", action="append", default=[], metavar="NAME=VALUE", help="environment of B's server (repeatable)")
    q.set_defaults(run=run_ab)

    q = actions.add_parser("replay", help="search strategies judged on a recorded grid, without a server")
    q.add_argument("results", metavar="RESULTS", help="a result folder of a complete grid")
    q.add_argument("--strategy", default="grid,random,optuna,auto", help="strategies, comma-separated")
    q.add_argument("--budget", default="0.05,0.1,0.2", help="fractions of the grid (0.1) or point counts (15), comma-separated")
    q.add_argument("--seeds", type=int, default=20, help="runs of each strategy and budget, seeds 0…N-1 (default 20)")
    q.add_argument("--json", action="store_true", help='print {"<strategy>": {"<budget>": {"median": x, "worst": y}}}')
    q.set_defaults(run=run_replay)

    q = actions.add_parser("collect", parents=[where, storage], help="one result folder from a shared study's trials")
    q.add_argument("study", metavar="STUDY", help="the study's name (with --storage), or a result folder (its study.log)")
    q.set_defaults(run=run_collect)

    q = actions.add_parser("schema", help="print the suite format's JSON Schema (for editors)")
    q.set_defaults(run=run_schema)


def run_schema(args) -> int:
    import json

    from segserve.bench.suite.spec import suite_schema

    print(json.dumps(suite_schema(), indent=2))
    return 0


def run_compare(args) -> int:
    from segserve.bench.results.compare import CompareRun, compare

    try:
        text, regressed = compare(CompareRun(Path(args.old), Path(args.new), args.min_effect, args.across_machines))
    except FileNotFoundError as error:
        raise UsageError(str(error)) from None
    print(text)
    return 1 if regressed else 0


def run_ab(args) -> int:
    from segserve.bench.ab import AbRun, parse_env, project_root
    from segserve.bench.ab import run_ab as run_versions
    from segserve.bench.suite.spec import load_suite

    known = catalog()
    suite = load_suite(Path(args.suite), known)
    env = parse_env(args.b_env)
    refs, weights, foreign = (args.a, args.b), Path(args.weights).resolve(), list(known.foreign.values())
    root = project_root(Path.cwd())  # a user's archives' folder is no checkout: segserve's own, then
    _, slower = run_versions(AbRun(suite, root, refs, weights, Path(args.results), args.rounds, args.min_effect, env, foreign))
    return 1 if slower else 0


def run_replay(args) -> int:
    from segserve.bench import replay

    try:
        return replay.main(replay.ReplayRun(Path(args.results), catalog(), args.strategy, args.budget, args.seeds, args.json))
    except FileNotFoundError as error:
        raise UsageError(str(error)) from None


def run_collect(args) -> int:
    from segserve.bench.run.suite_run import CollectRun, collect

    collect(CollectRun(args.study, args.storage, catalog(), Path(args.results)))
    return 0


# the first line of `segserve bench` for a suite of a user's archives
ARCHIVES_ARE_CODE = (
    "note: an archive runs its own Python with the server's rights ({names}): bench only archives you trust; their "
    "workers get a minimal environment, credentials only where the target's worker_env names them"
)


def run_suite(args) -> int:
    from segserve.bench.run.suite_run import SuiteRun, carries_weights, check_cluster, describe_search, prepare, strategy_for
    from segserve.bench.run.suite_run import run_suite as run_points
    from segserve.bench.suite import plan
    from segserve.bench.suite.spec import check_member_functions, load_suite
    from segserve.engines.ray import cluster as clusters

    suite_path, known = Path(args.suite), catalog()
    if args.heartbeat_s < 1:
        raise UsageError(f"--heartbeat-s must be ≥ 1 (got {args.heartbeat_s})")
    cluster = clusters.from_options(args.ray_address, args.ray_shared_dir, args.ray_allow_no_auth)
    suite = load_suite(suite_path, known)
    if suite.archive_targets:  # before anything of theirs runs (docs/benchmarking.md, "Archives are code")
        print(ARCHIVES_ARE_CODE.format(names=", ".join(suite.archive_targets)))
    if not args.dry_run:
        check_member_functions(suite, known)  # imports a .war's function file: only after the note above
    run = SuiteRun(
        suite_path,
        suite,
        known,
        Path(args.results),
        Path(args.weights),
        Path(args.resume) if args.resume else None,
        storage_url=args.storage,
        port_base=args.port_base,
        heartbeat_s=args.heartbeat_s,
        rounds=args.rounds,
        cluster=cluster,
    )
    if args.dry_run:
        prepared = prepare(run)  # the run's own checks: rounds, storage (reachable?), --resume
        # refused as the run would: a budget larger than the space, auto without members
        strategy_for(run.suite, known, prepared.points, prepared.storage)
        print(plan.describe(run.suite, prepared.points))
        print(describe_search(run.suite, known, prepared.points))
        if args.rounds > 1:
            print(f"--rounds {args.rounds}: every point measured {args.rounds} times, so about {args.rounds}× the time above")
        if carries_weights(run.suite, known) and not run.weights.exists():
            print(f"({args.weights} is not there yet: the run ids of targets built from it change once it is)")
        return 0
    from dataclasses import replace

    from segserve.bench.results.export import checked
    from segserve.fuse import fuse

    exports = checked(args.export, args.endpoint_url)  # credentials, bucket, namespace: now, not after measuring
    if cluster is not None:  # its token (or --ray-allow-no-auth) now, not at its first point
        check_cluster(suite, cluster)
        clusters.driver_environment(cluster, dict(os.environ), Path.home())
    run_points(replace(run, exports=exports, fuse=fuse))
    return 0
