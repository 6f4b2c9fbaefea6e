"""`segserve`: one entry point, subcommands (docs/reference/cli.md). Each command is a module of this folder
(`cmd_<name>.py`) with `add_parser(sub, common)` and `run(args)`; COMMANDS is the table of them.

Errors print one line `error: ...` and exit 2 for usage/config errors, 1 for runtime failures; a command whose
reader closes its output (`segserve … | head`) stops quietly with 141, as one that SIGPIPE ends.
"""

import argparse
import os
import signal
import sys

from segserve.cli import (
    cmd_audit,
    cmd_autoscale,
    cmd_bench,
    cmd_build,
    cmd_export,
    cmd_fuse,
    cmd_optimize,
    cmd_pin,
    cmd_predict,
    cmd_profile,
    cmd_results,
    cmd_scale,
    cmd_serve,
    cmd_token,
    cmd_train,
)
from segserve.cli.common import server_options
from segserve.errors import RuntimeFailure, UsageError
from segserve.shown_text import for_terminal

# in the order `segserve --help` lists them
COMMANDS = (
    cmd_train,
    cmd_build,
    cmd_serve,
    cmd_predict,
    cmd_token,
    cmd_scale,
    cmd_optimize,
    cmd_fuse,
    cmd_profile,
    cmd_autoscale,
    cmd_pin,
    cmd_bench,
    cmd_export,
    cmd_results,
    cmd_audit,
)


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="segserve", description=__doc__.splitlines()[0])
    sub = root.add_subparsers(dest="command", required=True)
    common = server_options()
    for command in COMMANDS:
        command.add_parser(sub, common)
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
    argv = cmd_bench.with_run_action(_joined_sort(sys.argv[1:] if argv is None else argv))
    args = parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        status = args.run(args)
        sys.stdout.flush()  # here, so that a reader gone before the last bytes is met below, not at exit
        return status
    except BrokenPipeError:  # `segserve … | head`: the reader has what it wanted; no traceback, no flush at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE  # 141, as a command that SIGPIPE ended
    except UsageError as error:
        print("\n".join(f"error: {for_terminal(line)}" for line in str(error).split("\n")), file=sys.stderr)
        return 2
    except RuntimeFailure as error:  # it may quote a worker or a log: each line shown, its escapes not obeyed
        print("error: " + "\n".join(map(for_terminal, str(error).split("\n"))), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 1
