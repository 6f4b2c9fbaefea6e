"""Failed requests, attributed: by input (a file's name, else `#<index>`), by status, and for a TorchServe target
by the node that failed, as its logs tell it; with one sample answer per kind (status × input).

The load generator keeps the failed requests and the first answer of each kind (load.py); this module names them
and reads what TorchServe wrote meanwhile. A workflow's failure reaches the client as a 500 whose body says only
"Error executing <node>" (WorkflowManager.predict); the frontend's log (ts_log.log, DagExecutor.invokeModel) has
per node each invocation, each retry, the failure's cause (`<node> : <message>`, "null" for a timeout-ms that
passed) and one line per request it failed; the workers' log (model_log.log) has the handler's exception. Log lines
carry no request id, so node counts are over the whole load (warm-up included) and stand beside the request counts.
"""

import re
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

from segserve.bench.run.load import TIMEOUT, LoadResult, status_name

SAMPLE_KINDS = 20  # sample rows kept per point, the most frequent kinds first
LOG_FILES = ("ts_log.log", "model_log.log")

_DAG = r"org\.pytorch\.serve\.ensemble\.DagExecutor - "
INVOKED = re.compile(_DAG + r"Invoking -  (\S+) for attempt (\d+)$")
# logged before every retry, whatever failed: TorchServe's wording, not always a timeout
RETRIED = re.compile(_DAG + r"Timed out while executing (\S+) for attempt \d+$")
# a DagExecutor line's time and thread: a retry after a bare "null" on the same thread is a timeout-ms that passed
# (a TimeoutException has no message; an exception logs its own), the wait a lost answer costs (docs/torchserve_workflows.md)
DAG_LINE = re.compile(r"^(\S+) \[\w+ *\] (\S+) " + _DAG + r"(.*)$")
LOG_TIME = "%Y-%m-%dT%H:%M:%S,%f"  # TorchServe's log4j2.xml: 2026-12-05T06:23:12,253, the machine's local time
TIMED_OUT_TIMES = 50  # of a node's timeouts, the times kept (a storm would fill the record)
CAUSE = re.compile(_DAG + r"(\S+) : (.*)$")  # after the last attempt: the node and its exception's message
FAILED = re.compile(_DAG + r".*Failed to execute workflow Node after \d+ attempts : Error executing (\S+)$")
NAMED_NODE = re.compile(rb"Error executing ([\w.-]+)")  # a workflow's 500 body
WORKER = re.compile(r" W-\d+-(\S+?)_[^_\s]+-std(?:out|err) MODEL_LOG - (.*)$")  # thread W-<port>-<model>_<version>
EXCEPTION = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt)\b(?::.*)?$")  # a traceback's last line
TIMED_OUT = "timed out (the node's timeout-ms)"  # what a `<node> : null` line means (TimeoutException has no message)


def input_names(bodies: list[bytes]) -> list[str]:
    """Each body's name in the counts: its file's name (inputs.Body.name), else `#<index>`; a name two files
    share gets the index too."""
    names = [getattr(body, "name", None) or f"#{index}" for index, body in enumerate(bodies)]
    shared = {name for name, count in Counter(names).items() if count > 1}
    return [f"{name}#{index}" if name in shared else name for index, name in enumerate(names)]


class LogMark:
    """Where TorchServe's logs end now, so that what it writes during a load can be read after it."""

    def __init__(self, logs: Path):
        self.logs = logs
        self.sizes = {name: _size(logs / name) for name in LOG_FILES}
        self.epoch_s = time.time()  # the load starts right after: log times are told against it

    def added(self, name: str) -> str:
        """What was written to logs/<name> since the mark (all of it when it rotated meanwhile)."""
        path = self.logs / name
        data = path.read_bytes() if path.exists() else b""
        size = self.sizes[name]
        return (data[size:] if len(data) >= size else data).decode(errors="replace")


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def attributed(
    measured: LoadResult, names: list[str], whole: LoadResult | None = None, mark: LogMark | None = None, timeout_s: float = 0.0
) -> dict | None:
    """The `failures` of a point: its measured requests' failures by status and input, a sample answer of each kind,
    the failures of the rest of the load (`whole`: warm-up, discarded windows) by status, and the nodes TorchServe's
    logs name (since `mark`). None when nothing failed anywhere."""
    by_node = node_failures(mark.added("ts_log.log"), mark.added("model_log.log"), mark.epoch_s) if mark else {}
    outside = Counter(status_name(s) for _, s, _ in whole.failed) - Counter(status_name(s) for _, s, _ in measured.failed) if whole else {}
    if not measured.failed and not outside and not any(n.get("failed") or n.get("retried") for n in by_node.values()):
        return None
    kinds = Counter((status, names[index]) for _, status, index in measured.failed)
    samples = {(status, names[index]): body for (status, index), body in measured.samples.items()}
    rows = []
    for (status, name), count in kinds.most_common(SAMPLE_KINDS):
        body = samples.get((status, name), b"")
        rows.append(
            {
                "input": name,
                "status": status_name(status),
                "count": count,
                "node": _named_node(body),
                "body": _text(body, status, timeout_s),
            }
        )
    return {
        "by_status": dict(Counter(status_name(status) for _, status, _ in measured.failed).most_common()),
        "by_input": dict(Counter(names[index] for _, _, index in measured.failed).most_common()),
        "by_node": by_node,
        "samples": rows,
        "outside_windows": dict(outside),
    }


def _named_node(body: bytes) -> str | None:
    found = NAMED_NODE.search(body)
    return found.group(1).decode() if found else None


def _text(body: bytes, status: int, timeout_s: float) -> str:
    if status == TIMEOUT:
        return f"(no answer within {timeout_s:g} s)"
    return body.decode(errors="backslashreplace")


def node_failures(ts_log: str, model_log: str = "", epoch_s: float = 0.0) -> dict[str, dict]:
    """Per node (a workflow's node; a model's own name otherwise): how often the frontend invoked it (`first_attempts`:
    of those, attempt 0: the requests that reached it), retried it
    (`timed_out`: of those, after its timeout-ms passed with no error, at `timed_out_at_s`: seconds after epoch_s),
    failed a request at it and why, and the exception its workers last raised, from the log lines given."""
    nodes: dict[str, dict] = {}
    last_error: dict[str, str | None] = {}  # per frontend thread, the DagExecutor's last error line since an invocation

    def entry(node: str) -> dict:
        return nodes.setdefault(node, {"invoked": 0, "first_attempts": 0, "retried": 0, "timed_out": 0, "failed": 0, "causes": {}})

    for line in ts_log.splitlines():
        dag = DAG_LINE.match(line)
        if found := INVOKED.search(line):
            node = entry(found.group(1))
            node["invoked"] += 1
            node["first_attempts"] += found.group(2) == "0"  # once per request that reached the node (lost_answers.py)
            last_error[dag.group(2) if dag else ""] = None
        elif found := RETRIED.search(line):
            node = entry(found.group(1))
            node["retried"] += 1
            if dag and last_error.get(dag.group(2)) == "null":
                node["timed_out"] += 1
                times = node.setdefault("timed_out_at_s", [])
                if len(times) < TIMED_OUT_TIMES:
                    times.append(round(_log_epoch_s(dag.group(1)) - epoch_s, 3))
        elif found := FAILED.search(line):
            entry(found.group(1))["failed"] += 1
        elif found := CAUSE.search(line):
            causes = entry(found.group(1))["causes"]
            cause = TIMED_OUT if found.group(2) == "null" else found.group(2)
            causes[cause] = causes.get(cause, 0) + 1
        elif dag:
            last_error[dag.group(2)] = dag.group(3)
    failing = None  # the model whose traceback is being read
    for line in model_log.splitlines():
        if not (found := WORKER.search(line)):
            continue
        model, text = found.groups()
        if text.startswith("Invoking custom service failed."):
            failing = model
        elif model == failing and EXCEPTION.match(text):
            node = entry(model.split("__", 1)[-1])  # a workflow's node model is <workflow>__<node>
            node["worker_errors"] = node.get("worker_errors", 0) + 1
            node["worker_error"] = text
            failing = None
    return nodes


def first_attempts(counts: dict) -> int:
    """A node's attempts 0 (a record from before they were counted: its invocations less its retries, as each retry
    is logged before the invocation it makes)."""
    return counts.get("first_attempts", counts.get("invoked", 0) - counts.get("retried", 0))


def _log_epoch_s(stamp: str) -> float:
    return datetime.strptime(stamp, LOG_TIME).timestamp()


def merged(parts: list[dict | None]) -> dict | None:
    """One `failures` of several (a point's rounds or load phases): counts added, the first sample of each kind."""
    parts = [part for part in parts if part]
    if not parts:
        return None
    total: dict = {"by_status": Counter(), "by_input": Counter(), "by_node": {}, "samples": [], "outside_windows": Counter()}
    rows: dict[tuple, dict] = {}
    for part in parts:
        for key in ("by_status", "by_input", "outside_windows"):
            total[key].update(part.get(key) or {})
        for node, counts in (part.get("by_node") or {}).items():
            # a load's own times (timed_out_at_s) are not summed: each part's clock starts with it
            into = total["by_node"].setdefault(node, {"invoked": 0, "retried": 0, "timed_out": 0, "failed": 0, "causes": {}})
            for key in ("invoked", "first_attempts", "retried", "timed_out", "failed", "worker_errors"):
                if key in counts:
                    into[key] = into.get(key, 0) + counts[key]
            into["causes"] = dict(Counter(into["causes"]) + Counter(counts.get("causes") or {}))
            if counts.get("worker_error"):
                into["worker_error"] = counts["worker_error"]  # the last one
        for row in part.get("samples") or []:
            kind = (row["input"], row["status"])
            rows[kind] = {**rows[kind], "count": rows[kind]["count"] + row["count"]} if kind in rows else dict(row)
    for key in ("by_status", "by_input", "outside_windows"):
        total[key] = dict(total[key].most_common())
    total["samples"] = sorted(rows.values(), key=lambda row: -row["count"])[:SAMPLE_KINDS]
    return total


def failure_line(run_id: str, failures: dict | None) -> str | None:
    """One terminal line for a point whose requests failed: how many, and the top input, status and node; or, where
    none failed, for one whose workflow executor waited a node's timeout-ms (its requests were slow by as much)."""
    by_node = (failures or {}).get("by_node") or {}
    waited = {node: counts["timed_out"] for node, counts in by_node.items() if counts.get("timed_out")}
    if waited:
        node = max(waited, key=waited.get)
        waited_text = f"node {node} (its timeout-ms passed {waited[node]}× in the frontend's log: a lost answer or a slow node)"
    if not failures or not failures.get("by_status"):
        return f"  {run_id}: none failed, but {waited_text}" if waited else None
    count = sum(failures["by_status"].values())
    status, input_name = (next(iter(failures[key].items())) for key in ("by_status", "by_input"))
    line = f"  {run_id}: {count} request(s) failed; most by status {status[0]} ({status[1]}), input {input_name[0]} ({input_name[1]})"
    nodes = {node: counts["failed"] for node, counts in by_node.items() if counts.get("failed")}
    if nodes:
        node = max(nodes, key=nodes.get)
        causes = by_node[node].get("causes") or {}
        cause = f": {max(causes, key=causes.get)}" if causes else ""
        line += f", node {node} ({nodes[node]} failed in the frontend's log{cause})"
    elif waited:  # timeouts, and a node's timeout-ms passed: the workflow executor waited on it
        line += f", {waited_text}"
    return line
