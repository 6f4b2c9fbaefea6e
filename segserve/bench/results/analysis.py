"""What the records say, computed once for every renderer (report, terminal summary, plots, best/): the
winner of each target under the constraints, served vs bare, pipeline efficiency, where time goes."""

from dataclasses import dataclass, field

import numpy as np

from segserve.bench.results import sizing
from segserve.bench.results.engines import engine_of, engine_rows
from segserve.bench.results.shown import Shown, efficiency_notes, no_winner_reason
from segserve.bench.results.stats import RATIO_TOLERANCE, bootstrap_interval, ratio, ratio_of_medians, uncertainty
from segserve.bench.suite.columns import METRICS, best, satisfies


@dataclass(frozen=True)
class Pipeline:
    """A DAG target as the analyses see it: its member model targets and the node that carries the weights."""

    members: tuple[str, ...]
    weights_node: str | None
    fused: str | None = None  # the suite's target that serves the same DAG fused into one model, shown beside it


@dataclass
class Analysis:
    targets: list[str]  # in the order the records first name them
    winners: dict[str, dict | None]
    served_vs_bare: list[dict]
    efficiency: list[dict]
    breakdown: list[dict]
    pareto: list[dict] = field(default_factory=list)  # two objectives: the points no other beats on both
    predictions: list[dict] = field(default_factory=list)  # auto search: predicted vs measured throughput
    infeasible: int = 0  # measured points that break a constraint (or failed)
    phases: list[dict] = field(default_factory=list)  # load.phases: every point per phase and overall
    autoscaler_vs_static: list[dict] = field(default_factory=list)  # each phase: the autoscaler against the best static split
    side_by_side: list[dict] = field(default_factory=list)  # peer servers (command targets) beside segserve's best
    # pipelines measured with members but without an efficiency row, and members measured on fewer inputs: why
    efficiency_notes: list[str] = field(default_factory=list)
    no_winner: dict[str, str] = field(default_factory=dict)  # each measured target without a best point: why
    engines: list[dict] = field(default_factory=list)  # points measured on both engines: Ray ÷ TorchServe (engines.py)
    # each target whose best point ran on Ray: its sizing's lines for a target rate (sizing.py), or why it is not sized
    sizing: dict[str, list[str]] = field(default_factory=dict)


def analyse(
    records: list[dict],
    constraints: dict,
    objective: str,
    bare: list[dict],
    pipelines: dict[str, Pipeline],
    objectives: list[str] = (),
    swept: list[str] = (),  # the parameters the points differ in (plan.swept): engine_rows pairs points on them
) -> Analysis:
    targets = list(dict.fromkeys(r.get("target") for r in records))
    winners = {t: best([r for r in records if r.get("target") == t], constraints, objective) for t in targets}
    shown = Shown(records, winners, constraints, objective)
    return Analysis(
        targets,
        winners,
        served_vs_bare(records, constraints, objective, bare),
        efficiency(shown, bare, pipelines),
        time_breakdown(winners, pipelines),
        pareto_front(records, list(objectives), constraints),
        predictions(records),
        sum(not satisfies(r, constraints) for r in records),
        phase_table(records),
        autoscaler_vs_static(records),
        side_by_side(winners),
        efficiency_notes(shown, pipelines),
        {t: no_winner_reason(records, t, constraints) for t in targets if winners[t] is None},
        engine_rows(records, list(swept)),
        ray_sizing(winners, constraints),
    )


def ray_sizing(winners: dict[str, dict | None], constraints: dict) -> dict[str, list[str]]:
    """Each target's best Ray point sized for SEGSERVE_TARGET_RPS at the suite's p99 bound (what best/rayservice.yaml
    carries), as the lines that say where each figure comes from; or the one line why it is not sized."""
    sized = {}
    for target, winner in winners.items():
        if winner is None or engine_of(winner) != "ray":
            continue
        nodes = {k.removesuffix("_workers"): v for k, v in winner.items() if k.endswith("_workers") and isinstance(v, int)}
        replicas = nodes or {target: winner.get("workers") or 1}
        try:
            sized[target] = sizing.size(winner, replicas, sizing.p99_bound_ms(constraints), sizing.target_rps()).lines()
        except sizing.NotSized as why:
            sized[target] = [f"not sized: {why}"]
    return sized


def side_by_side(winners: dict[str, dict | None]) -> list[dict]:
    """With command targets (peer servers) in the run: every target's best point, its throughput's interval, p50,
    p99, its server's CPU and RSS, and its throughput ÷ segserve's best target's (median of windows over median of
    windows, printed as a number only within ±15%); nothing without command targets."""
    measured = {name: w for name, w in winners.items() if w is not None}
    if not any(w.get("peer_server") for w in measured.values()):
        return []
    ours = [w for w in measured.values() if not w.get("target_kind")]
    reference = max(ours, key=lambda w: w["throughput_rps"], default=None)
    rows = []
    for name, winner in sorted(measured.items(), key=lambda item: -item[1]["throughput_rps"]):
        windows = winner.get("measured_window_throughputs_rps") or []
        low, high = winner.get("throughput_ci_low_rps"), winner.get("throughput_ci_high_rps")
        if low is None:
            low, high = bootstrap_interval([windows], np.median) or (None, None)
        row = {
            "target": name,
            "server": winner.get("target_kind") or "segserve",
            "run_id": winner.get("run_id"),
            "throughput_rps": winner["throughput_rps"],
            "interval_rps": f"{low:.1f}–{high:.1f}" if low is not None else None,
            "p50_ms": winner.get("latency_p50_ms"),
            "p99_ms": winner.get("latency_p99_ms"),
            "cpu_pct": winner.get("server_cpu_pct"),
            "rss_mb": winner.get("server_rss_mb"),
            "vs_segserve_best": None,
        }
        if reference is not None:
            value, interval = ratio_of_medians(windows, reference.get("measured_window_throughputs_rps") or [])
            doubt = uncertainty(value, interval)
            row["vs_segserve_best"] = doubt or (round(value, 2) if value is not None else None)
        rows.append(row)
    return rows


def split_label(record: dict) -> str:
    """A point's workers as "seg 2 · jpeg 1", and whether the autoscaler ran from there."""
    counts = [f"{k.removesuffix('_workers')} {v}" for k, v in sorted(record.items()) if k.endswith("_workers") and isinstance(v, int)]
    label = " · ".join(counts) or f"workers {record.get('workers')}"
    return label + (" → autoscaled" if record.get("autoscale") else "")


def _measured_phases(records: list[dict]) -> list[dict]:
    return [r for r in records if r.get("phases") and not r.get("error")]


def phase_table(records: list[dict]) -> list[dict]:
    """One row per point measured under load.phases: req/s and p99 of each phase and overall, failed requests, and
    for an autoscaled point its moves, the seconds to its first move in each phase and its CPU."""
    rows = []
    for record in _measured_phases(records):
        row = {"target": record["target"], "split": split_label(record)}
        for phase in record["phases"]:
            row[f"{phase['phase']}_rps"] = phase["throughput_rps"]
            row[f"{phase['phase']}_p99_ms"] = phase["latency_p99_ms"]
        row |= {"overall_rps": record["throughput_rps"], "overall_p99_ms": record["latency_p99_ms"], "failed": record["requests_failed"]}
        if record.get("autoscale"):
            row["moves"] = " ".join(f"{phase['phase']}: {len(phase.get('moves') or [])}" for phase in record["phases"])
            row["reaction_s"] = " ".join(f"{phase['phase']}: {phase.get('reaction_s')}" for phase in record["phases"])
            row["autoscaler_cpu_pct"] = record.get("autoscaler_cpu_pct")
        rows.append(row)
    return rows


def autoscaler_vs_static(records: list[dict]) -> list[dict]:
    """For each autoscaled point, per phase and overall: the best static split of its target with as many workers
    in all (its budget), the autoscaler's rate and their ratio; overall, whether it is ahead of every such split."""
    measured = _measured_phases(records)

    def total(record: dict) -> int:
        return sum(v for k, v in record.items() if k.endswith("_workers") and isinstance(v, int))

    rows = []
    for auto in (r for r in measured if r.get("autoscale")):
        static = [r for r in measured if r["target"] == auto["target"] and not r.get("autoscale") and total(r) == total(auto)]
        if not static:
            continue
        names = [phase["phase"] for phase in auto["phases"]]
        for index, name in enumerate([*names, "overall"]):

            def rate(record: dict, index: int = index, name: str = name) -> float:
                return record["throughput_rps"] if name == "overall" else record["phases"][index]["throughput_rps"]

            best_static = max(static, key=rate)
            rows.append(
                {
                    "autoscaled": split_label(auto),
                    "phase": name,
                    "best_static": split_label(best_static),
                    "best_static_rps": rate(best_static),
                    "autoscaler_rps": rate(auto),
                    "ratio": rate(auto) / rate(best_static) if rate(best_static) else None,
                    "ahead_of_every_static": all(rate(auto) > rate(r) for r in static) if name == "overall" else None,
                }
            )
    return rows


def pareto_front(records: list[dict], objectives: list[str], constraints: dict) -> list[dict]:
    """With two objectives: the points that meet the constraints and that no other such point matches or beats
    on both while beating on one; best first by the first objective."""
    if len(objectives) < 2:
        return []
    signs = [1 if METRICS[o].higher_is_better else -1 for o in objectives]
    feasible = [r for r in records if satisfies(r, constraints) and all(r.get(o) is not None for o in objectives)]

    def score(record: dict) -> list[float]:
        return [sign * record[o] for sign, o in zip(signs, objectives, strict=True)]

    def beaten(record: dict) -> bool:
        mine = score(record)
        return any(
            all(a >= b for a, b in zip(score(other), mine, strict=True)) and score(other) != mine
            for other in feasible
            if other is not record
        )

    front = sorted((r for r in feasible if not beaten(r)), key=lambda r: -score(r)[0])
    return [{"run_id": r.get("run_id"), "target": r.get("target"), **{o: r[o] for o in objectives}} for r in front]


def predictions(records: list[dict]) -> list[dict]:
    """The auto search's predicted throughput of each pipeline point it measured, against what was measured."""
    rows = []
    for r in records:
        predicted, measured = r.get("predicted_throughput_rps"), r.get("throughput_rps")
        if predicted is not None:
            rows.append(
                {
                    "run_id": r.get("run_id"),
                    "target": r.get("target"),
                    "predicted_throughput_rps": predicted,
                    "throughput_rps": measured,
                    "measured_over_predicted": ratio(measured, predicted),
                }
            )
    return rows


def _pick_bare(bare: list[dict], batch_size, threads, input_size=None, optimize=None, precision=None) -> dict | None:
    """The bare forward measurement matching the batch size, input size and network variant (optimize, precision;
    the end-of-suite bare forward is eager fp32), and threads when known, else the fastest."""
    input_size, variant = list(input_size or (256, 448)), (optimize or "eager", precision or "fp32")
    same_batch = [
        b
        for b in bare
        if b.get("batch_size") == batch_size
        and list(b.get("input_size") or (256, 448)) == input_size
        and (b.get("optimize") or "eager", b.get("precision") or "fp32") == variant
    ]
    exact = [b for b in same_batch if threads is not None and b.get("threads") == threads]
    candidates = exact or same_batch
    return max(candidates, key=lambda b: b.get("throughput_ips") or 0) if candidates else None


def bare_ratio_reasons(point: dict, bare_disturbed: bool = False) -> list[str]:
    """Why a point's served ÷ bare is not a result, whatever its interval says (the record's flags; `bare_disturbed`:
    the end-of-suite bare forward it was compared with was)."""
    flags = (
        ("the bare forward was disturbed", point.get("bare_disturbed") or bare_disturbed),
        ("the point was disturbed", point.get("disturbed")),
        ("served faster than the bare network", point.get("suspect")),
    )
    return [text for text, present in flags if present]


def bare_spread_reasons(entry: dict, besides: list[float | None]) -> list[str]:
    """The bare forward's own spread in this run: its rate beside points (at the same batch size and threads) and at
    the suite's end. When they are more than the tolerance apart, every ratio to it is uncertain, whichever of
    them a table divides by (one bare forward, one doubt)."""
    end = entry.get("throughput_ips")
    rates = [rate for rate in [*besides, end] if rate]
    if not end or len(rates) < 2 or max(rates) <= min(rates) * (1 + RATIO_TOLERANCE):
        return []
    beside = ", ".join(f"{rate:.0f}" for rate in dict.fromkeys(rates[:-1]))
    return [f"the bare forward measured {beside} img/s beside the points and {end:.0f} at the end, more than ±{RATIO_TOLERANCE:.0%} apart"]


def _beside_rates(points: list[dict | None], entry: dict) -> list[float]:
    """The bare forward rates measured beside these points at the entry's batch size and threads."""
    same = [p for p in points if p and p.get("batch_size") == entry.get("batch_size") and p.get("omp_num_threads") == entry.get("threads")]
    return [p["bare_forward_ips"] for p in same if p.get("bare_forward_ips")]


def served_vs_bare(records: list[dict], constraints: dict, objective: str, bare: list[dict]) -> list[dict]:
    """Per target measured beside the bare forward (the model that carries the weights, alone) and per thread
    count and input size: its best batch size against the bare forward at the same batch size, threads and
    input size. The first row of each target is its overall winner."""
    rows = []
    for target in dict.fromkeys(r.get("target") for r in records if r.get("bare_forward_ips") is not None):
        points = [r for r in records if r.get("target") == target]
        winner = best(points, constraints, objective)
        if winner is None:
            continue
        groups: dict[tuple, list[dict]] = {}
        for r in points:
            groups.setdefault((r.get("omp_num_threads"), str(r.get("input_size"))), []).append(r)
        group_winners = [best(group, constraints, objective) for group in groups.values()]
        for point in [winner] + [w for w in group_winners if w is not None and w is not winner]:
            variant = (point.get("optimize"), point.get("precision"))
            entry = _pick_bare(bare, point.get("batch_size"), point.get("omp_num_threads"), point.get("input_size"), *variant) or {}
            beside = point.get("bare_forward_ips")  # measured right after the point: the fairer comparison
            measured_ratio = point.get("ratio_bare")  # windows over bare slices around the point, with an interval
            low, high = point.get("ratio_bare_ci_low"), point.get("ratio_bare_ci_high")
            value, interval = measured_ratio, (low, high) if low is not None else None
            if measured_ratio is None:  # from the slices beside the point, else the suite's end (bare.json)
                slices = point.get("bare_slices_ips") or ([] if beside else entry.get("slices_ips")) or []
                value, interval = ratio_of_medians(point.get("measured_window_throughputs_rps") or [], slices)
                if value is None:
                    value = ratio(point.get("throughput_rps"), beside or entry.get("throughput_ips"))
                low, high = interval or (None, None)
            # printed as a number only when its interval is within ±15%, nothing disturbed it and the bare forward
            # agreed with itself beside the point and at the end
            reasons = bare_ratio_reasons(point, beside is None and entry.get("disturbed"))
            reasons += bare_spread_reasons(entry, _beside_rates([point], entry))
            note = uncertainty(value, interval, reasons)
            rows.append(
                {
                    "target": target,
                    "run_id": point["run_id"],
                    "batch_size": point.get("batch_size"),
                    "threads": entry.get("threads", point.get("omp_num_threads")),
                    "served_rps": point.get("throughput_rps"),
                    "bare_beside_rps": beside,
                    "bare_end_rps": entry.get("throughput_ips"),
                    "bare_end_min_rps": entry.get("throughput_min_ips"),
                    "bare_end_max_rps": entry.get("throughput_max_ips"),
                    "ratio_bare": None if note else value,
                    "ratio_bare_uncertain": note,
                    "disturbed": point.get("disturbed"),
                    "bare_disturbed": point.get("bare_disturbed"),
                    "ratio_bare_ci_low": low,
                    "ratio_bare_ci_high": high,
                    "suspect": point.get("suspect"),
                }
            )
    return rows


def _other_engine(member: dict, pipeline: dict) -> str:
    """` (ray)` after a member's rate where another engine served it than the pipeline's point."""
    return f" ({engine_of(member)})" if engine_of(member) != engine_of(pipeline) else ""


def efficiency(shown: Shown, bare: list[dict], pipelines: dict[str, Pipeline]) -> list[dict]:
    """Each pipeline's best throughput against what its best members allow (shared or disjoint CPUs) and the
    bare model. Members on the same CPUs split each second between them; on disjoint CPUs the slowest sets
    the pace. A target without a feasible point is shown by its best served one (shown.py), flagged: a workflow
    that stalled or lost answers keeps its row, with what it lost, and its ratios are not printed as results."""
    rows = []
    for name, pipeline in pipelines.items():
        winner = shown.point(name)
        points = {m: shown.point(m) for m in pipeline.members}
        member_rps = {m: (point or {}).get("throughput_rps") for m, point in points.items()}
        if winner is None or not all(member_rps.values()):
            continue  # efficiency_notes says why
        shared_bound_rps = 1 / sum(1 / rps for rps in member_rps.values())
        disjoint_bound_rps = min(member_rps.values())
        pipeline_rps = winner.get("throughput_rps")
        # a ratio from a point other processes disturbed is not printed as a result
        disturbed = any((shown.point(t) or {}).get("disturbed") for t in (name, *pipeline.members))
        node = pipeline.weights_node
        batch_size = winner.get(f"{node}_batch_size") or winner.get("batch_size")
        input_size = winner.get(f"{node}_input_size") or winner.get("input_size")
        variant = (winner.get(f"{node}_optimize") or winner.get("optimize"), winner.get(f"{node}_precision") or winner.get("precision"))
        entry = _pick_bare(bare, batch_size, winner.get("omp_num_threads"), input_size, *variant) or {}
        windows = [winner.get("measured_window_throughputs_rps") or []]
        windows += [point.get("measured_window_throughputs_rps") or [] for point in points.values()]
        shared_ci = bootstrap_interval(windows, lambda p, *ms: np.median(p) * sum(1 / np.median(m) for m in ms))
        disjoint_ci = bootstrap_interval(windows, lambda p, *ms: np.median(p) / min(np.median(m) for m in ms))
        bare_ratio, bare_ci = ratio_of_medians(windows[0], entry.get("slices_ips") or [])
        # median ÷ median, the statistic its interval is of; without slices, the rates' ratio (no interval)
        bare_ratio = bare_ratio if bare_ratio is not None else ratio(pipeline_rps, entry.get("throughput_ips"))
        point_reasons = ["the pipeline or a member was disturbed"] if disturbed else []
        # a stalled point's rate is not what its configuration serves (stalls.py)
        point_reasons += [f"{t}'s point stalled" for t in (name, *pipeline.members) if (shown.point(t) or {}).get("stalled")]
        bare_reasons = point_reasons + (["the bare forward was disturbed"] if entry.get("disturbed") else [])
        bare_reasons += bare_spread_reasons(entry, _beside_rates([winner, *points.values()], entry))
        judged = {
            "ratio_shared": uncertainty(ratio(pipeline_rps, shared_bound_rps), shared_ci, point_reasons),
            "ratio_disjoint": uncertainty(ratio(pipeline_rps, disjoint_bound_rps), disjoint_ci, point_reasons),
            "ratio_bare": uncertainty(bare_ratio, bare_ci, bare_reasons),
        }
        flagged = [f"{t}: {'; '.join(flags)}" for t in (name, *pipeline.members) if (flags := shown.flags(t))]
        fused = shown.point(pipeline.fused) if pipeline.fused else None
        row = {
            "pipeline": name,
            "pipeline_rps": pipeline_rps,
            "pipeline_run_id": winner.get("run_id"),
            # the shown points' trouble: not feasible (stalled, a constraint broken), answers lost, requests failed
            "feasible": all(shown.winners.get(t) is not None for t in (name, *pipeline.members)),
            "flags": " · ".join(flagged) or None,
            "lost_answers": sum((winner.get("lost_answers") or {}).values()),
            "requests_failed": winner.get("requests_failed"),
            "members": ", ".join(f"{m} {rps:.1f}{_other_engine(points[m], winner)}" for m, rps in member_rps.items()),
            **{f"{m}_rps": rps for m, rps in member_rps.items()},
            "fused_rps": (fused or {}).get("throughput_rps"),
            "shared_bound_rps": shared_bound_rps,
            "disturbed": disturbed,
            "ratio_shared": ratio(pipeline_rps, shared_bound_rps),
            # 95% bootstrap intervals of the ratio, from the measured windows of the pipeline and its members
            "ratio_shared_ci_low": shared_ci[0] if shared_ci else None,
            "ratio_shared_ci_high": shared_ci[1] if shared_ci else None,
            "disjoint_bound_rps": disjoint_bound_rps,
            "ratio_disjoint": ratio(pipeline_rps, disjoint_bound_rps),
            "ratio_disjoint_ci_low": disjoint_ci[0] if disjoint_ci else None,
            "ratio_disjoint_ci_high": disjoint_ci[1] if disjoint_ci else None,
            "bare_rps": entry.get("throughput_ips"),
            "ratio_bare": bare_ratio,
            "ratio_bare_ci_low": bare_ci[0] if bare_ci else None,
            "ratio_bare_ci_high": bare_ci[1] if bare_ci else None,
            "bare_batch_size": entry.get("batch_size"),
            "bare_threads": entry.get("threads"),
            "engine": engine_of(winner),  # what served the pipeline's point (a member's own engine is in `members`)
        }
        for column, note in judged.items():  # a number only within ±15%, else "uncertain (low–high): why"
            row[column] = None if note else row[column]
            row[f"{column}_uncertain"] = note
        rows.append(row)
    return rows


def node_times(record: dict) -> dict[str, dict]:
    """Per node of a point (a workflow node, or the model itself), from the server's own metrics: TorchServe's
    time from the job's creation to its response (`node_ms`, the queue is inside it), the queue wait, the
    handler's decode + predict + encode per request, and the node's workers' CPU."""
    stages = record.get("server_stages") or {}
    processes = record.get("server_processes") or {}
    times = {}
    for node, model in (record.get("server_models") or {}).items():
        stage = stages.get(node, {})
        cpu = [v.get("cpu_pct") for k, v in processes.items() if k.split("/")[0] == node and v.get("cpu_pct") is not None]
        times[node] = {
            "node_ms": model.get("inference_ms") or 0.0,
            "queue_ms": model.get("queue_ms") or 0.0,
            "handler_ms_per_request": sum(stage.get(k) or 0.0 for k in ("decode_ms", "predict_ms", "encode_ms")) or None,
            "cpu_pct": sum(cpu) if cpu else None,
        }
    return times


def time_breakdown(winners: dict[str, dict | None], pipelines: dict[str, Pipeline]) -> list[dict]:
    """Where a request's time goes at each pipeline's best point (node_times per node); the rest of the
    client's mean latency is the frontend's hops (HTTP, the workflow's per-request thread pool, bytes between
    nodes)."""
    rows = []
    for name in pipelines:
        winner = winners.get(name)
        if winner is None or not winner.get("server_models"):
            continue
        accounted = 0.0
        for node, times in node_times(winner).items():
            accounted += times["node_ms"]
            rows.append(
                {
                    "pipeline": name,
                    "part": node,
                    "node_ms": times["node_ms"],
                    "of_which_queue_ms": times["queue_ms"],
                    "handler_ms_per_request": times["handler_ms_per_request"],
                    "cpu_pct": times["cpu_pct"],
                }
            )
        latency = winner.get("latency_mean_ms")
        rows.append(
            {
                "pipeline": name,
                "part": "frontend hops + network (rest of mean latency)",
                "node_ms": None if latency is None else latency - accounted,
                "of_which_queue_ms": None,
                "handler_ms_per_request": None,
                "cpu_pct": ((winner.get("server_processes") or {}).get("frontend") or {}).get("cpu_pct"),
            }
        )
    return rows
