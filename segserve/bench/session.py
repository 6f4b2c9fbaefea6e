"""A whole suite run: the result folder, the bare-model measurement, summary, report, best/, and what the terminal shows."""

import json
import os
import platform
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import yaml

from segserve.bench import plan as planning
from segserve.bench import report
from segserve.bench.runner import Bench
from segserve.bench.schema import best
from segserve.bench.suite import Suite
from segserve.errors import UsageError
from segserve.server import render_config


def environment(root: Path) -> dict:
    from importlib.metadata import version

    cpu = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")), "?"
    )
    git = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain"], capture_output=True, text=True).stdout.strip()
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()
    return {
        "cpu_model": cpu,
        "cpu_cores": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "torch": version("torch"),
        "torchvision": version("torchvision"),
        "torchserve": version("torchserve"),
        "java": java[0] if java else "?",
        "git_sha": (git.stdout.strip() or "?") + ("-dirty" if dirty else ""),
    }


def write_best(out_dir: Path, root: Path, records: list[dict], suite: Suite) -> dict | None:
    """best/config.properties and best/seg_jpeg.yaml from the best pipeline point (else the best point of any target)."""
    constraints = {k: v.model_dump(exclude_none=True) for k, v in suite.constraints.items()}
    for target in ("seg_jpeg", "seg_jpeg_fused", "seg", "jpeg"):
        chosen = best([r for r in records if r["target"] == target], constraints, suite.objective)
        if chosen:
            break
    else:
        return None
    best_dir = out_dir / "best"
    best_dir.mkdir(exist_ok=True)
    overrides = {"number_of_netty_threads": str(chosen["netty_threads"])} if chosen.get("netty_threads") else {}
    render_config(root / "config.properties", best_dir / "config.properties", overrides)
    note = f"# Best point of this suite: {chosen['run_id']} ({chosen['target']}, {chosen['throughput_rps']:.1f} req/s)."
    if chosen.get("omp_num_threads"):
        note += f"\n# Start TorchServe with OMP_NUM_THREADS={chosen['omp_num_threads']} in its environment (workers inherit it)."
    text = (best_dir / "config.properties").read_text()
    (best_dir / "config.properties").write_text(note + "\n" + text)
    spec = yaml.safe_load((root / "workflows" / "seg_jpeg.yaml").read_text())
    spec["models"]["batch-size"] = chosen["batch_size"]
    spec["models"]["max-batch-delay"] = chosen["max_batch_delay_ms"]
    for stage in ("seg", "jpeg"):
        workers = chosen.get(f"{stage}_workers") or chosen["workers"]
        spec["models"][stage].update({"min-workers": workers, "max-workers": workers})
    (best_dir / "seg_jpeg.yaml").write_text(f"# From {chosen['run_id']} ({chosen['target']}).\n" + yaml.safe_dump(spec, sort_keys=False))
    return chosen


def run_suite(suite_path: Path, suite: Suite, root: Path, results_root: Path, weights: Path, resume: Path | None, log=print) -> Path:
    """Measure every point (skipping finished ones with --resume) and write the result folder; return it."""

    if not weights.exists():
        raise UsageError(f"{weights} is missing: run `segserve build` first (it trains the model)")
    if resume is not None:
        if not (resume / "runs").is_dir():
            raise UsageError(f"--resume {resume}: not a result folder (no runs/ inside)")
        out_dir = resume
    else:
        out_dir = results_root / suite.name / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(suite_path, out_dir / "suite.yaml")
    env_info = environment(root)
    bench = Bench(suite, root, out_dir, weights, log)
    log(planning.describe(suite, bench.points).splitlines()[-1])
    records = bench.run(env_info)
    log("measuring the bare model's forward throughput (the compute limit) …")
    bare = bench.bare_throughputs(records)
    (out_dir / "bare.json").write_text(json.dumps(bare, indent=2) + "\n")
    swept = planning.swept(bench.points)
    constraints = {k: v.model_dump(exclude_none=True) for k, v in suite.constraints.items()}
    report.write_summary(out_dir, records, swept)
    report_path = report.write_report(out_dir, suite.name, records, swept, constraints, suite.objective, bare, env_info)
    write_best(out_dir, root, records, suite)
    log(terminal_summary(records, swept, constraints, suite.objective, bare))
    log(f"results: {out_dir}  (report: {report_path})")
    return out_dir


def terminal_summary(records: list[dict], swept: list[str], constraints: dict, objective: str, bare: list[dict]) -> str:
    """What a user sees at the end of a run: every point in one table, then the efficiency table."""
    columns = ["run_id", *[p for p in swept if p != "target"], "throughput_rps", "latency_p50_ms", "latency_p99_ms"]
    columns += ["requests_failed", "server_queue_ms", "reconfigure_s", "error"]
    text = "\n" + report.render_table(records, columns)
    served = report.served_vs_bare(records, constraints, objective, bare)
    if served:
        text += "\n\nServed seg vs bare forward (best batch size per thread count):\n" + report.render_table(served, list(served[0]))
    rows = report.efficiency(records, constraints, objective, bare)
    if rows:
        text += "\n\nPipeline efficiency (best point of each target):\n"
        text += report.render_table(rows, ["pipeline", "pipeline_rps", "seg_rps", "jpeg_rps", "shared_bound_rps", "ratio_shared"])
        text += "\n\n" + report.render_table(
            rows, ["pipeline", "disjoint_bound_rps", "ratio_disjoint", "bare_rps", "ratio_bare", "bare_batch_size"]
        )
    breakdown = report.time_breakdown(records, constraints, objective)
    if breakdown:
        text += "\n\nWhere a pipeline request's time goes (ms per request; node_ms holds the queue; see report.md):\n"
        text += report.render_table(breakdown, list(breakdown[0]))
    return text
