"""summary.json and summary.txt of a run of gpu_bundle/run.sh (`python -m segserve.gpu.bundle summary WORK OUT`).

Needs only the standard library (yaml and the catalog are imported where there are results to read): the summary
comes back even from a run whose venv step failed or ran out of time.

A pipeline's goal (its rate ÷ its slower member's at the same worker count) is judged only where all three points
are stable and unflagged; otherwise it is `not judged`, with the reason. A cold first point once printed `met`.
"""

import json
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from segserve.bench.results.store import read_runs, read_summary

RAW_BODY_BYTES = 3 * 256 * 448 * 2  # the seed's FP16 [3, 256, 448] body
LOGITS_BYTES = 2 * 256 * 448 * 2  # 2 classes in fp16: what copying logits would cost per request


def _tests(xml_path: Path) -> dict:
    if not xml_path.exists():
        return {"ran": False}
    outcome = {"passed": 0, "failed": 0, "skipped": 0, "skip_reasons": [], "failures": []}
    for case in ElementTree.parse(xml_path).getroot().iter("testcase"):
        if case.find("skipped") is not None:
            outcome["skipped"] += 1
            outcome["skip_reasons"].append(f"{case.get('name')}: {case.find('skipped').get('message', '')}")
        elif (failure := case.find("failure") if case.find("failure") is not None else case.find("error")) is not None:
            outcome["failed"] += 1
            outcome["failures"].append(f"{case.get('name')}: {(failure.get('message') or '')[:300]}")
        else:
            outcome["passed"] += 1
    outcome["skip_reasons"] = sorted(set(outcome["skip_reasons"]))
    return {"ran": True, **outcome}


def point_flags(record: dict) -> list[str]:
    """Why a point's numbers cannot be judged: empty when it is stable and nothing flagged it."""
    flags = []
    if record.get("error"):
        flags.append(f"failed: {str(record['error'])[:80]}")
    if not record.get("stable"):
        flags.append("its rate did not settle")
    if record.get("disturbed"):
        flags.append("other processes took the machine")
    if record.get("client_saturated"):
        flags.append("the load generator saturated its core")
    if record.get("requests_failed"):
        flags.append(f"{record['requests_failed']} requests failed")
    if record.get("pruned"):
        flags.append("pruned")
    return flags


def _cpu(record: dict) -> dict:
    """CPU by process group over the point (% of one core) and per request (ms, the record's own columns)."""
    groups = record.get("server_processes") or {}
    pct = {
        "frontend": sum(g.get("cpu_pct", 0.0) for name, g in groups.items() if name == "frontend"),
        "workers": sum(g.get("cpu_pct", 0.0) for name, g in groups.items() if "/" in name),
        "client": record.get("client_cpu_pct") or 0.0,
    }
    return {
        "pct": {k: round(v, 1) for k, v in pct.items()},
        "ms_per_request": {k: record.get(f"{k}_cpu_ms_per_request") for k in pct},
    }


def _benchmark(results: Path) -> dict:
    """Every point: target, workers, throughput, p99, failures, stability and flags, GPU use, CPU by group, and the
    device→host bytes of each node per request."""
    folders = sorted({path.parent.parent for path in results.glob("gpu/*/runs/*.json")})
    if not folders:
        return {}
    import yaml  # there are results: the venv step worked, and yaml is in it

    folder = folders[-1]
    # a bench step stopped by its timeout leaves its finished points in runs/ but no summary.jsonl: the sweep's
    # points measured so far are still the run's numbers
    runs = read_runs(folder)
    rows = read_summary(folder) if (folder / "summary.jsonl").exists() else list(runs.values())
    suite_file = folder / "suite.yaml"
    grid = yaml.safe_load(suite_file.read_text())["grid"] if suite_file.exists() else {"archive": {}}
    precision = (grid["archive"].get("precision") or ["fp32"])[0]  # records name only the parameters that vary
    workers = (grid.get("runtime", {}).get("workers") or [1])[0]
    points = []
    for row in rows:
        record = {**row, **runs.get(row["run_id"], {})}
        stages = record.get("server_stages") or {}
        points.append(
            {
                "target": row["target"],
                "workers": record.get("workers", workers),
                "throughput_rps": record.get("throughput_rps"),
                "throughput_ci_rps": [record.get("throughput_ci_low_rps"), record.get("throughput_ci_high_rps")],
                "window_throughputs_rps": record.get("window_throughputs_rps"),
                "latency_p99_ms": record.get("latency_p99_ms"),
                "requests_ok": record.get("requests_ok"),
                "requests_failed": record.get("requests_failed"),
                "precision": record.get("precision", precision),
                "flags": point_flags(record),
                "gpu_util_mean_pct": record.get("gpu_util_mean_pct"),
                "gpu_util_max_pct": record.get("gpu_util_max_pct"),
                "gpu_memory_used_max_mib": record.get("gpu_memory_used_max_mib"),
                "gpu_usage_unavailable": record.get("gpu_usage_unavailable"),
                "cpu": _cpu(record),
                "bare_forward_ips": record.get("bare_forward_ips"),
                "bare_device": record.get("bare_device"),
                "ratio_bare": record.get("ratio_bare"),
                "device_to_host_bytes_per_request": record.get("bytes_device_to_host_per_request"),
                "nodes": {
                    node: {"device_to_host_bytes": s.get("device_to_host_bytes", 0.0), "response_bytes": s.get("response_bytes")}
                    for node, s in stages.items()
                },
                "error": record.get("error"),
            }
        )
    return {"folder": str(folder), "points": points}


def _goals(bench: dict, cuda: bool, members: list[str], goals_by_pipeline: dict[str, float]) -> dict:
    """Each pipeline against its slower member at every worker count (judged from stable, unflagged points only);
    each node's device→host bytes against what it answers."""
    points = bench.get("points", [])
    by_key = {(p["target"], p["workers"]): p for p in points}
    judged = []
    for workers in sorted({p["workers"] for p in points}):
        member_points = [by_key.get((m, workers)) for m in members or []]
        for name, goal in (goals_by_pipeline or {}).items():
            pipeline = by_key.get((name, workers))
            if pipeline is None or None in member_points:
                continue
            slower = min(member_points, key=lambda p: p["throughput_rps"] or 0.0)
            ratio = (pipeline["throughput_rps"] or 0.0) / slower["throughput_rps"] if slower["throughput_rps"] else None
            reasons = [f"{p['target']}: {flag}" for p in (pipeline, *member_points) for flag in p["flags"]]
            if ratio is None:
                verdict = "not judged"
                reasons.append(f"{slower['target']} served nothing")
            else:
                verdict = "not judged" if reasons else ("met" if ratio >= goal else "NOT met")
            judged.append(
                {
                    "pipeline": name,
                    "workers": workers,
                    "slower_member": slower["target"],
                    "ratio": round(ratio, 3) if ratio is not None else None,
                    "goal": goal,
                    "verdict": verdict,
                    "reasons": reasons,
                }
            )
    checks = {}
    for point in points:
        for node, counters in point["nodes"].items():
            copied, answered = counters["device_to_host_bytes"], counters["response_bytes"]
            # seg answers the class map (plus an 18-byte header), jpeg and the fused pipeline the JPEG: on the GPU each
            # copies what it answers and nothing else; on a CPU nothing is copied
            same = answered is not None and abs(copied - answered) <= max(64.0, 0.01 * answered)
            checks[f"{point['target']}@{point['workers']}/{node}"] = {
                "device_to_host": copied,
                "answered": answered,
                "met": same if cuda else copied == 0,
                "logits_would_be": LOGITS_BYTES,
            }
    return {
        "pipelines": judged,
        "device_to_host_is_the_answer": {"nodes": checks, "met": bool(checks) and all(c["met"] for c in checks.values())},
    }


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def write_summary(work: Path, out: Path) -> int:
    facts = _json(work / "facts.json")
    # a step run again (run.sh's STEPS) appends its line: the last one per step stands, in run order; an earlier
    # run's own summary line is not a step of this one
    recorded = {}
    for step in map(json.loads, filter(str.strip, (work / "steps.jsonl").read_text().splitlines())):
        if step["step"] != "summary":
            recorded[step["step"]] = step
    bench = _benchmark(work / "results")
    members, goals_by_pipeline = [], {}
    if bench.get("points"):  # there are results: the catalog's yaml is there (the venv's)
        from segserve.gpu.steps import pipelines

        members, goals_by_pipeline = pipelines()
    summary = {
        "facts": facts,
        "steps": list(recorded.values()),
        "gpu_tests": _tests(work / "gpu_tests.xml"),
        "serve": _json(work / "serve.json"),
        "ceilings": _json(work / "ceilings.json"),
        "benchmark": bench,
        "goals": _goals(bench, bool(facts.get("cuda")), members, goals_by_pipeline),
        "dag": {"members": members, "pipelines": list(goals_by_pipeline)},  # the default DAG's, from the catalog
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    if bench:
        for suffix in ("summary.jsonl", "report.md"):
            source = Path(bench["folder"]) / suffix
            if source.exists():
                (out / f"bench_{suffix}").write_bytes(source.read_bytes())
    for name in ("hostile.json", "profile.md"):  # the serve step's: every input's answers, the fused worker's profile
        if (work / name).exists():
            (out / name).write_bytes((work / name).read_bytes())
    (out / "summary.txt").write_text(summary_text(summary))
    return 0


def _step_text(step: dict) -> str:
    outcome = "ok" if step["rc"] == 0 else f"FAILED rc={step['rc']}"
    return f"{step['step']} {outcome} {step['seconds']:.0f}s"


def _number(value, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _points_text(points: list[dict]) -> list[str]:
    lines = [
        "",
        f"{'target':15s} {'wk':>2s} {'req/s':>7s} {'95% CI':>13s} {'p99 ms':>7s} {'fail':>4s} {'GPU %':>9s} "
        f"{'CPU % fe/wk/cl':>16s} {'CPU ms/req fe/wk':>17s}  flags",
    ]
    for p in points:
        low, high = p["throughput_ci_rps"]
        cpu, per = p["cpu"]["pct"], p["cpu"]["ms_per_request"]
        gpu = f"{_number(p['gpu_util_mean_pct'])}/{_number(p['gpu_util_max_pct'])}"
        lines.append(
            f"{p['target']:15s} {p['workers']:>2d} {_number(p['throughput_rps'], 1):>7s} {_number(low) + '-' + _number(high):>13s} "
            f"{_number(p['latency_p99_ms']):>7s} {p['requests_failed'] or 0:>4d} {gpu:>9s} "
            f"{cpu['frontend']:>5.0f}/{cpu['workers']:>4.0f}/{cpu['client']:>4.0f} "
            f"{_number(per['frontend'], 2):>8s}/{_number(per['workers'], 2):>7s}  {'; '.join(p['flags']) or 'stable'}"
        )
    unavailable = {p["gpu_usage_unavailable"] for p in points if p.get("gpu_usage_unavailable")}
    if unavailable:
        lines.append(f"(GPU % not measured: {'; '.join(sorted(unavailable))})")
    return lines


def _ceilings_text(ceilings: dict, points: list[dict], dag: dict) -> list[str]:
    """Each stage's best served rate beside what the stage does alone in one process on the device: the DAG's root
    member runs the network, its leaf member the JPEG encoder."""
    if not ceilings or not dag.get("members"):
        return []
    network, encoder = dag["members"][0], dag["members"][-1]
    best = {}
    for p in points:
        if not p["flags"] and (p["throughput_rps"] or 0) > best.get(p["target"], (0, 0))[0]:
            best[p["target"]] = (p["throughput_rps"], p["workers"])
    forward, jpeg, copies = ceilings.get("forward", {}), ceilings.get("jpeg", {}), ceilings.get("host_to_device", {})

    def served(target):
        rate, workers = best.get(target, (None, None))
        return f"{_number(rate)} req/s ({workers} workers)" if rate else "no stable point"

    lines = ["", f"stage ceilings in one process on {ceilings.get('device')} (served: the best stable point of the sweep)"]
    if "error" in forward:
        lines.append(f"  {network} forward+argmax: FAILED {forward['error']}")
    elif forward:
        graph = f", {forward['cuda_graph_img_per_s']:.0f} as a CUDA graph" if forward.get("cuda_graph_img_per_s") else ""
        lines.append(
            f"  {network}: served {served(network)}; forward+argmax {forward['eager_img_per_s']:.0f} img/s eager{graph} "
            f"({forward['precision']}, batch {forward['batch_size']})"
        )
    if "error" in jpeg:
        lines.append(f"  nvJPEG: FAILED {jpeg['error']}")
    elif jpeg:
        lines.append(
            f"  {encoder}: served {served(encoder)}; batched encode {jpeg['encode_img_per_s']:.0f} img/s, decode "
            f"{jpeg['decode_img_per_s']:.0f} img/s (256x448, batch {jpeg['batch_size']})"
        )
    if copies and "error" not in copies:
        per_s = 1e9 * copies["pinned_gb_per_s"] / RAW_BODY_BYTES
        lines.append(
            f"  host→device: {copies['pinned_gb_per_s']} GB/s pinned, {copies['pageable_gb_per_s']} pageable "
            f"({per_s:.0f} raw FP16 bodies/s pinned)"
        )
    for name in dag["pipelines"]:
        if best.get(name):
            lines.append(f"  {name}: served {served(name)}")
    race = ceilings.get("encoder_race", {})
    if race.get("finished_image"):
        right = race["finished_image"]
        lines.append(
            f"  nvJPEG encode of an image written behind a long kernel: torchvision directly {right['torchvision']}/"
            f"{race['rounds']} right, handlers/jpeg.encode_jpegs {right['segserve']}/{race['rounds']}"
        )
    return lines


def _serve_text(serve: dict) -> list[str]:
    lines = []
    for name, target in serve.get("targets", {}).items():
        lines.append(f"served {name}: {target['jpegs']}/{target['sent']} samples answered with a JPEG, {target['failed']} failed")
    workers = serve.get("workers", {})
    if workers:
        lines.append("workers on the GPU: " + ", ".join(f"{m} {sum(w['gpu'] for w in ws)}/{len(ws)}" for m, ws in workers.items()))
    hostile = serve.get("hostile")
    if hostile:
        agreement = hostile["min_label_agreement"]
        lines.append(
            f"hostile and odd inputs ({hostile['inputs']} to {' and '.join(hostile['targets'])}): valid on the CPU "
            f"{hostile['valid_answered_200']}/{hostile['valid_on_cpu']} answered 200 here, "
            f"invalid {hostile['invalid_answered_4xx']}/{hostile['invalid_on_cpu']} 4xx, "
            f"{len(hostile['mismatches'])} otherwise than on the CPU, workers killed {hostile['workers_killed']}, "
            f"class maps agree with the CPU's on ≥ {_number(None if agreement is None else 100 * agreement, 2)}% of pixels"
        )
        lines += [f"  {m['target']} {m['input']}: {m['gpu_status']} here, {m['cpu_status']} on the CPU" for m in hostile["mismatches"][:10]]
    profile = serve.get("profile")
    if profile:
        if profile.get("error"):
            lines.append(f"profile of the fused worker: FAILED {profile['error']}")
        else:
            lines.append(
                f"profile of the fused worker under load (profile.md): req/s {profile.get('throughput_rps')}, "
                f"errors {profile.get('errors')}"
            )
            for rows in (profile.get("handler_costs") or {}).values():  # the innermost handlers/ frame per sample
                lines += [f"  {row.get('pct', 0):5.1f}%  {row.get('function')}" for row in rows[:8]]
    return lines


def summary_text(summary: dict) -> str:
    facts = summary["facts"]
    mode = "DRY RUN (no CUDA)" if facts.get("dry_run") else ("GPU" if facts.get("cuda") else "NO CUDA")
    lines = [
        f"segserve GPU check: {mode}",
        f"python {facts.get('python')}  torch {facts.get('torch')}  torchvision {facts.get('torchvision')}  "
        f"device {facts.get('device', '-')}  cpus {facts.get('cpus', '-')}  java {facts.get('java', '-')}  "
        f"bundle of {facts.get('bundle_commit', '?')}",
        "",
        "steps: " + ", ".join(_step_text(s) for s in summary["steps"]),
    ]
    tests = summary["gpu_tests"]
    if tests.get("ran"):
        lines.append(f"gpu tests: {tests['passed']} passed, {tests['failed']} failed, {tests['skipped']} skipped")
        lines += [f"  FAILED {failure}" for failure in tests.get("failures", [])]
        lines += [f"  skipped {reason}" for reason in tests["skip_reasons"][:3]]
    lines += _serve_text(summary["serve"])
    points = summary["benchmark"].get("points", [])
    if points:
        lines += _points_text(points)
    goals = summary["goals"]
    for goal in goals.get("pipelines", []):
        ratio = "-" if goal["ratio"] is None else f"{goal['ratio']:.2f}"
        why = f" ({'; '.join(goal['reasons'])})" if goal["reasons"] else ""
        lines.append(
            f"{goal['pipeline']} over {goal['slower_member']} at {goal['workers']} workers: {ratio} (goal ≥ {goal['goal']}) "
            f"{goal['verdict']}{why}"
        )
    lines += _ceilings_text(summary.get("ceilings", {}), points, summary.get("dag", {}))
    d2h = goals.get("device_to_host_is_the_answer", {})
    if d2h.get("nodes"):
        verdict = ("met" if d2h["met"] else "NOT met") if facts.get("cuda") else "no GPU: nothing copied"
        lines.append(f"device→host bytes per request = the node's answer (class map or JPEG), never logits: {verdict}")
        shown = [(n, c) for n, c in d2h["nodes"].items() if not c["met"]] or list(d2h["nodes"].items())[:5]
        lines += [f"  {node}: copied {c['device_to_host']:.0f} B, answered {c['answered'] or 0:.0f} B" for node, c in shown]
    return "\n".join(lines) + "\n"
