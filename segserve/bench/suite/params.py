"""Every grid parameter, declared once: its level (what changing it costs), what it applies to and the key it
becomes. The suite schema, the plan's expansion, the archive recipe, the handler settings and the report
columns are all derived from this table; sweeping a new setting is adding a line here.

Levels: server (a TorchServe restart), archive (a new archive and re-registration), runtime (a live
scale call), load (nothing: the load generator's settings).
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field

from segserve.archives.registration import REGISTRATIONS, Registration

LEVELS = ("server", "archive", "runtime", "load")
PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
Side = Annotated[int, Field(ge=32)]


@dataclass(frozen=True)
class Param:
    name: str
    level: str
    item: object  # the type of one value (pydantic)
    default: tuple | None = None  # grid values when the suite gives none; None: not swept, left out of the points
    handler_keys: tuple[str, ...] = ()  # model config `handler:` keys (two keys: the value is a pair)
    handlers: frozenset | None = None  # handler modules it applies to; None: every segserve handler
    stage: bool = False  # a setting of the worker that runs the stages (the fused twin's, not its nodes')
    env: str | None = None  # server level: an environment variable of every worker
    env_value: Callable[[object], str] = str  # how a value is written there (the environment variable or config key)
    config: str | None = None  # server level: a config.properties key
    per_node: bool = False  # may also be given per DAG node: grid.archive.nodes.<node>.<name>
    doc: str = ""

    @property
    def registration(self) -> Registration | None:
        """How TorchServe spells it, where it is a registration value (segserve/archives/registration.py)."""
        return REGISTRATIONS.get(self.name)

    def handler_settings(self, value) -> dict:
        if len(self.handler_keys) == 2:
            return dict(zip(self.handler_keys, value, strict=True))
        return {self.handler_keys[0]: value} if self.handler_keys else {}

    def applies_to_handlers(self, handlers: set[str]) -> bool:
        return self.handlers is None or bool(self.handlers & handlers)

    def applies_to_target(self, target) -> bool:
        """A workflow spec's own setting (retry_attempts) applies to workflow targets only: a model registered alone
        (a fused twin, a .mar) has no such setting."""
        return target.is_workflow or not (self.registration and self.registration.workflow_only)


def _stage(name: str, item, doc: str) -> Param:
    return Param(name, "archive", item, handler_keys=(name,), stage=True, per_node=True, doc=doc)


PARAMS = {
    p.name: p
    for p in [
        Param(
            "engine",
            "server",
            Literal["torchserve", "ray"],
            doc="what serves the point: torchserve (unset), or ray: the same archives on Ray Serve with TorchServe's API "
            "(docs/ray.md; HAProxy in front, replicas as workers)",
        ),
        Param("omp_num_threads", "server", PositiveInt, env="OMP_NUM_THREADS", doc="OMP_NUM_THREADS of every worker (unset: torch's)"),
        Param("netty_threads", "server", PositiveInt, config="number_of_netty_threads", doc="the frontend's netty threads"),
        Param(
            "jvm_options",
            "server",
            str,
            config="vmargs",
            doc="the frontend's JVM options (config.properties vmargs; unset: the JVM's defaults, G1 and a quarter of the RAM)",
        ),
        Param(
            "prefer_direct_buffer",
            "server",
            bool,
            config="prefer_direct_buffer",
            env_value=lambda value: str(value).lower(),
            doc="netty's buffers off the JVM heap (TorchServe's prefer_direct_buffer)",
        ),
        Param(
            "omp_wait_policy",
            "server",
            Literal["active", "passive"],
            env="OMP_WAIT_POLICY",
            env_value=lambda value: str(value).upper(),
            doc="passive: idle OpenMP threads stop spinning on cores the frontend and decoders need",
        ),
        Param(
            "venv",
            "server",
            str,
            doc="the Python environment TorchServe and its workers run from (.venv-ipex: make setup-ipex); unset: segserve's own",
        ),
        Param(
            "pinning",
            "server",
            Literal["none", "torchserve", "plan"],
            doc="none; torchserve: its CPU launcher (needs numactl); plan: the suite's core_plan",
        ),
        Param(
            "batch_size",
            "archive",
            PositiveInt,
            (8,),
            per_node=True,
            doc="TorchServe batch size",
        ),
        Param(
            "max_batch_delay_ms",
            "archive",
            NonNegativeInt,
            (5,),
            per_node=True,
            doc="TorchServe max batch delay",
        ),
        Param(
            "response_timeout",
            "archive",
            PositiveInt,
            per_node=True,
            doc=f"TorchServe's response timeout in seconds (a workflow's {REGISTRATIONS['response_timeout'].workflow}: each model "
            "node's and, DAG-wide, the spec's top level, which function nodes take)",
        ),
        Param(
            "retry_attempts",
            "archive",
            NonNegativeInt,
            per_node=True,
            doc=f"workflows only: how often TorchServe sends a node's request again once its timeout passed (the spec's "
            f"{REGISTRATIONS['retry_attempts'].workflow}: each model node's and, DAG-wide, the top level, which function nodes take)",
        ),
        Param(
            "precision",
            "archive",
            Literal["fp32", "fp16", "bf16"],
            ("fp32",),
            ("precision",),
            frozenset({"segmentation"}),
            per_node=True,
            doc="compute precision",
        ),
        Param(
            "optimize",
            "archive",
            Literal["eager", "compile", "int8", "ipex"],
            None,
            ("optimize",),
            frozenset({"segmentation"}),
            per_node=True,
            doc="model optimisation applied at load (handlers/optimize.py); ipex needs grid.server.venv: [.venv-ipex]",
        ),
        Param(
            "skip_network",
            "archive",
            bool,
            None,
            ("skip_network",),
            frozenset({"segmentation"}),
            per_node=True,
            doc="the serving path alone: no network runs, the input's first channels stand in for its logits (not a segmentation)",
        ),
        Param(
            "jpeg_quality",
            "archive",
            Annotated[int, Field(ge=1, le=100)],
            (90,),
            ("quality",),
            frozenset({"jpeg"}),
            per_node=True,
            doc="quality of the JPEG answers (1–100)",
        ),
        Param(
            "input_size",
            "archive",
            tuple[Side, Side],
            None,
            ("input_height", "input_width"),
            frozenset({"segmentation"}),
            per_node=True,
            doc="model input [height, width]; images are resized to it (raw inputs must match it)",
        ),
        _stage("micro_batch_size", NonNegativeInt, "split a TorchServe batch into micro-batches of this size; 0: one"),
        _stage("overlap", bool, "decode k+1 and encode k-1 in threads while k is in the model"),
        _stage("decode_threads", PositiveInt, "threads decoding a batch's requests"),
        _stage("encode_threads", PositiveInt, "threads encoding a batch's responses"),
        _stage("threads", NonNegativeInt, "torch intra-op threads of the worker; 0: torch's default"),
        Param("workers", "runtime", PositiveInt, (1,), doc="workers of each registered model (per node: <node>_workers)"),
        Param(
            "autoscale",
            "runtime",
            bool,
            doc="a workflow's point runs the autoscaler while measured, from its workers' split and within their total",
        ),
        Param("concurrency", "load", PositiveInt, doc="closed loop: connections"),
        Param("request_rate_rps", "load", Annotated[float, Field(gt=0)], doc="open loop: arrivals per second"),
        Param(
            "protocol",
            "load",
            Literal["http", "grpc"],
            doc="http (unset): the REST API; grpc: TorchServe's gRPC inference API (model targets; a channel per connection)",
        ),
    ]
}


# Settings of TorchServe's own parts (its JVM, netty, CPU launcher, gRPC API, metrics and logs): a Ray point cannot
# take them, and the suite is refused naming them (value None: any value; else the values that are TorchServe's)
TORCHSERVE_ONLY = {
    ("server", "netty_threads"): None,
    ("server", "jvm_options"): None,
    ("server", "prefer_direct_buffer"): None,
    ("server", "venv"): None,
    ("server", "pinning"): ("torchserve",),  # TorchServe's CPU launcher; a core plan pins Ray's replicas too
    ("runtime", "autoscale"): (True,),
    ("load", "protocol"): ("grpc",),
}


def torchserve_only(level: str, name: str, values: list) -> list:
    """Of a grid's values of one parameter, those only TorchServe serves (TORCHSERVE_ONLY)."""
    if (level, name) not in TORCHSERVE_ONLY:
        return []
    only = TORCHSERVE_ONLY[(level, name)]
    return [v for v in values if only is None or v in only]


def node_value_applies(param: Param, handler: str, target) -> bool:
    """Whether a per-node value (grid.archive.nodes.<node>.<param>) applies to a node with this handler in this
    target (segserve/archives/catalog.py's Target), by its kind: a workflow's node is a model of its own; a fused
    twin runs one batch with one set of stage threads in one worker, so only the node's own handler settings apply
    there; a model measured alone takes DAG-wide values only."""
    if target.is_model or not param.applies_to_handlers({handler}):
        return False
    return target.is_workflow or not (param.stage or param.registration)


def at_level(level: str) -> list[Param]:
    return [p for p in PARAMS.values() if p.level == level]


def workers_param(node: str) -> str:
    """The runtime parameter of one node's workers (of a workflow node, or of a model measured alone)."""
    return f"{node}_workers"


def node_param(node: str, name: str) -> str:
    """The column of a per-node value: grid.archive.nodes.jpeg.batch_size → jpeg_batch_size."""
    return f"{node}_{name}"
