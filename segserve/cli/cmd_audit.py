"""`segserve audit`: a TorchServe config.properties (and, given its management address, the running server) checked
against the security rules of docs/security.md; `--run-dir DIR`: the engine `segserve serve` runs from DIR (TorchServe:
its config, management API and key file; the Ray engine: segserve/audit/ray_engine.py). Exit 1 on a High finding."""

import json
import os
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

from segserve.archives.archive_urls import masked
from segserve.errors import UsageError

# a finding not on a line
PLACES = {"default": "default", "server": "the server", "installed": "installed torchserve", "run folder": "the run folder"}


def add_parser(sub, common) -> None:
    p = sub.add_parser(
        "audit", help="check a TorchServe config.properties (and a running server), or a run folder's engine, against the security rules"
    )
    p.add_argument("config", nargs="?", metavar="CONFIG.properties", help="the file torchserve --ts-config reads (empty: the defaults)")
    p.add_argument(
        "--run-dir",
        metavar="DIR",
        help="instead: the running engine `segserve serve` started from DIR (TorchServe: its config, management API and keys; "
        "the Ray engine: its token auth, key files, dashboard, HAProxy and every listener)",
    )
    p.add_argument(
        "--management", metavar="URL", help="the running server's management API (http://127.0.0.1:8081): its version, a tokenless GET"
    )
    p.add_argument("--token-file", metavar="F", help="the server's key_file.json: its management key, to list the served models")
    p.add_argument("--json", action="store_true", help="one JSON object: the version, the models and every finding")
    p.set_defaults(run=run)


def run(args) -> int:
    from segserve.audit import live
    from segserve.audit.config_file import read_config
    from segserve.audit.security_rules import audit

    if args.run_dir:
        if args.config or args.management or args.token_file:
            raise UsageError(
                "--run-dir audits the engine serving from it, its config and keys: leave out CONFIG, --management, --token-file"
            )
        return _run_folder(args)
    if not args.config:
        raise UsageError("give a TorchServe CONFIG.properties, or --run-dir DIR of a running engine")
    if args.token_file and not args.management:
        raise UsageError("--token-file goes with --management URL (the server the keys are for)")
    config = read_config(Path(args.config), os.environ)  # TorchServe reads $$NAME$$ and TS_* from its environment
    models = None
    if args.management:
        view = live.observe(args.management, Path(args.token_file) if args.token_file else None)
        version, source, models = view.version, "server", view.models
        observed = {"answers_without_token": str(view.answers_without_token).lower()}
    else:
        version, source, observed = _installed_torchserve(), "installed", {}
    findings = audit(config, observed | ({"version": version} if version else {}), source)
    where = {"server": f"at {masked(args.management or '')}", "installed": "installed here"}[source]
    heading = f"{args.config}: TorchServe {version or 'of unknown version'} ({where})"
    report = {"config": args.config, "torchserve": version, "version_from": source}
    return _print(args, heading, report, models, findings)


def _print(args, heading: str, report: dict, models: list[str] | None, findings: list) -> int:
    """The findings after one heading line (--json: one object), High first; the exit status: 1 on a High one."""
    from segserve.audit.security_rules import SEVERITIES

    counts = {severity: sum(f.severity == severity for f in findings) for severity in SEVERITIES}
    if args.json:
        print(json.dumps(report | {"models": models, "counts": counts, "findings": [asdict(f) for f in findings]}, indent=2))
    else:
        served = "" if models is None else f"; serving {len(models)} model(s): {', '.join(models) or '-'}"
        total = ", ".join(f"{n} {severity}" for severity, n in counts.items())
        print(f"{heading}{served}; {len(findings)} finding(s): {total}")
        for finding in findings:
            place = f"line {finding.line}" if isinstance(finding.line, int) else PLACES.get(finding.line, f"environment {finding.line}")
            print(f"{finding.severity:6s}  {finding.key} ({place}): {finding.rule}\n        fix: {finding.fix}")
    return 1 if counts["High"] else 0


def _run_folder(args) -> int:
    """The engine `segserve serve` runs from --run-dir, audited by its own rules."""
    from segserve.engines.engine_interface import open_engine

    run_dir = Path(args.run_dir).resolve()
    engine = open_engine(None, run_dir, model_store=run_dir, config=run_dir / "config.properties")
    return {"torchserve": _torchserve_folder, "ray": _ray_folder}[engine.engine](args, engine)


def _torchserve_folder(args, engine) -> int:
    """TorchServe's own config of the run folder, its management API and key file: `audit CONFIG --management URL --token-file F`."""
    if not engine.config_path.exists():
        raise UsageError(f"--run-dir {engine.run_dir}: no config.properties: is it a run folder of `segserve serve`?")
    args.config, args.management, args.token_file = str(engine.config_path), engine.url("management"), str(engine.key_file)
    args.run_dir = None
    return run(args)


def _ray_folder(args, engine) -> int:
    from segserve.audit.ray_engine import audit_ray, installed_versions, observe

    findings = audit_ray(observe(engine))
    versions = installed_versions()
    named = ", ".join(f"{package} {version or 'not installed'}" for package, version in versions.items())
    heading = f"{engine.run_dir}: {engine.title} ({named} installed here: the audit knows no advisory of theirs; no Java, no netty)"
    report = {"run_dir": str(engine.run_dir), "engine": engine.engine, "versions": versions}
    return _print(args, heading, report, engine.models(), findings)


def _installed_torchserve() -> str | None:
    """The torchserve beside segserve: the server this config is for, when no --management names a running one."""
    try:
        return metadata.version("torchserve")
    except metadata.PackageNotFoundError:
        return None
