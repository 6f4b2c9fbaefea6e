"""What several commands share: the server options, the server they name, and image arguments."""

import argparse
from pathlib import Path

from segserve.errors import RuntimeFailure, UsageError

DEFAULT_RUN_DIR = Path(".segserve")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


def server_options() -> argparse.ArgumentParser:
    """--model-store, --config, --run-dir: the options of every command that builds, serves or talks to a server."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--model-store", default="model_store", help="archive folder (default: model_store); serve: also s3://bucket/prefix"
    )
    common.add_argument("--config", default="config.properties", help="TorchServe config (default: config.properties)")
    common.add_argument("--run-dir", default=str(DEFAULT_RUN_DIR), help="server state: key file, logs, pid (default: .segserve)")
    return common


def server_from(args):
    """The server of these options: `--engine`'s where the command takes it (serve), else the one `segserve serve`
    started from --run-dir (segserve/engines/engine_interface.py)."""
    from segserve.engines.engine_interface import open_engine

    config = Path(args.config)
    if not config.exists():
        raise UsageError(f"--config {config}: no such file (run from the repository root or pass --config)")
    return open_engine(
        getattr(args, "engine", None),
        run_dir=Path(args.run_dir).resolve(),
        model_store=Path(args.model_store),
        config=config,
        port_base=getattr(args, "port_base", None),
        core_plan=Path(args.core_plan) if getattr(args, "core_plan", None) else None,
        ray_proxy=getattr(args, "ray_proxy", None),
        ray_cluster=getattr(args, "ray_cluster", None),  # serve --ray-address (cmd_serve.py)
    )


def running_server(args, targets: str, command: str):
    """The server of --run-dir, or one line saying how to start it (commands that work on a live server), or why
    `command` does not act on its engine (engine_interface.refuse_command)."""
    from segserve.engines.engine_interface import DEFAULT_ENGINE, refuse_command
    from segserve.serving import processes

    server = server_from(args)
    refuse_command(server, command)
    if not server.config_path.exists() or not processes.server_processes(server.run_dir):
        engine = "" if server.engine == DEFAULT_ENGINE else f" --engine {server.engine}"
        title = server.title.removeprefix("the ")  # "no Ray engine runs from", "no TorchServe runs from"
        raise RuntimeFailure(f"no {title} runs from {server.run_dir}: start it with `segserve serve{engine} --targets {targets}`")
    return server


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
