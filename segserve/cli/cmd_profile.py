"""`segserve profile`: py-spy flame graphs of a served target's workers and torch.profiler traces per node."""

from pathlib import Path

from segserve.cli.common import image_files, running_server
from segserve.errors import UsageError
from segserve.serving.served_pipeline import catalog


def add_parser(sub, common) -> None:
    p = sub.add_parser(
        "profile", parents=[common], help="py-spy flame graphs of every worker of a served target, torch.profiler traces per node"
    )
    p.add_argument("target", help="a served catalog target (seg, seg_jpeg, seg_jpeg_fused …)")
    p.add_argument("--seconds", type=float, default=10.0, help="sampling time (default: 10)")
    p.add_argument("--rate", type=int, default=100, help="py-spy samples per second (default: 100)")
    p.add_argument("--connections", type=int, default=8, help="drive the target with this many connections meanwhile; 0: no load")
    p.add_argument("--images", nargs="+", default=["samples"], help="--connections: request bodies (default: samples/)")
    p.add_argument("--out", default="results/profiles", help="profiles go to OUT/<UTC>/ (default: results/profiles)")
    p.set_defaults(run=run)


def run(args) -> int:
    from segserve.bench.run.profiler import profile

    if args.seconds <= 0 or args.connections < 0 or args.rate <= 0:
        raise UsageError("--seconds and --rate must be positive and --connections ≥ 0")
    target = catalog().target(args.target)
    server = running_server(args, target.name, "profile")
    bodies = [path.read_bytes() for path in image_files(args.images)] if args.connections else []
    summary = profile(server, target, server.run_dir, args.seconds, Path(args.out), bodies, args.connections, args.rate)
    print((Path(summary["folder"]) / "report.md").read_text())
    print(f"profile: {summary['folder']}")
    return 1 if summary["errors"] else 0
