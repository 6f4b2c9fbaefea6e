"""`segserve serve`: an engine (TorchServe, or Ray Serve with TorchServe's APIs) with catalog targets registered (and
the autoscaler beside it); `--stop` ends the engine that serves from --run-dir."""

from pathlib import Path

from segserve.cli.common import server_from
from segserve.engines.engine_interface import DEFAULT_ENGINE, ENGINES, RAY_PROXIES, RAY_PROXY_DEFAULT, record
from segserve.errors import UsageError
from segserve.serving.served_pipeline import DEFAULT_DAG, served_targets, start_pipeline


def add_parser(sub, common) -> None:
    p = sub.add_parser("serve", parents=[common], help="start TorchServe and register catalog targets (default: seg_jpeg's family)")
    p.add_argument("--targets", help=f"comma-separated catalog targets (default: {DEFAULT_DAG}'s members, workflow and fused twin)")
    p.add_argument("--no-targets", action="store_true", help="start with no model registered (register through the management API)")
    p.add_argument(
        "--engine",
        choices=ENGINES,
        help=f"what serves the archives (default: {DEFAULT_ENGINE}; ray: Ray Serve with TorchServe's APIs, docs/ray.md); "
        "--stop: the one started from --run-dir",
    )
    p.add_argument(
        "--ray-proxy",
        choices=RAY_PROXIES,
        help=f"--engine ray: Serve's HTTP front (default: {RAY_PROXY_DEFAULT}, stats and metrics on loopback; default: Serve's proxy)",
    )
    p.add_argument(
        "--ray-address",
        metavar="HOST:PORT",
        help="--engine ray: deploy onto this running Ray cluster (its GCS; run on one of its nodes; docs/ray.md) instead of a local Ray",
    )
    p.add_argument("--ray-shared-dir", help="--ray-address: a folder every node mounts at the same path, holding the model store")
    p.add_argument("--ray-allow-no-auth", action="store_true", help="--ray-address: deploy even onto a cluster with Ray's token auth off")
    p.add_argument("--stop", action="store_true", help="stop the server started from --run-dir")
    p.add_argument("--core-plan", help="a core plan YAML: frontend cores and per-model core slots (docs/workers-and-cores.md)")
    p.add_argument("--port-base", type=int, help="HTTP APIs on N, N+1, N+2, gRPC on N+3, N+4 (default: config.properties)")
    p.add_argument("--endpoint-url", help="--model-store s3://…: the S3 endpoint (default: AWS's)")
    p.add_argument(
        "--autoscale",
        action="store_true",
        help="also run `segserve autoscale` on the served workflow, else the fused pipeline (stopped by --stop)",
    )
    p.set_defaults(run=run)


def run(args) -> int:
    # starting: TorchServe unless --engine says otherwise; stopping: the engine recorded in --run-dir
    args.engine = args.engine or (None if args.stop else DEFAULT_ENGINE)
    if getattr(args, "ray_proxy", None) and args.engine != "ray":
        raise UsageError("--ray-proxy chooses the Ray engine's HTTP front: add --engine ray")
    if not args.stop:  # a running Ray cluster to deploy onto; --stop: the one recorded in --run-dir
        from segserve.engines.ray.cluster import from_options

        given = (getattr(args, name, None) for name in ("ray_address", "ray_shared_dir", "ray_allow_no_auth"))
        args.ray_cluster = from_options(*given)
    server = server_from(args)
    if args.stop:
        stopped = server.stop()
        print(f"{server.title} stopped from {server.run_dir}: {stopped}" if stopped else f"no {server.title} running from {server.run_dir}")
        return 0
    if args.no_targets and args.targets:
        raise UsageError("--no-targets starts with nothing registered: leave out --targets")
    targets = [] if args.no_targets else served_targets(args.targets)
    if args.model_store.startswith("s3://"):  # archives from S3 into the run dir's model store, then as usual
        from segserve.archives.model_store_s3 import fetch

        server.model_store = fetch(args.model_store, Path(args.run_dir).resolve() / "model_store", args.endpoint_url)
    # one loop per server: the first workflow served, else the first fused pipeline
    scalable = [t for t in targets if t.is_workflow] + [t for t in targets if t.is_fused]
    if args.autoscale and not scalable:
        raise UsageError(
            "--autoscale moves workers between a workflow's nodes, or a fused pipeline's workers × threads: serve one (--targets seg_jpeg)"
        )
    for target in targets:
        if refusal := server.refusal(target, autoscale=args.autoscale and target is scalable[0]):
            raise UsageError(refusal)
    record(server)
    start_pipeline(server, targets)
    endpoints = ", ".join(t.endpoint for t in targets) or "no model yet"
    print(f"serving {endpoints} at {server.url('inference')} (management {server.url('management')}); stop with `segserve serve --stop`")
    if args.autoscale:
        from segserve.autoscale.loop import start_beside

        scaled = scalable[0]
        pid = start_beside(server, args.config, scaled.name)
        what = "nodes" if scaled.is_workflow else "workers × threads"
        print(f"autoscaling {scaled.name}'s {what} (pid {pid}): decisions in {server.run_dir / 'autoscale.jsonl'}, `segserve pin --show`")
    return 0
