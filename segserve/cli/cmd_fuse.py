"""`segserve fuse`: a workflow archive as one model archive whose handler runs the DAG in one worker (docs/fuse.md)."""

from pathlib import Path

from segserve.fuse import fuse
from segserve.fuse.war import ROW_ERRORS


def add_parser(sub, common) -> None:
    p = sub.add_parser("fuse", help="write one .mar that runs a workflow's DAG inside one worker")
    p.add_argument("war", type=Path, help="the workflow archive (.war)")
    p.add_argument("--model-store", type=Path, required=True, help="the folder with the .mar files its nodes name")
    p.add_argument("--out", type=Path, help="the .mar to write (its name is the model's); default <model-store>/fused_<workflow>.mar")
    p.add_argument(
        "--row-errors",
        choices=ROW_ERRORS,
        default="workflow",
        help="a row a node refuses or fails: answered as /wfpredict answers it (workflow: the node's status dropped, "
        "a failure answered 500 'Error executing <node>'), or stopped at that node with its status and body (node)",
    )
    p.set_defaults(run=run)


def run(args) -> int:
    fuse(args.war, args.model_store, args.out, row_errors=args.row_errors)
    return 0
