"""Benchmark suite files: the pydantic model and its error messages.

A suite names targets, inputs, a grid of parameters in four levels (what a
change costs: server restart, re-registration, a live scale call, nothing),
fixed load settings, constraints and an objective. Unknown keys are refused
with "did you mean"; each error is one line `file: dotted.path: message`.
"""

import difflib
import glob
import re
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from segserve.bench.schema import METRICS
from segserve.errors import UsageError

Target = Literal["seg", "jpeg", "seg_jpeg", "seg_jpeg_fused"]
PositiveInts = Annotated[list[Annotated[int, Field(ge=1)]], Field(min_length=1)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RawInput(Strict):
    """Raw tensors as the seed's clients sent them: synthetic images, normalised, in this dtype and shape."""

    dtype: Literal["float16", "float32", "bfloat16"] = "float16"
    shape: tuple[Literal[3], Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)]] = (3, 256, 448)
    count: Annotated[int, Field(ge=1)] = 4
    seed: int = 7_000_000


class InputSpec(Strict):
    images: list[str] | None = None  # files or globs, relative to the working directory
    raw: RawInput | None = None

    @model_validator(mode="after")
    def one_kind(self):
        if (self.images is None) == (self.raw is None):
            raise ValueError("give exactly one of 'images' or 'raw'")
        return self


class ServerGrid(Strict):
    """Needs a TorchServe restart."""

    omp_num_threads: PositiveInts | None = None  # OMP_NUM_THREADS for every worker (unset: torch's default)
    netty_threads: PositiveInts | None = None  # number_of_netty_threads of the frontend
    # OMP_WAIT_POLICY for every worker: "passive" stops idle OpenMP threads from spinning on cores the
    # frontend and the decoders need (libgomp spins by default).
    omp_wait_policy: list[Literal["active", "passive"]] | None = None
    # none: no pinning; torchserve: its own launcher (cpu_launcher_enable, needs numactl);
    # plan: the suite's core_plan (segserve/pinning.py)
    pinning: list[Literal["none", "torchserve", "plan"]] | None = None


class ArchiveGrid(Strict):
    """Needs re-registration (and, for precision/quality, a rebuilt archive)."""

    batch_size: PositiveInts = [8]
    max_batch_delay_ms: Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)] = [5]
    precision: list[Literal["fp32", "fp16", "bf16"]] = ["fp32"]
    jpeg_quality: list[Annotated[int, Field(ge=1, le=100)]] = [90]
    # Model input [height, width] of the seg stage; images are resized to it (raw inputs must match it).
    input_size: list[tuple[Annotated[int, Field(ge=32)], Annotated[int, Field(ge=32)]]] | None = None
    # Handler stage settings (handlers/base.py RunnerSettings), for every stage of the target.
    micro_batch_size: list[Annotated[int, Field(ge=0)]] | None = None
    overlap: list[bool] | None = None
    decode_threads: PositiveInts | None = None


class RuntimeGrid(Strict):
    """Changed live through the management API (PUT /models/<name>?min_worker=&max_worker=)."""

    workers: PositiveInts = [1]
    seg_workers: PositiveInts | None = None  # the seg stage (member model or workflow node); default: workers
    jpeg_workers: PositiveInts | None = None


class LoadGrid(Strict):
    concurrency: PositiveInts | None = None  # closed loop: connections
    request_rate_rps: list[Annotated[float, Field(gt=0)]] | None = None  # open loop: arrivals per second

    @model_validator(mode="after")
    def one_load_mode(self):
        if (self.concurrency is None) == (self.request_rate_rps is None):
            raise ValueError("give exactly one of 'concurrency' (closed loop) or 'request_rate_rps' (open loop)")
        return self


class Grid(Strict):
    server: ServerGrid = ServerGrid()
    archive: ArchiveGrid = ArchiveGrid()
    runtime: RuntimeGrid = RuntimeGrid()
    load: LoadGrid = LoadGrid(concurrency=[8])


class LoadSettings(Strict):
    """Fixed for every point."""

    arrival: Literal["constant", "poisson"] = "constant"
    max_connections: Annotated[int, Field(ge=1)] = 64  # open loop: most requests in flight
    warmup_s: Annotated[float, Field(ge=0)] = 2.0
    window_s: Annotated[float, Field(gt=0)] = 3.0
    stable_windows: Annotated[int, Field(ge=1)] = 3
    max_windows: Annotated[int, Field(ge=1)] = 6
    stability_tolerance: Annotated[float, Field(gt=0)] = 0.1  # (max - min) / mean of the last windows' throughput
    timeout_s: Annotated[float, Field(gt=0)] = 30.0

    @model_validator(mode="after")
    def enough_windows(self):
        if self.max_windows < self.stable_windows:
            raise ValueError(f"max_windows ({self.max_windows}) must be ≥ stable_windows ({self.stable_windows})")
        return self


class Bound(Strict):
    min: float | None = None
    max: float | None = None


class Suite(Strict):
    name: str | None = None
    targets: Annotated[list[Target], Field(min_length=1)]
    inputs: Annotated[list[InputSpec], Field(min_length=1)]
    grid: Grid = Grid()
    load: LoadSettings = LoadSettings()
    constraints: dict[str, Bound] = {}
    objective: str = "throughput_rps"
    core_plan: str | None = None  # the plan used by grid.server.pinning "plan"

    @model_validator(mode="after")
    def plan_for_pinning(self):
        if "plan" in (self.grid.server.pinning or []) and not self.core_plan:
            raise ValueError("grid.server.pinning has 'plan': give the plan file as core_plan")
        return self

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
    def distinct_targets(cls, targets: list[str]) -> list[str]:
        if len(set(targets)) != len(targets):
            raise ValueError(f"a target is listed twice (got {targets})")
        return targets


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
        if field is None:
            return []
        annotation = field.annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        candidates += [a for c in candidates for a in getattr(c, "__args__", ())]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    return list(model.model_fields) if model else []


def format_errors(path: Path, error: ValidationError) -> list[str]:
    lines = []
    for item in error.errors():
        loc = tuple(item["loc"])
        dotted = ".".join(str(p) for p in loc) or "(top level)"
        if item["type"] == "extra_forbidden":
            close = difflib.get_close_matches(str(loc[-1]), _allowed_keys(Suite, loc), n=1)
            hint = f" — did you mean {close[0]!r}?" if close else ""
            lines.append(f"{path}: {dotted}: unknown key{hint}")
            continue
        message = item["msg"].removeprefix("Value error, ")
        got = "" if item["type"] == "missing" or "got" in message or "unknown metric" in message else f" (got {item['input']!r})"
        if item["type"] == "literal_error":
            choices = re.findall(r"'([^']*)'", item["ctx"]["expected"])
            close = difflib.get_close_matches(str(item["input"]), choices, n=1)
            got += f" — did you mean {close[0]!r}?" if close else ""
        lines.append(f"{path}: {dotted}: {message}{got}")
    return lines


def load_suite(path: Path) -> Suite:
    """Parse and validate a suite file; UsageError carries one line per problem."""
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as error:
        raise UsageError(f"{path}: cannot read suite ({error.strerror})") from None
    except yaml.YAMLError as error:
        raise UsageError(f"{path}: not valid YAML: {error}") from None
    if not isinstance(raw, dict):
        raise UsageError(f"{path}: a suite is a mapping with 'targets' and 'inputs' (got {type(raw).__name__})")
    try:
        suite = Suite.model_validate(raw)
    except ValidationError as error:
        raise UsageError("\n".join(format_errors(path, error))) from None
    missing = [pattern for spec in suite.inputs for pattern in spec.images or [] if not glob.glob(pattern)]
    if missing:
        raise UsageError("\n".join(f"{path}: inputs: no file matches {pattern!r}" for pattern in missing))
    if suite.name is None:
        suite.name = path.stem
    return suite
