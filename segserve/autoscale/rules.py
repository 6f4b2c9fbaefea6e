"""The autoscaler's decisions (#16, first part): from what each node of a served DAG did in the last interval,
which worker to move between its nodes, within a core budget. Pure functions of the samples, so recorded
metric sequences test them without a server; reading Prometheus and /proc and calling the management API is
the control loop's job (segserve/autoscale/loop.py).

A node's load is the cores it would use to keep up: the cores its workers used (/proc), scaled up by how far
its queue says it is behind (a node whose requests wait as long again as they are served needs about twice
its cores). Workers follow the loads: the budget's workers split in proportion to them (largest remainder,
each node within its min/max), one worker moved at a time, the new worker started before the old one stops
(scale up before scaling down), only when the loaded node's share of the load exceeds its share of the
workers by the hysteresis, and never sooner than min_interval_s after the last move.

A move is a trial: the load model only says where the queue is, not whether another split serves more (on a
small machine the nodes share the same cores). The interval after a move is judged on what the pipeline served:
below (1 - max_drop) of its rate before the move, the move is undone. What both splits served is remembered for
retry_after_s at that request mix (each node's share of a request's handler time): no move goes to a split known
to serve no more than max_drop above the current rate there (no retrying an undone move, no flapping back).

The fused pipeline is one model: nothing to move between nodes. Its workers share the budget's cores, each with
budget // workers threads (the thread rule, handlers/pinning.py), so its workers × threads follow the load
(decide_workers): a worker more while requests queue, one fewer while it keeps up with cores to spare, each a
trial; its mix is each stage's share (decode, predict, encode) of a request's handler time.

A workflow segserve did not build (a user's .war) has none of segserve's handler counters, and TorchServe 0.12
counts no requests of a workflow node (no ts_inference_requests_total for it; only cumulative queue and inference
microseconds). Its samples say so (`source="torchserve"`): no per-request times, no req/s, no stages (None and {},
never zeros that would read as a free node), and instead the two averages TorchServe's counters give without a
request count: the workers a node kept busy (inference minus queue time per second, ÷ its batch size) and the
requests waiting in its queue (queue time per second, in batches). From those: a node's load is the larger of its
workers' CPU and its busy workers (a handler that waits on I/O or a device uses little CPU but holds its workers),
times 1 + waiting ÷ busy, the same "how far behind" as queue ÷ handler time per request; it keeps up while its
requests wait less than `hysteresis` of the time they are served; its mix is its share of the busy workers. What
the pipeline served is unknown, so such a move is not a trial: it is kept, never judged or undone on req/s.
"""

import math
from dataclasses import asdict, dataclass, field

SEGSERVE, TORCHSERVE = "segserve", "torchserve"  # what a NodeSample was read from


@dataclass(frozen=True)
class NodeSample:
    """What one node (a registered model, e.g. seg_jpeg__seg) did over the last interval. `source` "segserve": the
    handlers' own counters (per request: queue, handler time, stages; req/s); "torchserve": TorchServe's frontend
    counters alone (a user's handler): the per-request fields are None, stages_ms is empty, and busy_workers and
    waiting_batches say what the node did."""

    node: str
    workers: int
    cpu_cores: float  # cores its workers used (CPU seconds per second, /proc)
    queue_ms: float | None  # mean wait in TorchServe's queue; None: its requests are not counted
    handler_ms: float | None  # mean time a request spent in the handler; None: not measured
    served_rps: float | None = 0.0  # requests it answered per second; None: not counted
    stages_ms: dict[str, float] = field(default_factory=dict)  # handler time per request by stage; {}: no stage counters
    source: str = SEGSERVE
    busy_workers: float | None = None  # source torchserve: workers busy on average ((inference - queue) µs/s ÷ batch size)
    waiting_batches: float | None = None  # source torchserve: requests waiting in its queue on average, ÷ batch size


@dataclass(frozen=True)
class Bounds:
    min_workers: int = 1
    max_workers: int = 64


@dataclass(frozen=True)
class Policy:
    # workers of all nodes together: `--cores N` gives N (one per core; the thread rule shares a node's cores among
    # its workers); a suite's autoscaled point keeps its starting split's total
    budget_workers: int
    hysteresis: float = 0.2  # share of the load minus share of the workers before a move
    min_interval_s: float = 15.0
    min_queue_ms: float = 5.0  # below this a node is keeping up, whatever its share
    max_drop: float = 0.05  # a move after which the pipeline serves less than (1 - this) of before is undone
    retry_after_s: float = 300.0  # what a split served at a mix is remembered this long
    mix_tolerance: float = 0.15  # mixes closer than this (half the L1 distance of the shares) are the same


@dataclass
class Trial:
    """A move on probation: the split before and after, what the pipeline served before it, the mix then."""

    before: dict[str, int]
    after: dict[str, int]
    rate_before_rps: float
    mix: dict[str, float]


@dataclass(frozen=True)
class Known:
    """What a split served at a mix, measured around a move: a move toward a split known to serve no more than
    max_drop above the current rate at the same mix is not made (an undone move, or flapping back)."""

    split: dict[str, int]
    mix: dict[str, float]
    rate_rps: float
    until_s: float


@dataclass
class Decision:
    time_s: float
    loads: dict[str, float]
    current: dict[str, int]
    target: dict[str, int]
    steps: list[tuple[str, int]] = field(default_factory=list)  # (node, workers), in order: up first, then down
    reason: str = ""

    def as_json(self) -> dict:
        return asdict(self)


def queue_share(sample: NodeSample) -> float:
    """How long its requests wait against how long they are served (queue ÷ service time per request)."""
    if sample.source == TORCHSERVE:  # no request count: the same ratio from the averages
        busy = sample.busy_workers or 0.0
        return (sample.waiting_batches or 0.0) / busy if busy > 0 else 0.0
    return sample.queue_ms / sample.handler_ms if sample.handler_ms > 0 else 0.0


def keeping_up(sample: NodeSample, policy: "Policy") -> bool:
    """Its requests barely wait: under min_queue_ms each; without a request count, under `hysteresis` of the
    time they are served."""
    if sample.queue_ms is None:
        return queue_share(sample) < policy.hysteresis
    return sample.queue_ms < policy.min_queue_ms


def queue_text(sample: NodeSample) -> str:
    if sample.queue_ms is None:
        return f"its requests wait {queue_share(sample):.0%} of their busy time ({sample.waiting_batches or 0:.1f} waiting)"
    return f"queue {sample.queue_ms:.0f} ms"


def load_cores(sample: NodeSample) -> float:
    """Cores the node would use to keep up: what it used, times (wait + service) / service when it queues. From
    TorchServe's counters alone, what it used is the larger of its CPU and its busy workers (a handler that waits
    on I/O or a device holds its worker with little CPU)."""
    used = max(sample.cpu_cores, 0.01 * sample.workers)  # an idle node still holds a little
    if sample.source == TORCHSERVE:
        used = max(used, sample.busy_workers or 0.0)
    return used * (1 + queue_share(sample))


def _keeping_up_text(sample: NodeSample, policy: "Policy") -> str:
    if sample.queue_ms is None:
        return f"its requests wait {queue_share(sample):.0%} of their busy time < {policy.hysteresis:.0%}"
    return f"queue {sample.queue_ms:.1f} ms < {policy.min_queue_ms} ms"


def split(loads: dict[str, float], bounds: dict[str, Bounds], budget: int) -> dict[str, int]:
    """Workers per node in proportion to the loads: each node's minimum first, the rest by largest remainder,
    never above a node's maximum."""
    target = {node: bounds[node].min_workers for node in loads}
    if sum(target.values()) > budget:
        raise ValueError(f"the nodes' minimum workers ({sum(target.values())}) exceed the budget of {budget} workers")
    total = sum(loads.values()) or 1.0
    for _ in range(budget - sum(target.values())):
        room = [n for n in loads if target[n] < bounds[n].max_workers]
        if not room:
            break
        # the node furthest below its fair share of the budget gets the next worker
        node = max(room, key=lambda n: budget * loads[n] / total - target[n])
        target[node] += 1
    return target


def pipeline_rps(samples: list[NodeSample]) -> float | None:
    """What the DAG served: every request passes every node, so the slowest node's answers per second; None when
    a node's requests are not counted (TorchServe's counters alone)."""
    if any(s.served_rps is None for s in samples):
        return None
    return min((s.served_rps for s in samples), default=0.0)


def mix_of(samples: list[NodeSample]) -> dict[str, float]:
    """Each node's share of a request's handler time: what the traffic asks of each node (large photos: jpeg's
    grows); of one model (the fused pipeline), each stage's share (large photos: decode's and encode's grow)."""
    if len(samples) == 1 and sum(samples[0].stages_ms.values()) > 0:
        stages = samples[0].stages_ms
        return {stage: ms / sum(stages.values()) for stage, ms in stages.items()}
    if any(s.handler_ms is None for s in samples):  # TorchServe's counters alone: each node's share of the busy workers
        busy = {s.node: s.busy_workers or 0.0 for s in samples}
        total = sum(busy.values())
        return {node: (value / total if total else 1 / len(samples)) for node, value in busy.items()}
    total = sum(s.handler_ms for s in samples)
    return {s.node: (s.handler_ms / total if total else 1 / len(samples)) for s in samples}


def _shares(mix: dict[str, float]) -> str:
    return "/".join(f"{share:.2f}" for share in mix.values())


def same_mix(a: dict[str, float], b: dict[str, float], tolerance: float) -> bool:
    return sum(abs(a.get(n, 0.0) - b.get(n, 0.0)) for n in set(a) | set(b)) / 2 <= tolerance


def _ordered_steps(current: dict[str, int], wanted: dict[str, int]) -> list[tuple[str, int]]:
    """The scale calls from one split to another: the nodes that grow first, then those that shrink."""
    grow = [(n, wanted[n]) for n in wanted if wanted[n] > current[n]]
    return grow + [(n, wanted[n]) for n in wanted if wanted[n] < current[n]]


def judge(trial: Trial, samples: list[NodeSample], policy: Policy, now_s: float) -> Decision:
    """The interval after a move: keep it, or undo it (steps back to the split before) when the pipeline served
    less than (1 - max_drop) of its rate before the move."""
    loads = {s.node: round(load_cores(s), 3) for s in samples}
    current = {s.node: s.workers for s in samples}
    decision = Decision(now_s, loads, current, dict(current))
    rate = pipeline_rps(samples)
    if rate is None:  # not counted now: nothing to judge it on (the loop makes no trial without a rate)
        decision.reason = "kept the move: what the pipeline served is not counted"
        return decision
    if rate >= trial.rate_before_rps * (1 - policy.max_drop):
        decision.reason = f"kept the move: {rate:.1f} req/s after it, {trial.rate_before_rps:.1f} before"
        return decision
    decision.target = dict(trial.before)
    decision.steps = _ordered_steps(current, trial.before)
    decision.reason = (
        f"undoing the move: {rate:.1f} req/s after it, {trial.rate_before_rps:.1f} before (more than {policy.max_drop:.0%} less)"
    )
    return decision


def _too_soon(policy: Policy, now_s: float, last_move_s: float | None) -> str | None:
    """Why no move is made yet: less than min_interval_s since the last one; None when one may be."""
    if last_move_s is not None and now_s - last_move_s < policy.min_interval_s:
        return f"waiting: {now_s - last_move_s:.0f}s since the last move (minimum {policy.min_interval_s:.0f}s)"
    return None


def _held(after: dict[str, int], samples: list[NodeSample], policy: Policy, now_s: float, known, mix_before, move: str) -> str | None:
    """Why a move to `after` waits (the mix is still moving: the rate it would be judged against was served at
    another mix) or is not made (that split is known to serve no more at this mix); None to make it."""
    mix = mix_of(samples)
    if mix_before is not None and not same_mix(mix_before, mix, policy.mix_tolerance):
        return f"waiting: the request mix is moving ({_shares(mix_before)} → {_shares(mix)}), one more interval"
    rate = pipeline_rps(samples)
    for k in known if rate is not None else ():
        if (
            k.split == after
            and k.until_s > now_s
            and same_mix(k.mix, mix, policy.mix_tolerance)
            and k.rate_rps <= rate * (1 + policy.max_drop)
        ):
            return f"holding: {move}, but that split served {k.rate_rps:.1f} req/s at this mix ({rate:.1f} now)"
    return None


def decide(
    samples: list[NodeSample],
    bounds: dict[str, Bounds],
    policy: Policy,
    now_s: float,
    last_move_s: float | None,
    known: list[Known] = (),
    mix_before: dict[str, float] | None = None,
) -> Decision:
    """The next move (Decision.steps), or none with the reason; `known`: what splits served at a mix (a move to
    one that served no more than the current rate × (1 + max_drop) at this mix is not made);
    `mix_before`: the previous interval's mix: a move waits until the mix holds for two intervals, so that the
    rate it is judged against was served at the same mix (a phase change moves the rate by itself)."""
    loads = {s.node: load_cores(s) for s in samples}
    current = {s.node: s.workers for s in samples}
    by_node = {s.node: s for s in samples}
    target = split(loads, bounds, policy.budget_workers)
    decision = Decision(now_s, {n: round(v, 3) for n, v in loads.items()}, current, target)
    if target == current:
        decision.reason = "balanced: the workers already follow the loads"
        return decision
    if too_soon := _too_soon(policy, now_s, last_move_s):
        decision.reason = too_soon
        return decision
    total_load, total_workers = sum(loads.values()) or 1.0, sum(current.values())
    grow = max(
        (n for n in target if target[n] > current[n]), key=lambda n: loads[n] / total_load - current[n] / total_workers, default=None
    )
    shrink = max(
        (n for n in target if target[n] < current[n]), key=lambda n: current[n] / total_workers - loads[n] / total_load, default=None
    )
    if grow is None:  # only fewer workers: over the budget, or a node's maximum went down
        decision.steps = [(shrink, current[shrink] - 1)]
        decision.reason = f"{shrink} gives a worker back ({total_workers} workers, budget {policy.budget_workers})"
        return decision
    gap = loads[grow] / total_load - current[grow] / total_workers
    if keeping_up(by_node[grow], policy):
        decision.reason = f"holding: {grow} is keeping up ({_keeping_up_text(by_node[grow], policy)})"
        return decision
    if gap < policy.hysteresis:
        decision.reason = f"holding: {grow}'s share of the load is {gap:.2f} above its share of the workers (< {policy.hysteresis})"
        return decision
    steps = [(grow, current[grow] + 1)]  # the new worker first: capacity never dips below what it was
    over_budget = total_workers + 1 > policy.budget_workers
    if shrink is not None and over_budget:
        steps.append((shrink, current[shrink] - 1))
    held = _held(current | dict(steps), samples, policy, now_s, known, mix_before, f"{grow} would take a worker")
    if held:
        decision.reason = held
        return decision
    decision.steps = steps
    moved = f", from {shrink}" if len(decision.steps) == 2 else ""
    decision.reason = (
        f"{grow} takes a worker{moved}: {math.ceil(100 * gap)}% more of the load than of the workers, {queue_text(by_node[grow])}"
    )
    return decision


def decide_workers(
    sample: NodeSample,
    bounds: Bounds,
    policy: Policy,
    now_s: float,
    last_move_s: float | None,
    known: list[Known] = (),
    mix_before: dict[str, float] | None = None,
) -> Decision:
    """One model whose workers share the budget's cores (the fused pipeline; the thread rule gives each worker
    budget // workers threads): a worker more when requests wait (more requests at once, fewer threads each),
    one fewer when it keeps up with cores to spare (more threads for each request), one step at a time, each
    a trial judged like any move."""
    node, workers, budget = sample.node, sample.workers, policy.budget_workers
    most = min(bounds.max_workers, budget)  # at least one thread a worker
    load = load_cores(sample)
    decision = Decision(now_s, {node: round(load, 3)}, {node: workers}, {node: workers})
    share = queue_share(sample)
    waiting = not keeping_up(sample, policy) and share >= policy.hysteresis and share > 0
    spare = keeping_up(sample, policy) and load <= (1 - policy.hysteresis) * budget
    if workers > most:
        wanted, move = workers - 1, f"{node} gives a worker back ({workers} workers, budget {budget} cores)"
    elif waiting and workers < most:
        wanted = workers + 1
        waited = f"{sample.queue_ms:.0f} ms " if sample.queue_ms is not None else ""
        move = f"{node} takes a worker: requests wait {waited}({share:.0%} of their handler time); "
        move += f"{budget // wanted} thread(s) each"
    elif spare and workers > bounds.min_workers:
        wanted = workers - 1
        move = f"{node} gives a worker back: it keeps up on {load:.2f} of {budget} cores; {budget // wanted} thread(s) each"
    else:
        if sample.queue_ms is None:
            waited, queue = f"{share:.0%} of their busy time", f"requests wait {share:.0%} of their busy time"
        else:
            waited, queue = f"{sample.queue_ms:.0f} ms", f"queue {sample.queue_ms:.1f} ms"
        state = f"requests wait {waited}" if waiting else f"keeping up ({queue}, {load:.2f} cores)"
        decision.reason = f"holding: {node} {state} with {workers} worker(s) ({bounds.min_workers}–{most})"
        return decision
    decision.target = {node: wanted}
    if too_soon := _too_soon(policy, now_s, last_move_s):
        decision.reason = too_soon
        return decision
    held = _held(decision.target, [sample], policy, now_s, known, mix_before, move.split(":")[0])
    if held:
        decision.reason = held
        return decision
    decision.steps = [(node, wanted)]
    decision.reason = move
    return decision
