"""A pipeline served: which catalog targets (`--targets`, default the default DAG's family), started on a TorchServe
with their archives registered and every model READY, or stopped again."""

from pathlib import Path

from segserve.errors import UsageError

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
    check_archives(server, targets)
    server.start(log=log)
    try:
        register(server, targets, log)
    except BaseException:
        server.stop()
        raise


def check_archives(server, targets: list) -> None:
    for target in targets:
        if not (server.model_store / target.archive).exists():
            raise UsageError(f"{server.model_store / target.archive} is missing: run `segserve build` first")


def register(server, targets: list, log=print) -> None:
    """The targets' archives registered on a running server, every model of them READY."""
    from segserve.archives.build import COMPILED_STARTUP_TIMEOUT_S

    for target in targets:
        if target.is_workflow:
            server.register_workflow(target.archive, target.name, log=log)
        else:
            server.register_model(target.archive, target.name, log=log)
    for target in targets:
        for model in target.models:
            server.wait_ready(model, COMPILED_STARTUP_TIMEOUT_S)  # a worker that compiles its network loads for minutes
