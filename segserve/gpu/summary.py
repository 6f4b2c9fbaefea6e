"""The steps of gpu_bundle/run.sh that need the project (docs/gpu.md):

    python -m segserve.gpu.summary serve SERVE.json    a real TorchServe with seg, jpeg, the workflow and the fused
                                                       pipeline; the samples through both; where each worker runs
    python -m segserve.gpu.summary bench RESULTS       benchmarks/gpu.yaml (fp32 where CUDA is absent)

and write_summary (`python -m segserve.gpu.bundle summary WORK OUT`): summary.json and summary.txt of a run.
write_summary needs only the standard library (torch and yaml are imported where they are used): the summary comes
back even from a run whose venv step failed or ran out of time.
"""

import json
import os
import signal
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from segserve import ROOT
from segserve.bench.results.store import read_runs, read_summary

SUITE = ROOT / "benchmarks" / "gpu.yaml"
GOALS = {"workflow": 0.9, "fused": 0.95}  # a pipeline's throughput ÷ its slower member's, by kind


def pipelines() -> tuple[list[str], dict[str, float]]:
    """The default DAG's members, and its workflow and fused twin with their goals: from the catalog."""
    from segserve.archives.catalog import FUSED_SUFFIX, Catalog
    from segserve.serving.launch import DEFAULT_DAG

    workflow = Catalog(ROOT).target(DEFAULT_DAG, "workflow")
    return list(workflow.members), {workflow.name: GOALS["workflow"], workflow.name + FUSED_SUFFIX: GOALS["fused"]}


def serve(out_json: Path) -> int:
    """Serve the default DAG's family on free ports, send samples/ through the workflow and the fused pipeline,
    record the answers and each worker's device; 1 when a request failed or a worker is off the GPU."""
    import torch

    from segserve.archives.catalog import Catalog
    from segserve.serving.client import predict
    from segserve.serving.launch import served_targets, start_pipeline
    from segserve.serving.server import TorchServe

    images = sorted((ROOT / "samples").glob("*.jpg"))
    report = {"cuda": torch.cuda.is_available(), "targets": {}, "workers": {}}
    with tempfile.TemporaryDirectory() as scratch:
        server = TorchServe(
            run_dir=Path(scratch) / "ts", model_store=ROOT / "model_store", config_template=ROOT / "config.properties", free_ports=True
        )
        targets = served_targets(None)
        start_pipeline(server, targets)
        try:
            catalog = Catalog(ROOT)
            for name in pipelines()[1]:
                out = Path(scratch) / name
                failed = predict(server.url("inference"), server.token("inference"), images, out, catalog.target(name))
                answers = sorted(out.glob("*"))
                report["targets"][name] = {
                    "sent": len(images),
                    "failed": failed,
                    "jpegs": sum(a.read_bytes()[:2] == b"\xff\xd8" for a in answers),
                }
            for model in sorted({m for t in targets for m in t.models}):
                report["workers"][model] = [
                    {"pid": w.get("pid"), "gpu": bool(w.get("gpu")), "gpu_usage": w.get("gpuUsage"), "status": w.get("status")}
                    for w in server.describe(model).get("workers", [])
                ]
        finally:
            server.stop()
    out_json.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    failed = any(t["failed"] or t["jpegs"] != t["sent"] for t in report["targets"].values())
    off_gpu = report["cuda"] and not all(w["gpu"] for ws in report["workers"].values() for w in ws)
    if off_gpu:
        print("some workers are not on the GPU (TorchServe's describe: gpu false)")
    return 1 if failed or off_gpu else 0


# Without CUDA (the dry run) the benchmark checks the plumbing, not the numbers: a lighter load that measures every
# target and column in about a third of the time (128 connections on 2 CPU cores answer in seconds, and each
# window waits for them). No window or bare-forward slice is measured again for what other processes took
# (max_others_share 1.0): a dry run beside other work (make test) spent half its bench step re-measuring numbers
# that nobody reads. (So a dry run's points are never flagged disturbed: its numbers are not the check.)
DRY_RUN_LOAD = {"warmup_s": 0.5, "window_s": 1.0, "stable_windows": 2, "max_windows": 2, "bare_forward_s": 0.6, "max_others_share": 1.0}
# without CUDA the dry run checks that every step runs, not how fast: batches of 32 on 2 cores took 1.6 s each,
# longer than a window, and the step 125 s; batches of 4 at 8 connections fit a window several times over
DRY_RUN_CONCURRENCY, DRY_RUN_BATCH_SIZE = [8], [4]


def bench(results: Path) -> int:
    """benchmarks/gpu.yaml; without CUDA in fp32 (fp16 convolutions on a CPU run at about 1 req/s: they would
    measure nothing and outlast the step's timeout) and with DRY_RUN_LOAD."""
    import torch
    import yaml

    from segserve.cli import main

    suite = SUITE
    if not torch.cuda.is_available():
        spec = yaml.safe_load(SUITE.read_text())
        spec["grid"]["archive"]["precision"] = ["fp32"]
        spec["grid"]["load"]["concurrency"] = DRY_RUN_CONCURRENCY
        spec["grid"]["archive"]["batch_size"] = DRY_RUN_BATCH_SIZE
        spec["load"].update(DRY_RUN_LOAD)
        suite = Path(tempfile.mkdtemp()) / "gpu.yaml"  # same name: the result folder is results/gpu/<time>
        suite.write_text(yaml.safe_dump(spec, sort_keys=False))
        dry = f"batch {DRY_RUN_BATCH_SIZE[0]}, {DRY_RUN_CONCURRENCY[0]} connections, short windows"
        print(f"CUDA absent: {SUITE.name} in fp32, {dry} ({suite})")
    return main(["bench", str(suite), "--results", str(results)])


def _tests(xml_path: Path) -> dict:
    if not xml_path.exists():
        return {"ran": False}
    cases = ElementTree.parse(xml_path).getroot().iter("testcase")
    outcome = {"passed": 0, "failed": 0, "skipped": 0, "skip_reasons": []}
    for case in cases:
        if case.find("skipped") is not None:
            outcome["skipped"] += 1
            outcome["skip_reasons"].append(f"{case.get('name')}: {case.find('skipped').get('message', '')}")
        elif case.find("failure") is not None or case.find("error") is not None:
            outcome["failed"] += 1
        else:
            outcome["passed"] += 1
    outcome["skip_reasons"] = sorted(set(outcome["skip_reasons"]))
    return {"ran": True, **outcome}


def _benchmark(results: Path) -> dict:
    """Per target: throughput, p99, failures, and the device→host bytes of each node per request."""
    folders = sorted(results.glob("gpu/*/summary.jsonl"))
    if not folders:
        return {}
    import yaml  # there are results: the venv step worked, and yaml is in it

    folder = folders[-1].parent
    rows, runs = read_summary(folder), read_runs(folder)
    # the suite's one precision (records name only the parameters that vary)
    precision = (yaml.safe_load((folder / "suite.yaml").read_text())["grid"]["archive"].get("precision") or ["fp32"])[0]
    targets = {}
    for row in rows:
        stages = runs.get(row["run_id"], {}).get("server_stages") or {}
        targets[row["target"]] = {
            "throughput_rps": row.get("throughput_rps"),
            "throughput_ci_rps": [row.get("throughput_ci_low_rps"), row.get("throughput_ci_high_rps")],
            "latency_p99_ms": row.get("latency_p99_ms"),
            "requests_ok": row.get("requests_ok"),
            "requests_failed": row.get("requests_failed"),
            "precision": row.get("precision", precision),
            "device_to_host_bytes_per_request": row.get("bytes_device_to_host_per_request"),
            "nodes": {
                node: {"device_to_host_bytes": s.get("device_to_host_bytes", 0.0), "response_bytes": s.get("response_bytes")}
                for node, s in stages.items()
            },
            "error": row.get("error"),
        }
    return {"folder": str(folder), "targets": targets}


def _goals(bench: dict, cuda: bool) -> dict:
    """The issue's goals: pipelines against the slower member; device→host bytes the class map or the JPEG."""
    targets = bench.get("targets", {})
    goals = {}
    names, goals_by_pipeline = pipelines() if targets else ([], {})  # (the catalog needs yaml: the venv's)
    members = [targets.get(m, {}).get("throughput_rps") for m in names]
    if members and all(members):
        slower = min(members)
        for name, goal in goals_by_pipeline.items():
            rate = targets.get(name, {}).get("throughput_rps")
            if rate:
                goals[f"{name}_over_slower_member"] = {"ratio": round(rate / slower, 3), "goal": goal, "met": rate / slower >= goal}
    logits = 2 * 256 * 448 * 2  # 2 classes, fp16: what copying logits would cost per request
    checks = {}
    for name, target in targets.items():
        for node, counters in target["nodes"].items():
            copied, answered = counters["device_to_host_bytes"], counters["response_bytes"]
            # seg answers the class map (plus an 18-byte header), jpeg and the fused pipeline the JPEG: on the GPU each
            # copies what it answers and nothing else; on a CPU nothing is copied
            same = answered is not None and abs(copied - answered) <= max(64.0, 0.01 * answered)
            checks[f"{name}/{node}"] = {
                "device_to_host": copied,
                "answered": answered,
                "met": same if cuda else copied == 0,
                "logits_would_be": logits,
            }
    goals["device_to_host_is_the_answer"] = {"nodes": checks, "met": bool(checks) and all(c["met"] for c in checks.values())}
    return goals


def write_summary(work: Path, out: Path) -> int:
    facts = json.loads((work / "facts.json").read_text()) if (work / "facts.json").exists() else {}
    # a step run again (run.sh's STEPS) appends its line: the last one per step stands, in run order; an earlier
    # run's own summary line is not a step of this one
    recorded = {}
    for step in map(json.loads, filter(str.strip, (work / "steps.jsonl").read_text().splitlines())):
        if step["step"] != "summary":
            recorded[step["step"]] = step
    steps = list(recorded.values())
    serve_report = json.loads((work / "serve.json").read_text()) if (work / "serve.json").exists() else {}
    bench = _benchmark(work / "results")
    summary = {
        "facts": facts,
        "steps": steps,
        "gpu_tests": _tests(work / "gpu_tests.xml"),
        "serve": serve_report,
        "benchmark": bench,
        "goals": _goals(bench, bool(facts.get("cuda"))),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    if bench:
        for suffix in ("summary.jsonl", "report.md"):
            source = Path(bench["folder"]) / suffix
            if source.exists():
                (out / f"bench_{suffix}").write_bytes(source.read_bytes())
    (out / "summary.txt").write_text(summary_text(summary))
    return 0


def _step_text(step: dict) -> str:
    outcome = "ok" if step["rc"] == 0 else f"FAILED rc={step['rc']}"
    return f"{step['step']} {outcome} {step['seconds']:.0f}s"


def summary_text(summary: dict) -> str:
    facts = summary["facts"]
    mode = "DRY RUN (no CUDA)" if facts.get("dry_run") else ("GPU" if facts.get("cuda") else "NO CUDA")
    lines = [
        f"segserve GPU check: {mode}",
        f"python {facts.get('python')}  torch {facts.get('torch')}  torchvision {facts.get('torchvision')}  "
        f"device {facts.get('device', '-')}  java {facts.get('java', '-')}  bundle of {facts.get('bundle_commit', '?')}",
        "",
        "steps: " + ", ".join(_step_text(s) for s in summary["steps"]),
    ]
    tests = summary["gpu_tests"]
    if tests.get("ran"):
        lines.append(f"gpu tests: {tests['passed']} passed, {tests['failed']} failed, {tests['skipped']} skipped")
        lines += [f"  skipped {reason}" for reason in tests["skip_reasons"][:3]]
    for name, target in summary["serve"].get("targets", {}).items():
        lines.append(f"served {name}: {target['jpegs']}/{target['sent']} samples answered with a JPEG, {target['failed']} failed")
    workers = summary["serve"].get("workers", {})
    if workers:
        lines.append("workers on the GPU: " + ", ".join(f"{m} {sum(w['gpu'] for w in ws)}/{len(ws)}" for m, ws in workers.items()))
    targets = summary["benchmark"].get("targets", {})
    if targets:
        lines += ["", f"{'target':16s} {'req/s':>8s} {'p99 ms':>8s} {'failed':>6s} {'d2h B/req':>10s}  precision"]
        for name, t in targets.items():
            rate, p99, d2h = t["throughput_rps"] or 0, t["latency_p99_ms"] or 0, t["device_to_host_bytes_per_request"] or 0
            lines.append(f"{name:16s} {rate:8.1f} {p99:8.0f} {t['requests_failed'] or 0:6d} {d2h:10.0f}  {t['precision']}")
    for name, goal in summary["goals"].items():
        if "ratio" in goal:
            lines.append(f"{name}: {goal['ratio']:.2f} (goal ≥ {goal['goal']}) {'met' if goal['met'] else 'NOT met'}")
    d2h = summary["goals"].get("device_to_host_is_the_answer", {})
    if d2h.get("nodes"):
        verdict = ("met" if d2h["met"] else "NOT met") if facts.get("cuda") else "no GPU: nothing copied"
        lines.append(f"device→host bytes per request = the node's answer (class map or JPEG), never logits: {verdict}")
        lines += [f"  {node}: copied {c['device_to_host']:.0f} B, answered {c['answered'] or 0:.0f} B" for node, c in d2h["nodes"].items()]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] not in ("serve", "bench"):
        print(__doc__, file=sys.stderr)
        return 2
    os.chdir(ROOT)
    # run.sh's timeout ends a step with SIGTERM: exit through the finally blocks, which stop TorchServe (it runs in a
    # session of its own, so it would outlive this process and hold the GPU and cores for the next steps)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return serve(Path(argv[1])) if argv[0] == "serve" else bench(Path(argv[1]))


if __name__ == "__main__":
    sys.exit(main())
