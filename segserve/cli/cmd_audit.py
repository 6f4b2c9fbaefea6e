"""`segserve audit`: a TorchServe config.properties (and, given its management address, the running server) checked
against the security rules of docs/security.md. Exit 1 on a High finding."""

import json
import os
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

from segserve.archives.archive_urls import masked
from segserve.errors import UsageError

PLACES = {"default": "default", "server": "the server", "installed": "installed torchserve"}  # a finding not on a line


def add_parser(sub, common) -> None:
    p = sub.add_parser("audit", help="check a TorchServe config.properties (and a running server) against the security rules")
    p.add_argument("config", metavar="CONFIG.properties", help="the file torchserve --ts-config reads (empty: the defaults)")
    p.add_argument(
        "--management", metavar="URL", help="the running server's management API (http://127.0.0.1:8081): its version, a tokenless GET"
    )
    p.add_argument("--token-file", metavar="F", help="the server's key_file.json: its management key, to list the served models")
    p.add_argument("--json", action="store_true", help="one JSON object: the version, the models and every finding")
    p.set_defaults(run=run)


def run(args) -> int:
    from segserve.audit import live
    from segserve.audit.config_file import read_config
    from segserve.audit.security_rules import SEVERITIES, audit

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
    counts = {severity: sum(f.severity == severity for f in findings) for severity in SEVERITIES}
    if args.json:
        report = {"config": args.config, "torchserve": version, "version_from": source, "models": models, "counts": counts}
        print(json.dumps(report | {"findings": [asdict(f) for f in findings]}, indent=2))
    else:
        where = {"server": f"at {masked(args.management or '')}", "installed": "installed here"}[source]
        served = "" if models is None else f"; serving {len(models)} model(s): {', '.join(models) or '-'}"
        total = ", ".join(f"{n} {severity}" for severity, n in counts.items())
        print(f"{args.config}: TorchServe {version or 'of unknown version'} ({where}){served}; {len(findings)} finding(s): {total}")
        for finding in findings:
            place = f"line {finding.line}" if isinstance(finding.line, int) else PLACES.get(finding.line, f"environment {finding.line}")
            print(f"{finding.severity:6s}  {finding.key} ({place}): {finding.rule}\n        fix: {finding.fix}")
    return 1 if counts["High"] else 0


def _installed_torchserve() -> str | None:
    """The torchserve beside segserve: the server this config is for, when no --management names a running one."""
    try:
        return metadata.version("torchserve")
    except metadata.PackageNotFoundError:
        return None
