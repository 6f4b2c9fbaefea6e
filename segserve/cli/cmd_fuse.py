"""`segserve fuse`: a workflow archive as one model archive whose handler runs the DAG in one worker (docs/fuse.md)."""

import argparse
import re
from pathlib import Path

from segserve.bench.suite.target_spec import ENV_NAME
from segserve.fuse import fuse
from segserve.fuse.fused_plan import ROW_ERRORS


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
    p.add_argument(
        "--worker-env",
        nargs="+",
        action="extend",
        default=[],
        type=variable_name,
        metavar="NAME",
        help="variables of this environment that the import check of the .war's handlers gets, as a suite's archive "
        "target's worker_env: (they get only what TorchServe needs otherwise, and a scratch HOME)",
    )
    p.set_defaults(run=run)


def variable_name(name: str) -> str:
    if not re.match(ENV_NAME, name):
        raise argparse.ArgumentTypeError(f"{name!r}: an environment variable's name (letters, digits and '_')")
    return name


def run(args) -> int:
    fuse(args.war, args.model_store, args.out, row_errors=args.row_errors, worker_env=args.worker_env)
    return 0
