"""report.md: the environment, the best configuration of each target, the analyses, every point sorted best
first, flags, and links to the plots. Renders an Analysis; computes nothing of its own."""

import json
import statistics
from pathlib import Path

from segserve.bench.results.analysis import Analysis
from segserve.bench.results.engines import engine_verdict
from segserve.bench.results.plots import plot_name
from segserve.bench.results.render import cell, constraint_text, direction, header, render_table, sorted_best_first, status
from segserve.bench.suite.columns import METRICS

# the columns of the per-target tables; the full set is in summary.csv
TABLE_METRICS = ["throughput_rps", "latency_p50_ms", "latency_p99_ms", "requests_failed", "server_queue_ms", "server_cpu_pct"]
ACCURACY_METRICS = ["iou", "agreement", "load_s"]
NODE_COUNTS = ["first attempts", "lost"]  # of a workflow's nodes: the requests that reached each, its answers lost


def exact(share: float | None) -> str | None:
    """IoU and agreement to 4 decimals: the gate is 0.01, and 0.9997 is not 1."""
    return None if share is None else f"{share:.4f}"


def _time_outside(records: list[dict], targets: list[str]) -> str:
    rows = []
    for target in targets:
        seconds = [
            (r.get("reconfigure_s") or 0) + (r.get("warmup_s") or 0)
            for r in records
            if r.get("target") == target and (r.get("reconfigure_s") is not None or r.get("warmup_s") is not None)
        ]
        if seconds:
            summary = {"min_s": min(seconds), "median_s": statistics.median(seconds), "max_s": max(seconds), "total_s": sum(seconds)}
            rows.append({"target": target, "points": len(seconds), **summary})
    if not rows:
        return "No reconfigure or warm-up times were recorded."
    return render_table(rows, list(rows[0]))


def _search_section(search: dict, analysis: Analysis) -> list[str]:
    """How the points were chosen and what that cost; the Pareto front (two objectives); auto's predictions."""
    if not search:
        return []
    lines = [
        "",
        "## Search",
        "",
        f"- Strategy **{search['strategy']}**, budget {search['budget']}: {search['measured']} point(s) measured of "
        f"{search['candidates']} candidate(s); {search.get('pruned', 0)} stopped early as hopeless (pruned).",
    ]
    if "restarts" in search:
        lines.append(
            f"- It caused {search['restarts']} server start(s), {search['registrations']} registration(s) and {search['scales']} "
            "live scale call(s)."
        )
    if "by_process" in search:
        processes = ", ".join(f"`{who}` {count}" for who, count in sorted(search["by_process"].items()))
        lines.append(
            f"- Collected from {len(search['by_process'])} bench process(es): {processes}; {search['duplicates']} point(s) measured twice."
        )
    lines.append(f"- Infeasible points (a constraint broken, or failed): {analysis.infeasible}.")
    lines += _table_section(
        "### Pareto front", analysis.pareto, "No other point that meets the constraints is as good on both objectives and better on one."
    )
    lines += _table_section(
        "### Predicted vs measured (auto)",
        analysis.predictions,
        "Predicted from the members alone (1 / Σ 1/member_rps at the values the point sets), before the point was measured.",
    )
    return lines


def _table_section(heading: str, rows: list[dict], explanation: str) -> list[str]:
    """Report lines for one computed table: heading, table, what it means; nothing when there are no rows."""
    return ["", heading, "", render_table(rows), "", explanation] if rows else []


def write_report(
    out_dir: Path,
    suite_name: str,
    records: list[dict],
    swept: list[str],
    constraints: dict,
    objective: str,
    analysis: Analysis,
    environment: dict,
    search: dict | None = None,
) -> Path:
    """report.md with tables, flags and links to the PNG plots (plots/, written by the plots sink); returns its path."""
    params = [p for p in dict.fromkeys(swept) if p != "target"]
    md = _environment_section(suite_name, environment, objective, constraints)
    md += _best_section(analysis, params)
    md += _engines_section(analysis)
    md += _sizing_section(analysis)
    md += _search_section(search or {}, analysis)
    md += _analysis_sections(analysis)
    for target in analysis.targets:
        md += _target_section(target, records, params, constraints, objective, analysis.winners[target])
    md += _by_param_section(params)
    md += _causes_section(records)
    md += _failures_section(records)
    md += _flags_section(records)
    md += ["", "## Time outside measurement (reconfigure_s + warmup_s)", "", _time_outside(records, analysis.targets), ""]
    path = out_dir / "report.md"
    path.write_text("\n".join(md))
    return path


def _environment_section(suite_name: str, environment: dict, objective: str, constraints: dict) -> list[str]:
    """The title, the machine and versions, what the suite optimises and under which constraints."""
    env_rows = [{"key": k, "value": json.dumps(v) if isinstance(v, dict | list) else v} for k, v in environment.items()]
    return [
        f"# Benchmark report: {cell(suite_name)}",
        "",
        "## Environment",
        "",
        render_table(env_rows, ["key", "value"]),
        "",
        f"**Objective:** {objective} ({METRICS[objective].unit}, {direction(objective)})  ",
        f"**Constraints:** {constraint_text(constraints)}",
    ]


def _best_section(analysis: Analysis, params: list[str]) -> list[str]:
    """Each target's winner under the constraints, with the values of the swept parameters."""
    lines = ["", "## Best configuration", ""]
    for target in analysis.targets:
        winner = analysis.winners[target]
        if winner is None:  # why in words that fit: "no point met the constraints" only where there are some
            lines.append(f"- **{target}**: no best point: {cell(analysis.no_winner.get(target))}.")
        else:
            settings = ", ".join(f"{p}={cell(winner.get(p))}" for p in params)
            metrics = ", ".join(f"{header(m)} {cell(winner.get(m))}" for m in ("throughput_rps", "latency_p99_ms"))
            lines.append(f"- **{target}**: `{winner.get('run_id')}` ({settings}): {metrics}")
    return lines


def _engines_section(analysis: Analysis) -> list[str]:
    """Points measured on both engines: Ray ÷ TorchServe, and which was faster (engines.py)."""
    if not analysis.engines:
        return []
    return [
        "",
        "## Engines: Ray ÷ TorchServe",
        "",
        engine_verdict(analysis.engines),
        "",
        render_table(analysis.engines),
        "",
        "Each point measured on both engines, every other value the same: throughput Ray ÷ TorchServe (the medians of its "
        "rounds', or of its windows', with a 95% bootstrap interval; `faster` only where the interval excludes 1) and "
        "server CPU-ms a request (every process of the engine: TorchServe's frontend and workers; HAProxy, Ray's proxy, "
        "replicas and Ray's own processes).",
    ]


def _sizing_section(analysis: Analysis) -> list[str]:
    """Each target's best Ray point sized for a target rate (best/rayservice.yaml has the same), or why not."""
    if not analysis.sizing:
        return []
    lines = ["", "## Sizing on Ray (best/rayservice.yaml)", ""]
    for target, said in analysis.sizing.items():
        lines += [f"- **{target}**: " + " ".join(said)]
    return lines


def _analysis_sections(analysis: Analysis) -> list[str]:
    """The computed tables across targets (load phases, served vs bare, side by side, pipeline efficiency, where
    a pipeline request's time goes), each with what it means; a table without rows is left out."""
    lines = _table_section(
        "## Load phases",
        analysis.phases,
        "Every point under the suite's load phases, one after the other: each phase's req/s (all its successful "
        "requests over its duration) and p99, then the whole run. Autoscaled points: the moves it made in each phase, "
        "the seconds from a phase's start to its first move, and its own CPU (% of one core).",
    )
    lines += _table_section(
        "### The autoscaler against the static splits",
        analysis.autoscaler_vs_static,
        "Per phase and over the whole run: the best static split in that phase, the autoscaled point's rate and autoscaler ÷ best static.",
    )
    lines += _table_section(
        "## Served model vs bare model",
        analysis.served_vs_bare,
        "The best `seg` point (first row), then the best batch size for each other thread count, against the network's "
        "in-process forward throughput at the same batch size, thread count and input size: `bare_beside_rps` measured right "
        "after the point (the ratio uses it), `bare_end_rps` at the end of the suite (`bare.json`: median of interleaved "
        "slices, with their range). What TorchServe, decoding and batching cost on top of the compute.",
    )
    lines += _table_section(
        "## Side by side: peer servers and segserve",
        analysis.side_by_side,
        "Each target's best point under the constraints, best first: throughput with its 95% interval (of the rounds' "
        "median with --rounds, else of the windows' median), p50 and p99, CPU (% of one core) and RSS of the server's "
        "processes (a command target's: every process it started), and throughput ÷ the best of segserve's own "
        "targets as the ratio of their windows' medians, printed as a number only when its interval is within ±15%.",
    )
    lines += _table_section(
        "## Pipeline efficiency",
        analysis.efficiency,
        "Each rate is the best point of its target under the constraints; `members` are the DAG's node models, each "
        "measured alone. The *shared* bound assumes the members run on the same CPUs, so every request costs the sum of "
        "their 1/rps seconds of the machine: 1/(Σ 1/member_rps). The *disjoint* bound assumes each member has its own "
        "resources, so the slowest sets the pace: min(member_rps). A ratio near 1 means the pipeline loses little to the "
        "serving glue between its steps; ratio_bare compares it with the bare model's in-process forward throughput at "
        "the same batch size and threads, the compute limit. A pipeline or member with no point that meets the "
        "constraints (a workflow that stalled or lost answers) keeps its row: its best point that answered requests, "
        "`feasible` no, `flags` saying why (stalled, answers lost and where, requests failed, a constraint broken, "
        "disturbed), and no ratio printed as a result from a point that stalled. `lost_answers`: the answers its "
        "workflow executor never received (*Failed requests*); `fused_rps`: the same DAG fused into one model; "
        "`engine`: what served the pipeline's point (a member served by the other engine is marked in `members`).",
    )
    if analysis.efficiency_notes:  # a pipeline without its row, or a member fed fewer inputs: said, not left out
        heading = [] if analysis.efficiency else ["", "## Pipeline efficiency"]
        lines += [*heading, "", *(f"- {note}" for note in analysis.efficiency_notes)]
    lines += _table_section(
        "### Where a pipeline request's time goes (best point of each pipeline)",
        analysis.breakdown,
        "node_ms is TorchServe's own per-request mean (Prometheus `ts_inference_latency_microseconds`, per node): from "
        "the job's creation in the frontend to its response, so it holds the queue wait (`of_which_queue_ms`), the "
        "batch's wait for its slowest member and the worker round trip. handler_ms_per_request is the handler's decode + "
        "predict + encode time divided by the requests it served. The last row of each pipeline is the client's mean "
        "latency minus the nodes' time: the frontend's hops (HTTP, and for a workflow its per-request thread pool and "
        "the bytes between nodes) and the loopback network; a few ms below zero means none (the server's means also "
        "cover the warm-up). cpu_pct: that process's CPU use (% of one core).",
    )
    return lines


def _target_section(target: str, records: list[dict], params: list[str], constraints: dict, objective: str, winner) -> list[str]:
    """One target's points, best first, with its plot; then its failed points and those the accuracy gate refused."""
    group = [r for r in records if r.get("target") == target]
    measured, failed = [r for r in group if not r.get("error")], [r for r in group if r.get("error")]
    # optimised points: accuracy and load time beside the throughput
    metrics = TABLE_METRICS + [m for m in ACCURACY_METRICS if any(r.get(m) is not None for r in measured)]
    columns = ["status", "run_id", *params, *(header(m) for m in metrics)]
    plot = plot_name("throughput_vs_p99", target)
    table = [
        {
            "status": status(r, winner, constraints),
            **{p: r.get(p) for p in ["run_id", *params]},
            **{header(m): exact(r.get(m)) if m in ("iou", "agreement") else r.get(m) for m in metrics},
        }
        for r in sorted_best_first(measured, objective)
    ]
    lines = [
        "",
        f"## {target}",
        "",
        f"Sorted best first by {objective}.",
        "",
        render_table(table, columns),
        "",
        f"![{target}: throughput vs p99](plots/{plot})",
    ]
    lines += _overrides_lines(group)
    if failed:
        lines += ["", "Failed points:", "", *(f"- `{r.get('run_id')}`: {cell(r['error'])}" for r in failed)]
    inaccurate = [r for r in measured if r.get("valid") is False]
    if inaccurate:
        lines += [
            "",
            "Invalid points (accuracy gate):",
            "",
            *(f"- `{r.get('run_id')}`: {cell(r.get('invalid_reason'))}" for r in inaccurate),
        ]
    return lines


def _overrides_lines(records: list[dict]) -> list[str]:
    """Which values of a .war's spec the points' copies changed (`archive_overrides`), one line per distinct set."""
    points: dict[str, list[str]] = {}
    for r in records:
        if isinstance(r.get("archive_overrides"), dict) and r["archive_overrides"]:
            changed = ", ".join(f"{key} {value}" for key, value in r["archive_overrides"].items())
            points.setdefault(changed, []).append(f"`{r.get('run_id')}`")
    if not points:
        return []
    return [
        "",
        "Spec values the points changed in their copy of the .war (`archive_overrides`; a function node takes the top "
        "level's, `models.timeout-ms` and `models.retry-attempts`; the .war itself is left as it was):",
        "",
        *(f"- {', '.join(ids)}: {cell(changed)}" for changed, ids in points.items()),
    ]


def _causes_section(records: list[dict]) -> list[str]:
    """Why the requests of points that were measured failed: the first exception the workers logged during each
    (a failed point's cause is the first part of its error, listed with its target)."""
    causes = [
        f"- `{r.get('run_id')}` ({r.get('requests_failed')} failed): {cell(r['error_cause'])}"
        for r in records
        if r.get("error_cause") and not r.get("error")
    ]
    if not causes:
        return []
    return [
        "",
        "## Root causes of failed requests",
        "",
        "The first exception the workers logged during the point, innermost cause first:",
        "",
        *causes,
    ]


def _by_param_section(params: list[str]) -> list[str]:
    """Links to the best throughput by each swept parameter (plots/)."""
    lines = ["", "## Throughput by parameter", ""] if params else []
    for param in params:
        lines += [f"![throughput by {param}](plots/{plot_name('throughput_by', param)})", ""]
    return lines


def _failures_section(records: list[dict]) -> list[str]:
    """The points that stalled, and why; every failed request of the points, by kind (input × status) with a sample
    answer; then the nodes that TorchServe's frontend log says failed or were retried. Nothing when none did."""
    stalls = [f"- `{r.get('run_id')}`: {cell(r['stall_cause'])}" for r in records if r.get("stall_cause")]
    # a stall's cause already says what was lost
    lost = [f"- `{r.get('run_id')}`: {cell(r['lost_cause'])}" for r in records if r.get("lost_cause") and not r.get("stall_cause")]
    kinds = [
        {
            "point": r.get("run_id"),
            **{k: row.get(k) for k in ("input", "status", "node", "count")},
            "sample body": " ".join(row["body"].split()),
        }
        for r in records
        for row in (r.get("failures") or {}).get("samples", [])
    ]
    nodes = [
        {"point": r.get("run_id"), "node": node, **{k: counts.get(k) for k in ("invoked", "retried", "timed_out", "failed")}}
        | {"cause": "; ".join(f"{cause} ({n})" for cause, n in counts.get("causes", {}).items()) or None}
        | {"worker error": counts.get("worker_error")}
        | {"first attempts": counts.get("first_attempts"), "lost": (r.get("lost_answers") or {}).get(node)}
        for r in records
        for node, counts in (r.get("failures") or {}).get("by_node", {}).items()
        if counts.get("failed") or counts.get("retried") or counts.get("worker_error") or (r.get("lost_answers") or {}).get(node)
    ]
    outside = [
        f"`{r.get('run_id')}` ({_counts(r['failures']['outside_windows'])})"
        for r in records
        if (r.get("failures") or {}).get("outside_windows")
    ]
    if not kinds and not nodes and not outside and not stalls and not lost:
        return []
    lines = ["", "## Failed requests", ""]
    if stalls:
        lines += [
            "Stalls: stretches of the load (warm-up included) in which requests waited and none completed, for longer "
            "than 2 windows, 5 s and 4× the median request; a stalled point is never feasible.",
            "",
            *stalls,
            "",
        ]
    if lost:
        lines += [
            "Lost answers: a workflow node first attempted more often than its children were, less the requests it (or a "
            "branch beside it) failed and those still in flight when the load ended (`lost_answers`); or requests that "
            "waited past the client's timeout while no node's timeout-ms had passed.",
            "",
            *lost,
            "",
        ]
    if kinds:
        lines += [
            "Each point's failed requests in its measured windows (they add up to `requests_failed`), by input and status, "
            "with the first answer of each kind (its first 300 bytes; a timeout has none). `node`: the node a workflow's "
            "500 names (`Error executing <node>`).",
            "",
            render_table(kinds, ["point", "input", "status", "node", "count", "sample body"]),
        ]
    if nodes:
        lines += [
            "",
            "What TorchServe's frontend log (ts_log.log, DagExecutor) says of each node over the whole load, warm-up "
            "included: invocations (retries included), retries (logged as `Timed out while executing` whatever failed), "
            "of those `timed_out`: the node's timeout-ms passed with no error (a lost answer or a slow node), requests "
            "failed at the node and why, and the last exception of its workers (model_log.log); `first attempts`: the "
            "requests that reached it; `lost`: its answers the executor never received (`lost_answers`).",
            "",
            render_table(nodes, ["point", "node", "invoked", "retried", "timed_out", "failed", "cause", "worker error", *NODE_COUNTS]),
        ]
    if outside:
        lines += ["", f"Failed outside the measured windows (warm-up, discarded windows): {', '.join(outside)}."]
    return lines


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{cell(name)}: {count}" for name, count in counts.items())  # a .war's node names are the user's


def _flags_section(records: list[dict]) -> list[str]:
    """The points whose numbers need care: not stable, disturbed (served or bare), the load generator saturated."""
    unstable = [f"`{r.get('run_id')}`" for r in records if r.get("stable") is False]
    disturbed = [
        f"`{r.get('run_id')}` (others took {cell(r.get('others_cpu_pct'))}% of the machine)" for r in records if r.get("disturbed")
    ]
    bare_disturbed = [
        f"`{r.get('run_id')}` (others took {cell(r.get('bare_others_cpu_pct'))}% of the machine)"
        for r in records
        if r.get("bare_disturbed")
    ]
    saturated = [f"`{r.get('run_id')}`" for r in records if r.get("client_saturated") is True]
    stalled = [f"`{r.get('run_id')}` ({cell(r.get('stalled_s'))} s)" for r in records if r.get("stalled")]
    lost = [f"`{r.get('run_id')}` ({_counts(r['lost_answers'])})" for r in records if r.get("lost_answers")]
    return [
        "",
        "## Flags",
        "",
        f"- Measurement not stable: {', '.join(unstable) or 'none'}",
        "- Disturbed (other processes took more than the suite's `max_others_share` of the CPU in too many windows; "
        f"their numbers are not the server's alone): {', '.join(disturbed) or 'none'}",
        "- Bare forward disturbed (others took more than `max_others_share` in too many of its slices, measured again "
        f"up to `max_windows` more; its served ÷ bare ratio is printed as uncertain): {', '.join(bare_disturbed) or 'none'}",
        f"- Load generator saturated (its numbers understate the server): {', '.join(saturated) or 'none'}",
        "- Stalled (requests waited and none completed: the server's own doing, not others'; windows a stall emptied "
        f"do not count as disturbed; see *Failed requests*): {', '.join(stalled) or 'none'}",
        f"- Lost answers (a workflow node's answers its executor never received; see *Failed requests*): {', '.join(lost) or 'none'}",
    ]
