"""Stalls: stretches of a load in which requests were in flight and none completed, and what TorchServe's log
says of them.

A stall is the server's own doing, not a slow point and not others' use of the machine. Stock TorchServe 0.12's
workflow executor can lose a node's answer and wait the node's whole `timeout-ms` before it retries
(docs/torchserve_workflows.md): every connection then waits, the windows complete nothing, and as the server's CPU
goes idle, other processes fill it, which reads as disturbance. A stalled point is never feasible: its rate is not
what the configuration serves.
"""

import statistics
from dataclasses import replace

from segserve.bench.run.load import LoadResult

STALL_MIN_S = 5.0  # a gap in completions shorter than this is a slow spell, not a stall
STALL_WINDOWS = 2  # nor one shorter than two windows
STALL_LATENCY_FACTOR = 4  # nor one shorter than 4× the median request: a slow model's gaps are its latency
RETRY_SLACK_S = 1.0  # a retry logged this long after a stall ended still ended it (log and load clocks differ)


def find_stalls(result: LoadResult, window_s: float, concurrency: int, rate_rps: float | None = None) -> list[dict]:
    """Each gap between two completions (any status; from the first completion on: a fresh worker's first answer
    is warm-up) longer than the threshold while requests waited: {from_s, to_s, in_flight}, seconds of the load."""
    ends = sorted(result.end_s)
    if len(ends) < 2:
        return []
    threshold_s = stall_threshold_s(result, window_s)
    stalls = []
    for before, after in zip(ends, ends[1:], strict=False):
        if after - before < threshold_s:
            continue
        # those sent before the gap ended and answered at or after its end waited through it (in a closed loop,
        # every connection: none got an answer to send its next request on)
        waiting = [sent for sent, end in zip(result.intended_s, result.end_s, strict=True) if sent < after <= end]
        from_s = max(before, min(waiting, default=after))
        if after - from_s >= threshold_s:
            stalls.append({"from_s": round(from_s, 2), "to_s": round(after, 2), "in_flight": len(waiting)})
    return stalls


def stall_threshold_s(result: LoadResult, window_s: float) -> float:
    median_s = statistics.median(result.latency_ms) / 1000 if result.latency_ms else 0.0
    return max(STALL_MIN_S, STALL_WINDOWS * window_s, STALL_LATENCY_FACTOR * median_s)


def stall_columns(stalls: list[dict]) -> dict:
    """The record's: `stalled`, `stalled_s` (the stalls' seconds together) and each stall."""
    return {"stalled": bool(stalls), "stalled_s": round(_stalled_s(stalls), 1), "stalls": stalls}


def _stalled_s(stalls: list[dict]) -> float:
    return sum(s["to_s"] - s["from_s"] for s in stalls)


def explained(chosen, stalls: list[dict]):
    """The windows chosen (measure._ChosenWindows), `disturbed` only where others took too much of a window the
    server did not stall in: a window a stall overlaps was emptied by the server itself, whatever others took
    meanwhile (they fill the CPU it leaves idle). Too few clean windows and others' use outside the stalls: both."""
    if not stalls or not chosen.disturbed:
        return chosen
    others = [span for span in chosen.all_spans if span not in chosen.clean_spans and not _overlaps(span, stalls)]
    return replace(chosen, disturbed=bool(others))


def _overlaps(span: tuple[float, float], stalls: list[dict]) -> bool:
    return any(stall["from_s"] < span[1] and span[0] < stall["to_s"] for stall in stalls)


def stall_cause(stalls: list[dict] | None, failures: dict | None, timeout_s: float, lost: str | None = None) -> str | None:
    """What a point's stalls cost and why: where TorchServe's frontend log has a node's timeout-ms passing as a stall
    ended, that node and what a user does about it; else the answers the by-node counts say were lost, or the
    requests that waited past the client's timeout while no node's timeout-ms passed (`lost`: lost_answers.lost_cause);
    None for a point that did not stall."""
    if not stalls:
        return None
    lost_s = _stalled_s(stalls)
    spans = ", ".join(f"{s['from_s']:.1f}–{s['to_s']:.1f} s ({s['in_flight']} waiting)" for s in stalls)
    what = f"stalled {lost_s:.0f} s: requests in flight and none completed at {spans} of the load"
    nodes = _timed_out_nodes(stalls, (failures or {}).get("by_node") or {})
    if not nodes:
        return f"{what}: {lost}" if lost else f"{what}; TorchServe's frontend log names no node whose timeout-ms passed then"
    named = ", ".join(f"{node} ({count}×)" for node, count in nodes.items())
    return (
        f"{what}: TorchServe's workflow executor waited the timeout-ms of node {named} with no error logged, then retried it:"
        " the node's answer was lost (DagExecutor race, docs/torchserve_workflows.md) or took longer than timeout-ms;"
        f" set the node's timeout-ms below the client's timeout ({timeout_s:g} s) and above its normal time, or fuse the"
        " workflow (segserve fuse)" + (f"; {lost}" if lost else "")
    )


def _timed_out_nodes(stalls: list[dict], by_node: dict) -> dict[str, int]:
    """The nodes whose timeout-ms passed as a stall ended (the retry is logged when the wait is over), with how
    often; without times (rounds merged) every node whose timeout-ms passed."""
    nodes = {}
    for node, counts in by_node.items():
        times = counts.get("timed_out_at_s")
        if times is None:
            hits = counts.get("timed_out", 0)
        else:
            hits = sum(1 for t in times if any(s["from_s"] <= t <= s["to_s"] + RETRY_SLACK_S for s in stalls))
        if hits:
            nodes[node] = hits
    return nodes
