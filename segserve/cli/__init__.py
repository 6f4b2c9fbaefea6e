"""`segserve`: one entry point, subcommands (docs/reference/cli.md).

Errors print one line `error: ...` and exit 2 for usage/config errors, 1 for runtime failures.
"""

import argparse
import signal
import sys
from pathlib import Path

from segserve.archives.catalog import unknown
from segserve.errors import RuntimeFailure, UsageError

DEFAULT_RUN_DIR = Path(".segserve")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


def _server(args):
    from segserve.serving.server import TorchServe

    config = Path(args.config)
    if not config.exists():
        raise UsageError(f"--config {config}: no such file (run from the repository root or pass --config)")
    return TorchServe(
        run_dir=Path(args.run_dir).resolve(),
        model_store=Path(args.model_store),
        config_template=config,
        port_base=getattr(args, "port_base", None),
        core_plan=Path(args.core_plan) if getattr(args, "core_plan", None) else None,
    )


# The DAG `segserve serve` and `predict` use by default (DESIGN.md): its member models, workflow and fused twin.
DEFAULT_DAG = "seg_jpeg"


def catalog():
    from segserve.archives.catalog import Catalog

    return Catalog(Path.cwd())


def served_targets(names: str | None) -> list:
    """Catalog targets from --targets a,b (default: the default DAG's family), checked before anything starts."""
    known = catalog()
    chosen = [n.strip() for n in names.split(",") if n.strip()] if names else known.family(DEFAULT_DAG)
    return [known.target(name) for name in dict.fromkeys(chosen)]


def start_pipeline(server, targets: list, log=print) -> None:
    """Start TorchServe and register the targets' archives (a workflow's nodes come with it); wait until every
    model is READY; stop it again on any failure."""
    from segserve.archives.build import COMPILED_STARTUP_TIMEOUT_S

    for target in targets:
        if not (server.model_store / target.archive).exists():
            raise UsageError(f"{server.model_store / target.archive} is missing: run `segserve build` first")
    server.start(log=log)
    try:
        for target in targets:
            if target.kind == "workflow":
                server.register_workflow(target.archive, target.name, log=log)
            else:
                server.register_model(target.archive, target.name, log=log)
        for target in targets:
            for model in target.models:
                server.wait_ready(model, COMPILED_STARTUP_TIMEOUT_S)  # a worker that compiles its network loads for minutes
    except BaseException:
        server.stop()
        raise


def cmd_train(args) -> int:
    from segserve.model.train import TrainSettings, train

    train(Path(args.weights), TrainSettings(backbone=args.backbone, steps=args.steps))
    return 0


def cmd_build(args) -> int:
    from segserve.archives.build import build

    if args.model_store.startswith("s3://"):
        raise UsageError("build --model-store is a local folder; send it to S3 with --upload s3://bucket/prefix")
    if args.upload:  # checked before building, not after
        from segserve.archives.s3 import S3Prefix

        S3Prefix(args.upload, args.endpoint_url, "--upload").check()
    build(
        Path.cwd(),
        Path(args.model_store),
        weights=Path(args.weights) if args.weights else None,
        backbone=args.backbone,
        num_classes=args.num_classes,
    )
    if args.upload:
        from segserve.archives.s3_store import upload

        upload(Path(args.model_store), args.upload, args.endpoint_url)
    return 0


def cmd_serve(args) -> int:
    server = _server(args)
    if args.stop:
        stopped = server.stop()
        print(f"TorchServe stopped from {server.run_dir}: {stopped}" if stopped else f"no TorchServe running from {server.run_dir}")
        return 0
    targets = served_targets(args.targets)
    if args.model_store.startswith("s3://"):  # archives from S3 into the run dir's model store, then as usual
        from segserve.archives.s3_store import fetch

        server.model_store = fetch(args.model_store, Path(args.run_dir).resolve() / "model_store", args.endpoint_url)
    # one loop per server: the first workflow served, else the first fused pipeline
    scalable = [t for kind in ("workflow", "fused") for t in targets if t.kind == kind]
    if args.autoscale and not scalable:
        raise UsageError(
            "--autoscale moves workers between a workflow's nodes, or a fused pipeline's workers × threads: serve one (--targets seg_jpeg)"
        )
    start_pipeline(server, targets)
    endpoints = ", ".join(t.endpoint for t in targets)
    print(f"serving {endpoints} at {server.url('inference')}; stop with `segserve serve --stop`")
    if args.autoscale:
        scaled = scalable[0]
        pid = start_autoscaler(server, args, scaled.name)
        what = "nodes" if scaled.kind == "workflow" else "workers × threads"
        print(f"autoscaling {scaled.name}'s {what} (pid {pid}): decisions in {server.run_dir / 'autoscale.jsonl'}, `segserve pin --show`")
    return 0


def start_autoscaler(server, args, dag: str) -> int:
    """`segserve autoscale` beside the server, in a session of its own and marked as the server's process (the
    run dir in its environment), so that `serve --stop` stops it with the server; it dies alone otherwise."""
    import os
    import subprocess

    from segserve.serving.processes import MARKER

    command = [sys.executable, "-m", "segserve.cli", "autoscale", "--run-dir", str(server.run_dir), "--config", args.config, "--dag", dag]
    log = open(server.run_dir / "logs" / "autoscale.log", "a")  # noqa: SIM115 (the child keeps it)
    child = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, MARKER: str(server.run_dir.resolve())},
    )
    log.close()
    return child.pid


def image_files(given_paths: list[str]) -> list[Path]:
    """Image files, and the .jpg/.jpeg/.png files of folders (as a user means by `segserve predict photos/`)."""
    images = []
    for given in map(Path, given_paths):
        if given.is_dir():
            found = sorted(p for p in given.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
            if not found:
                raise UsageError(f"{given} is a folder without {'/'.join(IMAGE_SUFFIXES)} files")
            images += found
        elif given.is_file():
            images.append(given)
        else:
            raise UsageError(f"no such image or folder: {given}")
    return images


def cmd_predict(args) -> int:
    from segserve.serving.client import predict

    images = image_files(args.images)
    target = catalog().target(args.target)
    server = _server(args)
    failed = predict(server.url("inference"), server.token("inference"), images, Path(args.out), target)
    if failed:
        raise RuntimeFailure(f"{failed} of {len(images)} request(s) failed")
    return 0


def cmd_token(args) -> int:
    print(_server(args).token(args.api))
    return 0


def cmd_scale(args) -> int:
    if args.workers < 0:
        raise UsageError(f"--workers must be ≥ 0 (got {args.workers})")
    known = catalog()
    # a catalog target: every model it registers (a workflow's nodes); else one registered model or node by name
    models = known.targets[args.model].models if args.model in known.targets else (args.model,)
    registered = {m for t in known.targets.values() for m in t.models}
    if models[0] not in registered:
        raise UsageError(unknown("model", args.model, sorted(registered | set(known.targets))))
    server = _server(args)
    for model in models:
        server.scale(model, args.workers)
        print(f"{model}: {args.workers} worker(s)")
    return 0


def cmd_pin(args) -> int:
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
    from segserve.serving.cores import live_affinity

    server = _running_server(args, DEFAULT_DAG)
    rows = live_affinity(server)
    print(f"{'model':24s} {'pid':>8s}  cpus")
    for row in rows:
        print(f"{row['model']:24s} {row['pid']:>8d}  {row['cpus']}")
    from segserve.autoscale.loop import last_decisions

    decisions = last_decisions(server.run_dir)
    if decisions:
        print("\nautoscaler, last decisions:")
        for decision in decisions:
            move = ", ".join(f"{model} → {workers}" for model, workers in decision["move"]) or "no move"
            print(f"{decision['time']}  {move}: {decision['why']}" + (f" (failed: {decision['error']})" if decision["error"] else ""))
    return 0


def cmd_bench(args) -> int:
    if args.suite[0] == "schema":
        import json

        from segserve.docs.reference import suite_schema

        if len(args.suite) != 1:
            raise UsageError("usage: segserve bench schema  (prints the suite format's JSON Schema)")
        print(json.dumps(suite_schema(), indent=2))
        return 0
    if args.suite[0] == "compare":
        from segserve.bench.results.compare import compare

        if len(args.suite) != 3:
            raise UsageError("usage: segserve bench compare OLD_RESULT_DIR NEW_RESULT_DIR [--min-effect 0.05]")
        try:
            text, regressed = compare(Path(args.suite[1]), Path(args.suite[2]), min_effect=args.min_effect)
        except FileNotFoundError as error:
            raise UsageError(str(error)) from None
        print(text)
        return 1 if regressed else 0
    if args.suite[0] == "ab":
        from segserve.bench.ab import parse_env, run_ab
        from segserve.bench.suite.spec import load_suite

        if len(args.suite) != 2 or not (args.a and args.b):
            raise UsageError("usage: segserve bench ab SUITE.yaml --a REF --b REF [--rounds 3] [--b-env NAME=VALUE] [--min-effect 0.05]")
        suite = load_suite(Path(args.suite[1]), catalog())
        env = parse_env(args.b_env)
        _, slower = run_ab(
            suite, Path.cwd(), (args.a, args.b), Path(args.weights).resolve(), Path(args.results), args.rounds, args.min_effect, env
        )
        return 1 if slower else 0
    if args.suite[0] == "replay":
        from segserve.bench import replay

        if len(args.suite) != 2:
            raise UsageError(
                "usage: segserve bench replay RESULTS --strategy grid,random,optuna,auto --budget 0.05,0.1 [--seeds 20] [--json]"
            )
        try:
            return replay.main(Path(args.suite[1]), catalog(), args.strategy, args.budget, args.seeds, args.json)
        except FileNotFoundError as error:
            raise UsageError(str(error)) from None
    if args.suite[0] == "collect":
        from segserve.bench.run.session import collect

        if len(args.suite) != 2:
            raise UsageError("usage: segserve bench collect STUDY --storage URL (or: collect RESULT_DIR, its study.log)")
        collect(args.suite[1], args.storage, catalog(), Path(args.results))
        return 0
    if len(args.suite) != 1:
        raise UsageError("usage: segserve bench SUITE.yaml [--dry-run] [--resume DIR] [--storage URL] [--port-base N]")
    from segserve.bench.run.session import check_storage, describe_search, plan_points, run_suite, strategy_for
    from segserve.bench.search import study
    from segserve.bench.suite import plan
    from segserve.bench.suite.spec import load_suite

    suite_path, known = Path(args.suite[0]), catalog()
    suite = load_suite(suite_path, known)
    points = plan_points(suite, known, Path(args.weights))
    if args.heartbeat_s < 1:
        raise UsageError(f"--heartbeat-s must be ≥ 1 (got {args.heartbeat_s})")
    if args.dry_run:
        check_storage(suite, args.storage)
        storage = study.open_storage(args.storage, None, args.heartbeat_s) if args.storage else None  # reachable?
        strategy_for(suite, known, points, storage)  # refused as the run would: a budget larger than the space, auto without members
        print(plan.describe(suite, points))
        print(describe_search(suite, known, points))
        if not Path(args.weights).exists():
            print(f"({args.weights} is not there yet: the run ids of targets built from it change once it is)")
        return 0
    resume = Path(args.resume) if args.resume else None
    from segserve.bench.results.export import checked

    exports = checked(args.export, args.endpoint_url)  # credentials, bucket, namespace: now, not after measuring
    run_suite(
        suite_path,
        suite,
        known,
        Path(args.results),
        Path(args.weights),
        resume,
        storage_url=args.storage,
        port_base=args.port_base,
        heartbeat_s=args.heartbeat_s,
        exports=exports,
    )
    return 0


def cmd_optimize(args) -> int:
    from segserve.optimize.variants import run

    return run(args)


def _size(text: str) -> tuple[int, int]:
    try:
        height, width = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give HEIGHTxWIDTH, like 256x448") from None
    if min(height, width) < 32:
        raise argparse.ArgumentTypeError(f"{text!r}: each side must be at least 32 pixels")
    return height, width


def _running_server(args, targets: str):
    """The server of --run-dir, or one line saying how to start it (commands that work on a live server)."""
    from segserve.serving import processes

    server = _server(args)
    if not server.config_path.exists() or not processes.server_processes(server.run_dir):
        raise RuntimeFailure(f"no TorchServe runs from {server.run_dir}: start it with `segserve serve --targets {targets}`")
    return server


def cmd_profile(args) -> int:
    from segserve.bench.run.profiler import profile

    if args.seconds <= 0 or args.connections < 0 or args.rate <= 0:
        raise UsageError("--seconds and --rate must be positive and --connections ≥ 0")
    target = catalog().target(args.target)
    server = _running_server(args, target.name)
    bodies = [path.read_bytes() for path in image_files(args.images)] if args.connections else []
    summary = profile(server, target, server.run_dir, args.seconds, Path(args.out), bodies, args.connections, args.rate)
    print((Path(summary["folder"]) / "report.md").read_text())
    print(f"profile: {summary['folder']}")
    return 1 if summary["errors"] else 0


def cmd_autoscale(args) -> int:
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
    server = _running_server(args, args.dag)
    scaler = Autoscaler(server, bounds, policy, server.run_dir, dry_run=args.dry_run, fused=fused)
    what = f"{args.dag}'s workers × threads" if fused else ", ".join(bounds)
    print(f"autoscaling {what} within {budget} core(s), every {args.interval_s:.0f}s" + (" (dry run)" if args.dry_run else ""))
    try:
        scaler.run(args.interval_s, args.intervals)
    except KeyboardInterrupt:
        pass
    return 0


def cmd_export(args) -> int:
    from segserve.bench.results.export import export

    folder = Path(args.results)
    if not (folder / "summary.jsonl").is_file():
        raise UsageError(f"{folder}: not a result folder (no summary.jsonl)")
    export(folder, args.dest, args.endpoint_url)
    return 0


def cmd_results(args) -> int:
    from segserve.bench.results.query import query, render

    rows, columns = query(args.results, args.where, args.sort, args.limit, args.endpoint_url)
    print(render(rows, columns, args.format, args.where, args.sort))
    return 0


def parser() -> argparse.ArgumentParser:
    from segserve.bench.search.study import HEARTBEAT_S

    root = argparse.ArgumentParser(prog="segserve", description=__doc__.splitlines()[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--model-store", default="model_store", help="archive folder (default: model_store); serve: also s3://bucket/prefix"
    )
    common.add_argument("--config", default="config.properties", help="TorchServe config (default: config.properties)")
    common.add_argument("--run-dir", default=str(DEFAULT_RUN_DIR), help="server state: key file, logs, pid (default: .segserve)")
    sub = root.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train the model on synthetic data")
    p.add_argument("--weights", default="weights/seg.pt", help="where the trained state_dict goes (and a report beside it, .json)")
    p.add_argument(
        "--backbone", default="mobilenet_v3_small", choices=["mobilenet_v3_small", "mobilenet_v3_large"], help="torchvision backbone"
    )
    p.add_argument("--steps", type=int, default=700, help="training steps (deterministic: fixed seeds, 2 threads)")
    p.set_defaults(run=cmd_train)

    p = sub.add_parser(
        "build", parents=[common], help="weights (trained if missing), node .mar files, workflow .war files and their fused .mar"
    )
    p.add_argument("--weights", help="your TorchScript file or state_dict (default: weights/seg.pt, trained if missing)")
    p.add_argument("--backbone", choices=["mobilenet_v3_small", "mobilenet_v3_large"], help="architecture of a state_dict")
    p.add_argument("--num-classes", type=int, help="classes of your model (default 2)")
    p.add_argument("--upload", metavar="s3://BUCKET/PREFIX", help="then send the archives there (only those S3 does not have)")
    p.add_argument("--endpoint-url", help="--upload: the S3 endpoint (default: AWS's)")
    p.set_defaults(run=cmd_build)

    p = sub.add_parser("serve", parents=[common], help="start TorchServe and register catalog targets (default: seg_jpeg's family)")
    p.add_argument("--targets", help=f"comma-separated catalog targets (default: {DEFAULT_DAG}'s members, workflow and fused twin)")
    p.add_argument("--stop", action="store_true", help="stop the server started from --run-dir")
    p.add_argument("--core-plan", help="a core plan YAML: frontend cores and per-model core slots (docs/workers-and-cores.md)")
    p.add_argument("--port-base", type=int, help="HTTP APIs on N, N+1, N+2, gRPC on N+3, N+4 (default: config.properties)")
    p.add_argument("--endpoint-url", help="--model-store s3://…: the S3 endpoint (default: AWS's)")
    p.add_argument(
        "--autoscale",
        action="store_true",
        help="also run `segserve autoscale` on the served workflow, else the fused pipeline (stopped by --stop)",
    )
    p.set_defaults(run=cmd_serve)

    p = sub.add_parser("predict", parents=[common], help="send images through the pipeline, save the JPEGs")
    p.add_argument("images", nargs="+", help="image files, or folders: their .jpg/.jpeg/.png files")
    p.add_argument("--out", required=True, help="folder for the returned files")
    p.add_argument("--target", default=DEFAULT_DAG, help=f"any catalog target (default: {DEFAULT_DAG})")
    p.set_defaults(run=cmd_predict)

    p = sub.add_parser("token", parents=[common], help="print the key TorchServe generated")
    p.add_argument("--api", default="inference", choices=["inference", "management"], help="which API's key")
    p.set_defaults(run=cmd_token)

    p = sub.add_parser("scale", parents=[common], help="set the workers of a model or workflow node")
    p.add_argument("model", help="a registered model or workflow node (seg, seg_jpeg__seg), or a catalog target: all its models")
    p.add_argument("--workers", type=int, required=True, help="workers (min = max): the management API's synchronous scale")
    p.set_defaults(run=cmd_scale)

    p = sub.add_parser(
        "optimize", help="measure optimised variants of the seg network against eager fp32 (speed, accuracy); --out: the best's .mar"
    )
    p.add_argument(
        "--quantize", choices=["int8"], help="int8: post-training static quantisation (PT2E, x86), calibrated on synthetic images"
    )
    p.add_argument("--compile", action="store_true", help="torch.compile (inductor) at each precision")
    p.add_argument("--ipex", action="store_true", help="Intel Extension for PyTorch, in --ipex-venv's Python (make setup-ipex)")
    p.add_argument("--ipex-venv", default=".venv-ipex", help="the venv with intel-extension-for-pytorch (default: .venv-ipex)")
    p.add_argument("--precision", action="append", choices=["fp32", "fp16", "bf16"], help="also at this precision (repeatable)")
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=True, help="channels_last memory format (default)")
    p.add_argument("--weights", default="weights/seg.pt", help="a state_dict or TorchScript file (default: weights/seg.pt)")
    p.add_argument("--batch-size", type=int, default=8, help="throughput at this batch (latency: batch 1; default 8)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default: 2)")
    p.add_argument("--input-size", type=_size, default=(256, 448), metavar="HxW", help="network input (default: 256x448)")
    p.add_argument("--seconds", type=float, default=6.0, help="timing per shape (default: 6)")
    p.add_argument("--images", type=int, default=32, help="held-out images the accuracy is scored on (default: 32)")
    p.add_argument("--json", action="store_true", help="print [{variant, throughput_ips, latency_ms, iou, agreement, valid, reason}]")
    p.add_argument("--out", help="write the fastest valid variant's seg archive here (F.mar)")
    p.set_defaults(run=cmd_optimize)

    p = sub.add_parser(
        "profile", parents=[common], help="py-spy flame graphs of every worker of a served target, torch.profiler traces per node"
    )
    p.add_argument("target", help="a served catalog target (seg, seg_jpeg, seg_jpeg_fused …)")
    p.add_argument("--seconds", type=float, default=10.0, help="sampling time (default: 10)")
    p.add_argument("--rate", type=int, default=100, help="py-spy samples per second (default: 100)")
    p.add_argument("--connections", type=int, default=8, help="drive the target with this many connections meanwhile; 0: no load")
    p.add_argument("--images", nargs="+", default=["samples"], help="--connections: request bodies (default: samples/)")
    p.add_argument("--out", default="results/profiles", help="profiles go to OUT/<UTC>/ (default: results/profiles)")
    p.set_defaults(run=cmd_profile)

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
    p.set_defaults(run=cmd_autoscale)

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
    p.set_defaults(run=cmd_pin)

    p = sub.add_parser(
        "bench",
        help="run a benchmark suite, `bench compare OLD NEW`, `bench ab SUITE --a REF --b REF`, `bench replay RESULTS`, "
        "`bench collect STUDY`, or `bench schema` (the suite format's JSON Schema, for editors)",
    )
    p.add_argument(
        "suite",
        nargs="+",
        metavar="SUITE.yaml | compare OLD NEW | ab SUITE.yaml | replay RESULTS | collect STUDY | schema",
        help="a suite file, or what to do (below)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the plan: points, restarts, estimated time")
    p.add_argument("--resume", metavar="DIR", help="continue a result folder, skipping finished points")
    p.add_argument("--results", default="results", help="where result folders go (default: results)")
    p.add_argument("--weights", default="weights/seg.pt", help="weights used for every seg archive")
    p.add_argument(
        "--storage",
        metavar="URL",
        help="optuna search, collect: the Optuna storage of the study; postgresql://user:password@host/db shares it between bench "
        "processes (default: study.log in the result folder)",
    )
    p.add_argument("--port-base", type=int, help="TorchServe's HTTP APIs on N, N+1, N+2, gRPC on N+3, N+4 (default: free ports)")
    p.add_argument(
        "--export",
        action="append",
        default=[],
        metavar="DEST",
        help="send the results to s3://bucket/prefix, cloudwatch://Namespace or pushgateway://host:port (repeatable)",
    )
    p.add_argument("--endpoint-url", help="--export: the S3 / CloudWatch endpoint (default: AWS's)")
    p.add_argument(
        "--heartbeat-s",
        type=int,
        default=HEARTBEAT_S,
        help=f"database storage: seconds between a running trial's heartbeats; silent for 3, it goes to another process ({HEARTBEAT_S})",
    )
    p.add_argument("--a", help="ab: the version to compare against: a git ref or a project folder")
    p.add_argument("--b", help="ab: the version under test: a git ref or a project folder (`.`: this working tree)")
    p.add_argument("--rounds", type=int, default=3, help="ab: A/B measurements of each point, interleaved (default 3)")
    p.add_argument("--b-env", action="append", default=[], metavar="NAME=VALUE", help="ab: environment of B's server (repeatable)")
    p.add_argument(
        "--min-effect", type=float, default=0.05, help="compare, ab: the smallest relative throughput change that counts (default 0.05)"
    )
    p.add_argument("--strategy", default="grid,random,optuna,auto", help="replay: strategies, comma-separated")
    p.add_argument("--budget", default="0.05,0.1,0.2", help="replay: fractions of the grid (0.1) or point counts (15), comma-separated")
    p.add_argument("--seeds", type=int, default=20, help="replay: runs of each strategy and budget, seeds 0…N-1 (default 20)")
    p.add_argument("--json", action="store_true", help='replay: print {"<strategy>": {"<budget>": {"median": x, "worst": y}}}')
    p.set_defaults(run=cmd_bench)

    p = sub.add_parser("export", help="send a result folder to s3://, cloudwatch:// or pushgateway:// (again: finishes it)")
    p.add_argument("results", metavar="RESULTS", help="a result folder written by `segserve bench`")
    p.add_argument("dest", nargs="+", metavar="DEST", help="s3://bucket/prefix, cloudwatch://Namespace, pushgateway://host:port")
    p.add_argument("--endpoint-url", help="the S3 / CloudWatch endpoint (default: AWS's)")
    p.set_defaults(run=cmd_export)

    p = sub.add_parser("results", help="`results query RESULTS...`: one table of the rows of many result folders")
    actions = p.add_subparsers(dest="action", required=True)
    q = actions.add_parser("query", help="filter, sort and cut the rows of result folders (each row with its suite and timestamp)")
    q.add_argument("results", nargs="+", metavar="RESULTS", help="result folders, or folders above them (results/)")
    q.add_argument("--where", action="append", default=[], metavar="COND", help="COLUMN OP VALUE, OP: < <= > >= = != (repeatable)")
    q.add_argument("--sort", metavar="COLUMN", help="sort by COLUMN, -COLUMN: descending")
    q.add_argument("--limit", type=int, help="at most this many rows")
    q.add_argument("--format", choices=["table", "csv", "json"], default="table", help="table (default), csv or json")
    q.add_argument("--endpoint-url", help="s3:// RESULTS: the S3 endpoint (default: AWS's)")
    q.set_defaults(run=cmd_results)
    return root


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # so `finally` blocks stop the TorchServe a command started


def _joined_sort(argv: list[str]) -> list[str]:
    """`--sort -throughput_rps` as `--sort=-throughput_rps`: argparse reads a value starting with '-' as an option."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] == "--sort" and arg.startswith("-"):
            out[-1] = f"--sort={arg}"
        else:
            out.append(arg)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(_joined_sort(sys.argv[1:] if argv is None else argv))
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return args.run(args)
    except UsageError as error:
        print("\n".join(f"error: {line}" for line in str(error).splitlines()), file=sys.stderr)
        return 2
    except RuntimeFailure as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
