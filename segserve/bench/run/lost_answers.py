"""Lost answers: a workflow node's answers that TorchServe's workflow executor never received, named from the
frontend log's counts (failures.py `by_node`) and the registered .war's DAG and timeouts (archives/war.py).

Stock TorchServe 0.12's DagExecutor can lose a node's answer: the job is queued before its answer has a place to
go (docs/torchserve_workflows.md), and the executor then waits the node's whole `timeout-ms`, logging nothing.
Log lines carry no request id, but the executor invokes a node's children (`Invoking -  <child> for attempt 0`)
once for each request that the node, and each of the child's other parents, answered. The load awaits every
request it sent before the log is read, so a node first attempted more often than its children were holds
requests whose answer it never got: less those it failed, less those a node beside it failed (the executor
stops a request at its first failure, before the other branches' children), less the requests still in flight
when the load ended (the server may still be working on them).
"""

from segserve.archives.war import WarSpec
from segserve.bench.run.failures import first_attempts
from segserve.bench.run.load import CONNECTION_ERROR, TIMEOUT, LoadResult

RACE = "TorchServe's DagExecutor race, docs/torchserve_workflows.md"
REMEDY = (
    "set its timeout-ms below the client's timeout and above its normal time, with retry-attempts 1, or fuse the workflow (segserve fuse)"
)


def lost_answers(by_node: dict[str, dict], children: dict[str, list[str]], in_flight: int = 0) -> dict[str, int]:
    """{node: answers lost} for the nodes that lost any. A node with a child of its own (the child's only parent)
    is counted exactly; a node whose every child is a join shares the join's shortfall with the join's other such
    parents (the counts cannot tell them apart): `a or b`. A leaf's answers are not counted (no child to count)."""
    first = {node: first_attempts(by_node.get(node) or {}) for node in children}
    failed = {node: (by_node.get(node) or {}).get("failed", 0) for node in children}
    parents = {node: [p for p in children if node in children[p]] for node in children}
    below = {node: _reached(node, children) for node in children}
    above = {node: {p for p in children if node in below[p]} for node in children}

    def passed(node: str) -> int:  # of its first attempts, those no failure stopped (its own or a branch's beside)
        beside = set(children) - below[node] - above[node] - {node}
        return first[node] - failed[node] - sum(failed[n] for n in beside)

    exact = {}
    for node, kids in children.items():
        own = [kid for kid in kids if parents[kid] == [node]]
        if own:
            exact[node] = max(passed(node) - max(first[kid] for kid in own), 0)
    shared: dict[str, int] = {}
    for join in (node for node in children if len(parents[node]) > 1):
        unknown = [p for p in parents[join] if p not in exact]
        if not unknown:
            continue
        known = sum(exact[p] for p in parents[join] if p in exact)  # those requests never reached the join either
        short = min(passed(p) for p in unknown) - first[join] - known
        key = " or ".join(unknown)
        shared[key] = max(shared.get(key, 0), short)
    counts = {**exact, **shared}
    return {node: count - in_flight for node, count in counts.items() if count - in_flight > 0}


def _reached(node: str, children: dict[str, list[str]]) -> set[str]:
    """Every node below `node`."""
    seen, todo = set(), list(children.get(node, []))
    while todo:
        kid = todo.pop()
        if kid not in seen:
            seen.add(kid)
            todo += children.get(kid, [])
    return seen


def lost_cause(lost: dict[str, int], timeouts_ms: dict[str, int], client_timeout_s: float, load_s: float, unanswered: int) -> str | None:
    """What a workflow point lost and what its requests wait: each node's lost answers with its timeout-ms, said
    against the client's timeout and the load's length; where no answer is counted lost but requests went
    unanswered past the client's timeout, the nodes whose timeout-ms is longer (TorchServe retries none of them
    before it passes). None when neither."""
    if lost:
        said = []
        for node, count in lost.items():
            timeout_ms = max(timeouts_ms.get(name, 0) for name in node.split(" or "))
            waits = f"; its request waits timeout-ms {timeout_ms}{_against(timeout_ms, client_timeout_s, load_s)}" if timeout_ms else ""
            said.append(f"{count} answer{'' if count == 1 else 's'} of {node} lost ({RACE}){waits}")
        return "; ".join(said) + f"; {REMEDY}"
    longer = {node: ms for node, ms in timeouts_ms.items() if ms / 1000 > client_timeout_s}
    if not unanswered or not longer:
        return None
    nodes = ", ".join(f"{node} {ms}" for node, ms in longer.items())
    return (
        f"{unanswered} request(s) waited past the client's timeout ({client_timeout_s:g} s) while no node's timeout-ms had"
        f" passed: timeout-ms of {nodes}{_against(max(longer.values()), client_timeout_s, load_s, client=False)}; a lost answer"
        f" ({RACE}) or a slow node waits that long before TorchServe retries it; {REMEDY}"
    )


def _against(timeout_ms: int, client_timeout_s: float, load_s: float, client: bool = True) -> str:
    """What the wait outlasts: the client's timeout, the load."""
    past = [f"the client's timeout ({client_timeout_s:g} s)"] if client and timeout_ms / 1000 > client_timeout_s else []
    past += [f"the load ({load_s:.0f} s, so no retry came within it)"] if timeout_ms / 1000 > load_s else []
    return f", longer than {' and than '.join(past)}" if past else ""


def point_lost(workflow: WarSpec | None, failures: dict | None, result: LoadResult, stopped_s: float, timeout_s: float) -> dict:
    """A point's `lost_answers` ({node: count}) and `lost_cause`, from its load (`result`, which stopped sending at
    `stopped_s`) and the `failures` of its TorchServe's logs; None for a target that is not a workflow. In flight
    when the load ended: the requests whose connection was cut after it stopped, which the server may still be at.
    A request that waited the client's whole timeout is not one of them: the load awaits each that long, and a node
    answers in far less, so its answer was lost (or the node is slower than the client's timeout: both are said)
    — subtracting those hid every loss of a workflow whose timeout-ms outlasts the load (#65's five runs)."""
    if workflow is None:
        return {"lost_answers": None, "lost_cause": None}
    in_flight = sum(1 for end_s, status, _ in result.failed if status == CONNECTION_ERROR and end_s >= stopped_s)
    lost = lost_answers((failures or {}).get("by_node") or {}, workflow.children, in_flight)
    timeouts_ms = {name: node.settings["timeout-ms"] for name, node in workflow.nodes.items()}
    waited = sum(status == TIMEOUT for status in result.status)
    return {"lost_answers": lost, "lost_cause": lost_cause(lost, timeouts_ms, timeout_s, result.wall_s, waited)}
