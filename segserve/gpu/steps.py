"""The steps of gpu_bundle/run.sh that need the project (docs/gpu.md):

    python -m segserve.gpu.steps serve SERVE.json      a real TorchServe with seg, jpeg, the workflow and the fused
                                                       pipeline; the samples through both; where each worker runs;
                                                       hostile and odd inputs against the CPU's answers
                                                       (segserve/gpu/hostile.py, hostile.json beside SERVE.json);
                                                       py-spy on the fused worker under load (profile.md)
    python -m segserve.gpu.steps bench RESULTS         benchmarks/gpu.yaml (fp32 where CUDA is absent)

(segserve/gpu/summary.py writes the run's summary from what these steps leave in WORK.)
"""

import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from segserve import ROOT

# sampled span of the fused worker's profile, on a GPU and in the dry run
PROFILE_S, DRY_RUN_PROFILE_S = 8.0, 1.0
# the dry run's profile load: a shorter warm-up than the profiler's 2 s (the spans before, during and after are each
# DRY_RUN_PROFILE_S) and 16 connections, not 128 (on 2 CPU cores 16 keep the fused worker's batches full): about 5 s
# in all where the GPU run's settings took 11 s. A second of samples at 100 Hz still names the handler's functions.
DRY_RUN_PROFILE_WARM_S, DRY_RUN_PROFILE_CONNECTIONS = 0.5, 16

SUITE = ROOT / "benchmarks" / "gpu.yaml"
GOALS = {"workflow": 0.9, "fused": 0.95}  # a pipeline's throughput ÷ its slower member's, by kind


def pipelines() -> tuple[list[str], dict[str, float]]:
    """The default DAG's members, and its workflow and fused twin with their goals: from the catalog."""
    from segserve.archives.catalog import FUSED_SUFFIX, Catalog
    from segserve.serving.served_pipeline import DEFAULT_DAG

    workflow = Catalog(ROOT).target(DEFAULT_DAG, "workflow")
    return list(workflow.members), {workflow.name: GOALS["workflow"], workflow.name + FUSED_SUFFIX: GOALS["fused"]}


def serve(out_json: Path) -> int:
    """Serve the default DAG's family on free ports, send samples/ through the workflow and the fused pipeline,
    record the answers and each worker's device; 1 when a request failed or a worker is off the GPU."""
    import torch

    from segserve.archives.catalog import Catalog
    from segserve.gpu import hostile
    from segserve.serving.client import predict
    from segserve.serving.served_pipeline import served_targets, start_pipeline
    from segserve.serving.server import TorchServe

    images = sorted((ROOT / "samples").glob("*.jpg"))
    report = {"cuda": torch.cuda.is_available(), "targets": {}, "workers": {}, "seconds": {}}
    began = time.monotonic()

    def took(part: str) -> None:  # how the step's time is split (docs/gpu.md)
        nonlocal began
        report["seconds"][part] = round(time.monotonic() - began, 1)
        print(f"serve: {part} took {report['seconds'][part]} s", flush=True)
        began = time.monotonic()

    with tempfile.TemporaryDirectory() as scratch:
        server = TorchServe(
            run_dir=Path(scratch) / "ts", model_store=ROOT / "model_store", config_template=ROOT / "config.properties", free_ports=True
        )
        targets = served_targets(None)
        start_pipeline(server, targets)
        took("start")
        with server:  # stopped, every process of it, however the block ends
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
            took("samples")
            out_json.write_text(json.dumps(report, indent=2))  # what is known so far, should a later part overrun
            report["hostile"] = hostile.check(server, targets, ROOT / "model_store")
            took("hostile")
            hostile_rows = report["hostile"].pop("rows")
            (out_json.parent / "hostile.json").write_text(json.dumps(hostile_rows, indent=2))
            out_json.write_text(json.dumps(report, indent=2))
            fused = catalog.target(list(pipelines()[1])[-1])  # the workflow's fused twin
            report["profile"] = profile_fused(server, fused, Path(scratch), out_json.parent)
            took("profile")
    out_json.write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "hostile"}, indent=2))
    failed = any(t["failed"] or t["jpegs"] != t["sent"] for t in report["targets"].values())
    off_gpu = report["cuda"] and not all(w["gpu"] for ws in report["workers"].values() for w in ws)
    if off_gpu:
        print("some workers are not on the GPU (TorchServe's describe: gpu false)")
    found = report["hostile"]
    wrong = found["mismatches"] or found["workers_killed"]
    if wrong:
        print(f"hostile inputs: {len(found['mismatches'])} answered otherwise than on the CPU, {found['workers_killed']} worker(s) killed")
    return 1 if failed or off_gpu or wrong else 0


def profile_fused(server, target, scratch: Path, keep: Path) -> dict:
    """py-spy on the fused worker under the bench's load (raw FP16 bodies, 128 connections), with the profiler's own
    cost; its report.md kept as profile.md. Errors are the profile's, not the step's (py-spy may not run here)."""
    import shutil

    import torch

    from segserve.bench.run.profiler import profile

    bodies = [torch.randn(3, 256, 448, generator=torch.Generator().manual_seed(i)).half().numpy().tobytes() for i in range(8)]
    if torch.cuda.is_available():
        seconds, connections, warm = PROFILE_S, 128, {}
    else:
        seconds, connections, warm = DRY_RUN_PROFILE_S, DRY_RUN_PROFILE_CONNECTIONS, {"warm_s": DRY_RUN_PROFILE_WARM_S}
    try:
        summary = profile(server, target, server.run_dir, seconds, scratch / "profiles", bodies, connections, 100, **warm)
    except Exception as error:
        return {"error": f"{type(error).__name__}: {error}"[:400]}
    shutil.copy(Path(summary["folder"]) / "report.md", keep / "profile.md")
    kept = ("throughput_rps", "profiler_cost_pct", "requests_failed", "errors", "handler_costs", "top_functions")
    return {k: summary.get(k) for k in kept}


# Without CUDA (the dry run) the benchmark checks the plumbing, not the numbers: a lighter load that measures every
# target and column in about a third of the time (128 connections on 2 CPU cores answer in seconds, and each
# window waits for them). No window or bare-forward slice is measured again for what other processes took
# (max_others_share 1.0): a dry run beside other work (make test) spent half its bench step re-measuring numbers
# that nobody reads. (So a dry run's points are never flagged disturbed: its numbers are not the check.) Windows of
# 0.5 s (about 35 requests each at 8 connections) and 0.3 s of bare forward a shape (each slice runs one batch at
# least; its process's start is most of its time): 5 s less of the step than windows of 1 s and 0.6 s.
DRY_RUN_LOAD = {
    "warmup_s": 0.5,
    "fresh_workers_warmup_s": 0.0,
    "window_s": 0.5,
    "stable_windows": 2,
    "max_windows": 2,
    "stability_tolerance": 0.15,
    "bare_forward_s": 0.3,
    "max_others_share": 1.0,
    "client_processes": 1,
}
# without CUDA the dry run checks that every step runs, not how fast: batches of 32 on 2 cores took 1.6 s each,
# longer than a window, and the step 125 s; batches of 4 at 8 connections fit a window several times over
DRY_RUN_CONCURRENCY, DRY_RUN_BATCH_SIZE, DRY_RUN_WORKERS = [8], [4], [1]


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
        spec["grid"]["runtime"]["workers"] = DRY_RUN_WORKERS
        spec["load"].update(DRY_RUN_LOAD)
        suite = Path(tempfile.mkdtemp()) / "gpu.yaml"  # same name: the result folder is results/gpu/<time>
        suite.write_text(yaml.safe_dump(spec, sort_keys=False))
        dry = f"batch {DRY_RUN_BATCH_SIZE[0]}, {DRY_RUN_CONCURRENCY[0]} connections, {DRY_RUN_WORKERS[0]} worker, short windows"
        print(f"CUDA absent: {SUITE.name} in fp32, {dry} ({suite})")
    return main(["bench", str(suite), "--results", str(results)])


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
