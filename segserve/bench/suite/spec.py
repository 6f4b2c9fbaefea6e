"""Benchmark suite files: the pydantic model and its error messages.

A suite names targets, inputs, a grid of parameters in four levels (what a
change costs: server restart, re-registration, a live scale call, nothing),
fixed load settings, constraints and an objective. Unknown keys are refused
with "did you mean"; each error is one line `file: dotted.path: message`.
"""

import difflib
import glob
import os
import re
import tempfile
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from segserve.archives.archive_urls import masked_text
from segserve.archives.catalog import Catalog, unknown
from segserve.archives.registration import REGISTRATIONS
from segserve.bench.suite.columns import METRICS
from segserve.bench.suite.input_spec import InputSpec
from segserve.bench.suite.params import LEVELS, PARAMS, at_level, node_value_applies, torchserve_only
from segserve.bench.suite.strict_model import Strict
from segserve.bench.suite.target_spec import TARGET_KINDS, ArchiveTarget, CommandTarget, HttpTarget, TargetEntry
from segserve.errors import UsageError

PositiveInts = Annotated[list[Annotated[int, Field(ge=1)]], Field(min_length=1)]


def _grid_fields(params, all_optional: bool = False) -> dict:
    """pydantic fields from the parameter declarations: a non-empty list of values each; the declared default
    when the suite gives none, else None (left out of the points)."""
    fields = {}
    for param in params:
        values = Annotated[list[param.item], Field(min_length=1)]
        if param.default is None or all_optional:
            fields[param.name] = (values | None, Field(None, description=param.doc))
        else:
            fields[param.name] = (values, Field(list(param.default), description=param.doc))
    return fields


ServerGrid = create_model("ServerGrid", __base__=Strict, **_grid_fields(at_level("server")))
NodeArchiveGrid = create_model("NodeArchiveGrid", __base__=Strict, **_grid_fields([p for p in at_level("archive") if p.per_node], True))


class ArchiveGrid(create_model("ArchiveFields", __base__=Strict, **_grid_fields(at_level("archive")))):
    """Needs re-registration (and a new archive for handler settings); `nodes:` gives per-node values."""

    nodes: dict[str, NodeArchiveGrid] = {}
    """Per DAG node values, e.g. {jpeg: {batch_size: [16, 32]}} (column jpeg_batch_size)"""


class RuntimeGrid(create_model("RuntimeFields", __base__=Strict, **_grid_fields(at_level("runtime")))):
    """Changed live through the management API: `workers`, and `<node>_workers` for one node."""

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="after")
    def per_node_workers(self):
        for key, values in (self.model_extra or {}).items():
            if not key.endswith("_workers"):
                raise ValueError(f"unknown key {key!r}: runtime takes workers and <node>_workers (e.g. seg_workers)")
            setattr(self, key, TypeAdapter(PositiveInts).validate_python(values))
        return self


class LoadGrid(create_model("LoadFields", __base__=Strict, **_grid_fields(at_level("load")))):
    @model_validator(mode="after")
    def one_load_mode(self):
        if (self.concurrency is None) == (self.request_rate_rps is None):
            raise ValueError("give exactly one of 'concurrency' (closed loop) or 'request_rate_rps' (open loop)")
        return self


class Grid(Strict):
    """Lists of values; every combination that applies to a target is a point."""

    server: ServerGrid = ServerGrid()
    """A change restarts TorchServe"""
    archive: ArchiveGrid = ArchiveGrid()
    """A change builds an archive and re-registers"""
    runtime: RuntimeGrid = RuntimeGrid()
    """A change is a live management API call"""
    load: LoadGrid = LoadGrid(concurrency=[8])
    """The load generator's settings: free to change"""


class Phase(Strict):
    """One stretch of a time-varying load: its inputs and its concurrency or rate, for duration_s seconds."""

    name: Annotated[str, Field(pattern=r"^\w+$")]
    """The phase's name in the records and the report (letters, digits, _)"""
    duration_s: Annotated[float, Field(gt=0)]
    """How long the phase's load runs"""
    inputs: Annotated[list[InputSpec], Field(min_length=1)] | None = None
    """What the phase sends; none: the suite's inputs"""
    concurrency: Annotated[int, Field(ge=1)] | None = None
    """Closed loop: connections; neither this nor request_rate_rps: the point's grid.load value"""
    request_rate_rps: Annotated[float, Field(gt=0)] | None = None
    """Open loop: arrivals per second"""

    @model_validator(mode="after")
    def one_load_mode(self):
        if self.concurrency is not None and self.request_rate_rps is not None:
            raise ValueError("give at most one of 'concurrency' (closed loop) or 'request_rate_rps' (open loop)")
        return self


class LoadSettings(Strict):
    """Fixed for every point."""

    arrival: Literal["constant", "poisson"] = "constant"
    """Open loop: evenly spaced arrivals, or a Poisson process"""
    max_connections: Annotated[int, Field(ge=1)] = 64
    """Open loop: the most requests in flight"""
    warmup_s: Annotated[float, Field(ge=0)] = 2.0
    """Load before measuring, not counted"""
    fresh_workers_warmup_s: Annotated[float, Field(ge=0)] = 0.0
    """More warm-up for a point that starts new workers (registered or scaled for it): their first requests are slow"""
    window_s: Annotated[float, Field(gt=0)] = 3.0
    """Length of one measured window"""
    stable_windows: Annotated[int, Field(ge=1)] = 3
    """The last this many windows must agree within stability_tolerance"""
    max_windows: Annotated[int, Field(ge=1)] = 6
    """Stop after this many windows, stable or not (flagged stable: false)"""
    stability_tolerance: Annotated[float, Field(gt=0)] = 0.1
    """(max - min) / mean of the last windows' throughput"""
    max_others_share: Annotated[float, Field(gt=0, le=1)] = 0.1
    """A window in which other processes took more than this share of the machine's CPU is measured again (up to
    max_windows more); too few clean ones: the point is flagged disturbed"""
    timeout_s: Annotated[float, Field(gt=0)] = 30.0
    """A request without an answer after this long counts as failed (timeout)"""
    client_processes: Annotated[int, Field(ge=1)] = 1
    """Load generator processes sharing a point's connections (or its open loop's rate): one fills a core near
    2,500–3,000 req/s of a 688 KB body"""
    bare_forward_s: Annotated[float, Field(gt=0)] = 6.0
    """Seconds of the bare network's forward per shape at the end of the suite (the compute limit), in 3 slices;
    a model point's own bare forward beside it takes a quarter of this"""
    phases: Annotated[list[Phase], Field(min_length=1)] | None = None
    """A time-varying load: the phases run one after the other (after warmup_s of the first phase's load) and every
    point is measured over all of them, per phase and overall (no stability windows)"""

    @model_validator(mode="after")
    def enough_windows(self):
        if self.max_windows < self.stable_windows:
            raise ValueError(f"max_windows ({self.max_windows}) must be ≥ stable_windows ({self.stable_windows})")
        names = [phase.name for phase in self.phases or []]
        if len(set(names)) != len(names):
            raise ValueError(f"a phase name is given twice (got {names})")
        return self


class AutoscalerSettings(Strict):
    """How a point with grid.runtime.autoscale true runs the autoscaler (segserve autoscale's loop) while it is
    measured; its budget is the point's workers (the static split it starts from)."""

    interval_s: Annotated[float, Field(gt=0)] = 5.0
    """Between two decisions"""
    min_interval_s: Annotated[float, Field(ge=0)] = 15.0
    """At least this long between two moves"""
    hysteresis: Annotated[float, Field(ge=0, lt=1)] = 0.2
    """A node's share of the load must exceed its share of the workers by this before it gets one"""
    min_queue_ms: Annotated[float, Field(ge=0)] = 5.0
    """A node whose requests wait less than this in TorchServe's queue keeps up: no worker for it"""


class Bound(Strict):
    """Limits a metric's value must keep for a point to count (e.g. latency_p99_ms: {max: 500})."""

    min: float | None = None
    """The least value allowed"""
    max: float | None = None
    """The largest value allowed"""


class Budget(Strict):
    """How much of the space a search may measure: a point count, a fraction of the grid, or minutes."""

    points: Annotated[int, Field(ge=1)] | None = None
    """At most this many points"""
    fraction: Annotated[float, Field(gt=0, le=1)] | None = None
    """At most this share of the grid's points"""
    minutes: Annotated[float, Field(gt=0)] | None = None
    """Stop proposing points after this long"""

    @model_validator(mode="after")
    def one_kind(self):
        given = [k for k in ("points", "fraction", "minutes") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of points, fraction or minutes (got {', '.join(given) or 'none'})")
        return self


class SearchSettings(Strict):
    """Which points to measure: every one (grid), or a search that proposes them within a budget."""

    strategy: Literal["grid", "random", "optuna", "auto"] = "grid"
    """grid: every point; random; optuna (TPE or GP); auto: predicted from the members measured alone"""
    budget: Budget | None = None
    """How much to measure; none: the whole grid"""
    seed: int = 0
    """Seed of random and optuna"""
    sampler: Literal["tpe", "gp"] = "tpe"
    """Optuna's sampler; on the recorded grid (benchmarks/recorded/search_grid) TPE found better points than GP at
    10% and 20% of it, and asks in milliseconds where GP refits for seconds"""
    batch: Annotated[int, Field(ge=1)] = 1
    """Optuna: points proposed at a time and measured in the grid's order: fewer restarts, a little less guidance"""
    objectives: Annotated[list[str], Field(min_length=1, max_length=2)] | None = None
    """One or two metrics; two: optuna searches for the Pareto front (the report shows it); none: the suite's
    objective"""

    @field_validator("objectives")
    @classmethod
    def known_objectives(cls, objectives: list[str] | None) -> list[str] | None:
        for tag in objectives or []:
            _check_metric(tag)
        return objectives


class Suite(Strict):
    """A benchmark suite: what to measure (targets, inputs, a grid of parameters), how (load), and what is best."""

    name: str | None = None
    """The result folder's name (results/<name>/<UTC time>); none: the file's name"""
    targets: Annotated[list[TargetEntry], Field(min_length=1)]
    """Catalog targets (seg, jpeg, seg_jpeg, seg_jpeg_fused, …), http targets, archive targets (a user's .mar/.war)
    and command targets (a server the suite starts)"""
    inputs: Annotated[list[InputSpec], Field(min_length=1)]
    """What the clients send, round-robin (targets that take class maps get the seg handler's answers to them)"""
    grid: Grid = Grid()
    """The parameters swept, in four levels by what a change costs: server, archive, runtime, load"""
    load: LoadSettings = LoadSettings()
    """How every point is measured"""
    constraints: dict[str, Bound] = {}
    """Metric → bounds a point must keep to count"""
    objective: str = "throughput_rps"
    """The metric the best point is chosen by (its direction from the metric table)"""
    core_plan: str | None = None
    """The core plan file used by grid.server.pinning `plan`"""
    search: SearchSettings = SearchSettings()
    """Which points to measure"""
    profile: Literal["best"] | None = None
    """best: after the suite, serve its best point again and profile it under load (segserve profile): flame graphs
    of every worker, a torch.profiler trace per node, the profiler's cost; and the best command target's (a peer:
    every process's CPU, flame graphs of its Python ones); into <result folder>/profile/"""
    profile_seconds: Annotated[float, Field(gt=0)] = 10.0
    """How long profile: best samples"""
    autoscaler: AutoscalerSettings = AutoscalerSettings()
    """How autoscaled points (grid.runtime.autoscale) run the autoscaler"""

    @model_validator(mode="after")
    def plan_for_pinning(self):
        if "plan" in (self.grid.server.pinning or []) and not self.core_plan:
            raise ValueError("grid.server.pinning has 'plan': give the plan file as core_plan")
        return self

    @model_validator(mode="after")
    def ray_points_take_no_torchserve_settings(self):
        """A Ray point has no JVM, netty, CPU launcher, gRPC API or TorchServe metrics: a suite that would give one
        such a setting is refused naming it (the grid crosses every server value with every other)."""
        if "ray" not in (self.grid.server.engine or []):
            return self
        for level in ("server", "runtime", "load"):
            for name, values in getattr(self.grid, level).model_dump(exclude_none=True).items():
                if taken := torchserve_only(level, name, values if isinstance(values, list) else [values]):
                    raise ValueError(
                        f"grid.{level}.{name} {taken} is TorchServe's own: not on a Ray point (grid.server.engine has ray); "
                        "measure it in a suite of its own on TorchServe (docs/ray.md)"
                    )
        if members := [t.name for t in self.archive_targets.values() if t.members]:
            raise ValueError(
                f"targets {', '.join(members)}: members: true measures a .war's nodes on TorchServe, not on a Ray point "
                "(grid.server.engine has ray): measure the .war itself on Ray (docs/ray.md)"
            )
        return self

    @property
    def input_specs(self) -> list[InputSpec]:
        """Every input the suite sends: its own, its phases' and its archive targets'."""
        phases = [spec for phase in self.load.phases or [] for spec in phase.inputs or []]
        return self.inputs + phases + [spec for target in self.archive_targets.values() for spec in target.inputs or []]

    @field_validator("constraints")
    @classmethod
    def known_constraints(cls, constraints: dict[str, Bound]) -> dict[str, Bound]:
        for tag in constraints:
            _check_metric(tag)
        return constraints

    @field_validator("objective")
    @classmethod
    def known_objective(cls, objective: str) -> str:
        return _check_metric(objective)

    @field_validator("targets")
    @classmethod
    def distinct_targets(cls, targets: list) -> list:
        names = [t if isinstance(t, str) else t.name for t in targets]
        if len(set(names)) != len(names):
            raise ValueError(f"a target is listed twice (got {names})")
        return targets

    @property
    def constraint_bounds(self) -> dict[str, dict]:
        """The constraints as plain bounds ({metric: {min, max}}, unset ends left out): what the analysis reads."""
        return {k: v.model_dump(exclude_none=True) for k, v in self.constraints.items()}

    @property
    def objectives(self) -> list[str]:
        return self.search.objectives or [self.objective]

    @property
    def target_names(self) -> list[str]:
        return [t if isinstance(t, str) else t.name for t in self.targets]

    @property
    def http_targets(self) -> dict[str, HttpTarget]:
        return {t.name: t for t in self.targets if isinstance(t, HttpTarget)}

    @property
    def archive_targets(self) -> dict[str, ArchiveTarget]:
        return {t.name: t for t in self.targets if isinstance(t, ArchiveTarget)}

    @property
    def archive_worker_env(self) -> tuple[str, ...]:
        """The names of segserve's environment a user's archive's code gets in this suite: its archive targets share
        their servers, so each one's workers get the names any of them lists (worker_env)."""
        return tuple(sorted({name for target in self.archive_targets.values() for name in target.worker_env}))

    @property
    def command_targets(self) -> dict[str, CommandTarget]:
        return {t.name: t for t in self.targets if isinstance(t, CommandTarget)}

    @property
    def outside_targets(self) -> dict[str, HttpTarget | CommandTarget]:
        """Targets served by no TorchServe of ours: only load parameters (and a command's own params) apply."""
        return {**self.http_targets, **self.command_targets}


def _check_metric(tag: str) -> str:
    if tag not in METRICS:
        close = difflib.get_close_matches(tag, METRICS, n=1)
        raise ValueError(f"unknown metric {tag!r}" + (f" — did you mean {close[0]!r}?" if close else f"; metrics: {', '.join(METRICS)}"))
    return tag


def _allowed_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names of the model that a dotted location points into (for "did you mean")."""
    for part in loc[:-1]:
        if isinstance(part, int) or model is None:
            continue
        field = model.model_fields.get(part)
        if field is None:  # a mapping's key (grid.archive.nodes.<node>): the model stays the mapping's value
            continue
        candidates = [field.annotation]
        for candidate in candidates:  # through unions, lists and Annotated, e.g. Annotated[list[Phase], …] | None
            candidates += getattr(candidate, "__args__", ())
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    return list(model.model_fields) if model else []


def format_errors(path: Path, error: ValidationError) -> list[str]:
    lines = []
    for item in error.errors():
        loc = tuple(part for index, part in enumerate(item["loc"]) if not (index == 2 and part in TARGET_KINDS))  # union tags
        dotted = ".".join(str(p) for p in loc) or "(top level)"
        if item["type"] == "extra_forbidden":
            tag = item["loc"][2] if len(item["loc"]) > 3 and item["loc"][0] == "targets" else None
            kind = {"HttpTarget": HttpTarget, "ArchiveTarget": ArchiveTarget, "CommandTarget": CommandTarget}.get(tag)
            allowed = list(kind.model_fields) if kind and len(loc) == 3 else _allowed_keys(Suite, loc)  # a target's own key
            close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
            hint = f" — did you mean {close[0]!r}?" if close else ""
            lines.append(f"{path}: {dotted}: unknown key{hint}")
            continue
        message = masked_text(item["msg"].removeprefix("Value error, "))  # a validator may quote the URL it refuses
        shown = masked_text(repr(item["input"]))  # an archive URL's user:password and query values stay unprinted
        got = "" if item["type"] == "missing" or "got" in message or "unknown metric" in message else f" (got {shown})"
        if item["type"] == "literal_error":
            choices = re.findall(r"'([^']*)'", item["ctx"]["expected"])
            close = difflib.get_close_matches(str(item["input"]), choices, n=1)
            got += f" — did you mean {close[0]!r}?" if close else ""
        lines.append(f"{path}: {dotted}: {message}{got}")
    return lines


def load_suite(path: Path, catalog: Catalog) -> Suite:
    """Parse and validate a suite file against the catalog; UsageError carries one line per problem."""
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as error:
        raise UsageError(f"{path}: cannot read suite ({error.strerror})") from None
    except yaml.YAMLError as error:
        raise UsageError(f"{path}: not valid YAML: {masked_text(str(error))}") from None  # it quotes the line
    if not isinstance(raw, dict):
        raise UsageError(f"{path}: a suite is a mapping with 'targets' and 'inputs' (got {type(raw).__name__})")
    unknown_targets = [
        f"{path}: targets.{index}: {unknown('target', name, catalog.targets)}"
        for index, name in enumerate(raw.get("targets") or [] if isinstance(raw.get("targets"), list) else [])
        if isinstance(name, str) and name not in catalog.targets
    ]
    try:
        suite = Suite.model_validate(raw)
    except ValidationError as error:
        raise UsageError("\n".join(unknown_targets + format_errors(path, error))) from None
    if unknown_targets:
        raise UsageError("\n".join(unknown_targets))
    missing = [pattern for spec in suite.input_specs for pattern in spec.patterns if not glob.glob(pattern)]
    if missing:
        raise UsageError("\n".join(f"{path}: inputs: no file matches {pattern!r}" for pattern in missing))
    from segserve.archives.foreign import read_archive

    catalog.add_foreign([read_archive(t.name, t.archive, t.model_store, t.download_rules()) for t in suite.archive_targets.values()])
    add_members(suite, catalog)
    problems = catalog_problems(suite, catalog) + foreign_problems(suite, catalog) + expand_headers(suite)
    if problems:
        raise UsageError("\n".join(f"{path}: {problem}" for problem in problems))
    if suite.name is None:
        suite.name = path.stem
    return suite


def add_members(suite: Suite, catalog: Catalog) -> None:
    """A .war target with `members: true`: its nodes' .mar files as archive targets of the suite, after it."""
    targets = list(suite.targets)
    for war in [t for t in suite.archive_targets.values() if t.members]:
        members = catalog.foreign[war.name].members()  # read, not imported: loading a suite runs no archive's code
        taken = [m.name for m in members if m.name in suite.target_names or m.name in catalog.targets]
        if taken and any(catalog.foreign.get(name) not in members for name in taken):
            raise UsageError(f"targets.{war.name}.members: {', '.join(taken)} is already a target: rename it")
        catalog.add_foreign(members)
        entries = [member_target(war, m) for m in members if m.name not in suite.target_names]
        at = targets.index(war) + 1
        targets[at:at] = entries
    suite.targets = targets


def check_member_functions(suite: Suite, catalog: Catalog) -> None:
    """Each `members: true` .war's function names, asked of its handler file imported as its workers would import it
    (the archive environment, a scratch HOME): run by `segserve bench` once it has said that archives are code, before
    any point, never by loading a suite (bench collect, replay and --dry-run run nothing of an archive's)."""
    from segserve.serving.server import archive_environment, scratch_home

    for war in [t for t in suite.archive_targets.values() if t.members]:
        with tempfile.TemporaryDirectory(prefix="segserve-archive-home-") as folder:
            catalog.foreign[war.name].check_function_names(archive_environment(war.worker_env, scratch_home(Path(folder) / "home")))


def member_target(war: ArchiveTarget, member) -> ArchiveTarget:
    """A .war member's own archive target (foreign.ForeignArchive.members): fetched under its .war's download rules
    (plain_http, the size cap, its pin where it is fetched from a URL), run with its .war's worker_env and
    install_requirements; sent the .war's inputs when it is the start node, else what the DAG makes of them."""
    keys = {"name": member.name, "archive": member.source or str(member.path), "model_store": war.model_store}
    keys |= {"plain_http": war.plain_http, "max_download_mb": war.max_download_mb, "worker_env": war.worker_env}
    keys |= {"sha256": war.sha256 if member.source else {}, "install_requirements": war.install_requirements}
    keys |= {"inputs": war.inputs} if member.workflow is None else {}
    try:
        return ArchiveTarget(**keys)
    except ValidationError as error:  # one line, its URLs masked: never pydantic's text, which quotes them whole
        problem = error.errors()[0]
        key = "".join(f"{part}: " for part in problem["loc"][:1])  # a model validator's message names its own key
        message = masked_text(problem["msg"].removeprefix("Value error, "))
        raise UsageError(f"targets.{war.name}.members: {member.name}: {key}{message}") from None


def catalog_problems(suite: Suite, catalog: Catalog) -> list[str]:
    """Target, node and parameter names the catalog does not know; parameters an http target cannot take."""
    problems = []
    deployed = [t for t in suite.targets if isinstance(t, str)] + list(suite.archive_targets)
    for name in suite.outside_targets:
        if name in catalog.targets:
            kind = "http" if name in suite.http_targets else "command"
            problems.append(f"targets: {name!r} is a catalog target: give the {kind} target another name")
    known = [catalog.targets[n] for n in deployed if n in catalog.targets]
    nodes = list(dict.fromkeys(node.name for t in known for node in t.nodes if not t.is_model))
    for node, given in suite.grid.archive.nodes.items():
        if node not in nodes:
            problems.append(f"grid.archive.nodes.{node}: {unknown('DAG node', node, nodes)}")
            continue
        handlers = [(t, n.model.handler) for t in known for n in t.nodes if n.name == node]
        for name in given.model_dump(exclude_none=True):
            if not PARAMS[name].registration and all(t.name in suite.archive_targets for t in known if node in {n.name for n in t.nodes}):
                continue  # a segserve-handler setting on nodes of a user's archives only: foreign_problems says so
            if not any(node_value_applies(PARAMS[name], handler, target) for target, handler in handlers):
                problems.append(
                    f"grid.archive.nodes.{node}.{name}: applies to no target here (its handler takes no {name}, or the "
                    "targets are fused twins, which run one batch and one set of stage threads for every node)"
                )
    if suite.core_plan and not Path(suite.core_plan).is_file():
        problems.append(f"core_plan: no such file {suite.core_plan!r}")
    for param in at_level("archive"):
        if param.name in suite.grid.archive.model_fields_set and known and not any(param.applies_to_target(t) for t in known):
            problems.append(f"grid.archive.{param.name}: applies to no target here (a workflow's: models and fused twins have none)")
    scaled = list(dict.fromkeys(node for t in known for node in t.scaled_nodes))
    for key in suite.grid.runtime.model_extra or {}:
        if key.removesuffix("_workers") not in scaled:
            problems.append(f"grid.runtime.{key}: {unknown('node', key.removesuffix('_workers'), scaled)} (key: <node>_workers)")
    if suite.http_targets:  # (a command target is a peer measured beside segserve's points, swept or not)
        grid = suite.grid
        swept = [
            name
            for level in LEVELS[:-1]
            for name, values in getattr(grid, level).model_dump(exclude={"nodes"}).items()
            if isinstance(values, list) and len(values) > 1
        ]
        swept += [f"nodes.{node}" for node in grid.archive.nodes]
        if swept:
            names = ", ".join(suite.http_targets)
            problems.append(f"targets: http target(s) {names} take only load parameters; swept here: {', '.join(swept)}")
    return problems


def foreign_problems(suite: Suite, catalog: Catalog) -> list[str]:
    """segserve-handler settings asked of archive targets, whose handlers are their own: only TorchServe's
    registration values (batch size, delay, timeout, a .war's retries), workers, server and load parameters apply to them."""
    if not suite.archive_targets:
        return []
    problems = []
    ours = [catalog.targets[t] for t in suite.target_names if t in catalog.targets and t not in suite.archive_targets]
    handler_params = [p for p in at_level("archive") if not p.registration]
    for param in handler_params:
        if param.name in suite.grid.archive.model_fields_set and not any(param.applies_to_handlers(t.handlers) for t in ours):
            names = ", ".join(suite.archive_targets)
            problems.append(
                f"grid.archive.{param.name}: a setting of segserve's handlers; archive target(s) {names} run their own "
                f"({', '.join(REGISTRATIONS)} apply to them)"
            )
    for name in suite.archive_targets:
        for node in catalog.targets[name].nodes:
            given = suite.grid.archive.nodes.get(node.name)
            for param in handler_params:
                if given is not None and param.name in given.model_fields_set:
                    where = f"grid.archive.nodes.{node.name}.{param.name}"
                    problems.append(f"{where}: a setting of segserve's handlers; {name}'s node {node.name!r} runs its own")
    return problems


ENV_REFERENCE = re.compile(r"\$\{(\w+)\}")


def expand_headers(suite: Suite) -> list[str]:
    """${VAR} in an http target's headers from the environment (a token stays out of the suite file); any
    other `$` is kept as written."""
    problems = []
    for target in suite.http_targets.values():
        for header, value in target.headers.items():
            missing = [name for name in ENV_REFERENCE.findall(value) if name not in os.environ]
            if missing:
                problems.append(f"targets.{target.name}.headers.{header}: environment variable {missing[0]!r} is not set")
            else:
                target.headers[header] = ENV_REFERENCE.sub(lambda m: os.environ[m.group(1)], value)
    return problems


def suite_schema() -> dict:
    """The suite format as a JSON Schema (`segserve bench schema`, benchmarks/suite.schema.json): what editors check."""
    schema = Suite.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "segserve benchmark suite"
    return schema
