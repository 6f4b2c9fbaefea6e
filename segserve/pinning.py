"""Core plans for the whole server: which cores the frontend gets and how each model's cores split into
worker slots; and `segserve pin --show`, the live affinity of every TorchServe process.

    # core_plan.yaml (2 cores: frontend and the JPEG node on core 0, segmentation on core 1)
    frontend: [0]
    models:
      seg_jpeg__jpeg: {cores: [0]}
      seg_jpeg__seg: {cores: [1], slot_cores: 1}

Models not in the plan stay on the frontend's cores (workers inherit the frontend's affinity).
"""

import json
import os
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from segserve.errors import UsageError

Core = Annotated[int, Field(ge=0)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelCores(Strict):
    cores: Annotated[list[Core], Field(min_length=1)]
    slot_cores: Annotated[int, Field(ge=1)] = 1  # cores per worker: the model gets len(cores) / slot_cores slots

    @model_validator(mode="after")
    def whole_slots(self):
        if len(self.cores) % self.slot_cores:
            raise ValueError(f"{len(self.cores)} cores do not split into slots of {self.slot_cores}")
        return self

    def slots(self) -> list[list[int]]:
        return [self.cores[i : i + self.slot_cores] for i in range(0, len(self.cores), self.slot_cores)]


class CorePlan(Strict):
    frontend: Annotated[list[Core], Field(min_length=1)]
    models: dict[str, ModelCores] = {}

    @model_validator(mode="after")
    def disjoint_and_available(self):
        available = os.sched_getaffinity(0)
        for name, cores in [("frontend", self.frontend), *((m, c.cores) for m, c in self.models.items())]:
            missing = sorted(set(cores) - available)
            if missing:
                raise ValueError(f"{name}: cores {missing} are not available here (available: {sorted(available)})")
        owners: dict[int, str] = {}
        for model, spec in self.models.items():
            for core in spec.cores:
                if core in owners:
                    raise ValueError(f"core {core} is given to both {owners[core]} and {model}: slots of different models must not overlap")
                owners[core] = model
        return self


def load_plan(path: Path) -> CorePlan:
    try:
        text = path.read_text()
    except OSError as error:
        raise UsageError(f"{path}: cannot read core plan ({error.strerror})") from None
    return parse_plan(text, path)


def parse_plan(text: str, path: Path | str) -> CorePlan:
    """A plan from YAML text; `path` names it in the error messages."""
    try:
        return CorePlan.model_validate(yaml.safe_load(text))
    except yaml.YAMLError as error:
        raise UsageError(f"{path}: not valid YAML: {error}") from None
    except ValidationError as error:
        lines = [
            f"{path}: {'.'.join(map(str, e['loc'])) or '(top level)'}: {e['msg'].removeprefix('Value error, ')}" for e in error.errors()
        ]
        raise UsageError("\n".join(lines)) from None


# A plan from measured costs -------------------------------------------------------------------------
# workflow node → the bench target that measures its model alone
NODE_TARGETS = {"seg_jpeg__seg": "seg", "seg_jpeg__jpeg": "jpeg"}
DEFAULT_CONSTRAINTS = {"requests_failed": {"max": 0}}  # without the suite's own (no suite.yaml beside the summary)


def split_cores(costs: dict[str, float], cores: list[int], frontend_cores: int = 1) -> tuple[list[int], dict[str, list[int]]]:
    """(frontend cores, cores per model): the cores after the frontend's split in proportion to each model's
    cost, by largest remainder, at least one each. Cheapest models come first, next to the frontend: with
    fewer cores than models + frontend, the frontend shares the first cores (the cheapest model's)."""
    if frontend_cores < 1:
        raise UsageError(f"--frontend-cores must be ≥ 1 (got {frontend_cores})")
    if frontend_cores > len(cores):
        raise UsageError(f"--frontend-cores {frontend_cores}: only {len(cores)} core(s) to plan ({_cores_text(cores)})")
    if len(cores) < len(costs):
        raise UsageError(
            f"{len(cores)} core(s) ({_cores_text(cores)}) cannot give each of {len(costs)} models its own core: "
            f"plan on more cores (--cores) or for fewer models"
        )
    bad = {model: cost for model, cost in costs.items() if not cost > 0}
    if bad:
        raise UsageError(f"costs must be > 0 (got {bad})")
    models = sorted(costs, key=lambda m: (costs[m], m))
    shared = len(cores) < frontend_cores + len(models)
    pool = cores if shared else cores[frontend_cores:]
    counts = largest_remainder([costs[m] for m in models], len(pool))
    given, start = {}, 0
    for model, count in zip(models, counts, strict=True):
        given[model] = pool[start : start + count]
        start += count
    return cores[:frontend_cores], given


def largest_remainder(weights: list[float], total: int) -> list[int]:
    """`total` split in proportion to `weights`, each share ≥ 1 (needs total ≥ len(weights))."""
    quotas = [total * w / sum(weights) for w in weights]
    counts = [max(1, int(q)) for q in quotas]
    while sum(counts) > total:  # the minimum of one pushed the sum over: take back from the most over-served
        over = max((i for i, c in enumerate(counts) if c > 1), key=lambda i: counts[i] - quotas[i])
        counts[over] -= 1
    by_remainder = sorted(range(len(weights)), key=lambda i: (quotas[i] - counts[i], weights[i]), reverse=True)
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


def parse_cores(text: str | None) -> list[int]:
    """--cores: None (every core this process may use), a count N (the first N of them) or a list like 0-3,6."""
    available = sorted(os.sched_getaffinity(0))
    if text is None:
        return available
    try:
        if text.isdigit():
            count = int(text)
            if not 1 <= count <= len(available):
                raise UsageError(f"--cores {text}: between 1 and the {len(available)} core(s) available here ({_cores_text(available)})")
            return available[:count]
        cores = set()
        for part in text.split(","):
            low, _, high = part.partition("-")
            cores.update(range(int(low), int(high or low) + 1))
    except ValueError:
        raise UsageError(f"--cores {text}: not a count or a core list (e.g. 8, or 0-3,6)") from None
    missing = sorted(cores - set(available))
    if missing or not cores:
        raise UsageError(
            f"--cores {text}: cores {missing} are not available here ({_cores_text(available)}); generate a plan where it runs"
        )
    return sorted(cores)


def measured_costs(source: Path) -> tuple[dict[str, dict], str]:
    """Per bench target (seg, jpeg): its best valid row, chosen as the suite chose its winners; and how rows were chosen."""
    from segserve.bench.report import read_summary
    from segserve.bench.schema import METRICS, best

    try:
        records = read_summary(source)  # a results folder or its summary.jsonl
        suite_path = (source if source.is_dir() else source.parent) / "suite.yaml"
        suite = yaml.safe_load(suite_path.read_text()) if suite_path.is_file() else None
    except FileNotFoundError as error:
        raise UsageError(str(error) if source.is_dir() else f"{source}: no such file") from None
    except (OSError, ValueError, yaml.YAMLError) as error:
        raise UsageError(f"{source}: cannot read bench results ({error})") from None
    if suite is not None:
        constraints, objective = suite.get("constraints") or {}, suite.get("objective") or "throughput_rps"
        where = f"from {suite_path.name}"
    else:
        constraints, objective = DEFAULT_CONSTRAINTS, "throughput_rps"
        where = "defaults: no suite.yaml beside the summary"
    bounds = [f"{tag} {op} {b[key]}" for tag, b in constraints.items() for key, op in (("min", "≥"), ("max", "≤")) if key in b]
    chosen_by = f"best {objective} with {', '.join(bounds) or 'no constraints'} ({where})"
    if objective not in METRICS:
        raise UsageError(f"{suite_path}: objective {objective!r} is not a known metric")
    rows = {}
    for target in dict.fromkeys(NODE_TARGETS.values()):
        row = best([r for r in records if r.get("target") == target], constraints, objective)
        if row is None or not (row.get("throughput_rps") or 0) > 0:
            raise UsageError(
                f"{source}: no valid {target!r} row ({chosen_by}): run a suite whose targets include {', '.join(NODE_TARGETS.values())}"
            )
        rows[target] = row
    return rows, chosen_by


def plan_from_results(source: Path, cores: list[int], frontend_cores: int = 1) -> str:
    """A core plan (YAML text, checked by the loader) for the workflow nodes, cores in proportion to measured cost:
    the time one request takes on each member target alone, 1 / its best throughput."""
    rows, chosen_by = measured_costs(source)
    costs_s = {node: 1 / rows[target]["throughput_rps"] for node, target in NODE_TARGETS.items()}
    frontend, given = split_cores(costs_s, cores, frontend_cores)
    total_s = sum(costs_s.values())
    lines = [
        f"# Generated by `segserve pin --plan-from {source}` for cores {_cores_text(cores)}.",
        "# The cores after the frontend's, in proportion to each node's cost per request: 1 / the throughput of its",
        "# model measured alone, from the row picked as the suite picks its winners:",
        f"# {chosen_by}.",
    ]
    for node, target in NODE_TARGETS.items():
        row = rows[target]
        lines.append(
            f"#   {node}: {target} run {row['run_id']}, {row['throughput_rps']:.1f} req/s → {1000 * costs_s[node]:.2f} ms "
            f"({costs_s[node] / total_s:.0%} of the cost) → {len(given[node])} core(s)"
        )
    shared_with = [model for model, model_cores in given.items() if set(model_cores) & set(frontend)]
    if shared_with:
        lines.append(
            f"# {len(cores)} core(s) < {len(given)} models + {frontend_cores} frontend core(s): "
            f"the frontend shares its cores with {', '.join(shared_with)}."
        )
    lines += [
        "# One slot per node (a node's extra workers share it); models not listed (seg, jpeg, seg_jpeg_fused) stay on the",
        "# frontend's cores.",
        f"frontend: {frontend}",
        "models:",
        *(f"  {model}: {{cores: {model_cores}, slot_cores: {len(model_cores)}}}" for model, model_cores in given.items()),
    ]
    text = "\n".join(lines) + "\n"
    parse_plan(text, "generated plan")  # what `serve --core-plan` will accept, checked now
    return text


def _cores_text(cores: list[int]) -> str:
    """[0, 1, 2, 5] → '0-2,5'"""
    runs: list[list[int]] = []
    for core in sorted(cores):
        if runs and core == runs[-1][1] + 1:
            runs[-1][1] = core
        else:
            runs.append([core, core])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs) or "none"


def write_plan_json(plan: CorePlan, run_dir: Path) -> Path:
    """The form workers read (handlers/pinning.py): slots as core lists, and where the slot locks live."""
    lock_dir = run_dir / "core_slots"
    lock_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "core_plan.json"
    models = {name: spec.slots() for name, spec in plan.models.items()}
    path.write_text(json.dumps({"frontend": plan.frontend, "lock_dir": str(lock_dir), "models": models}, indent=2))
    return path


def cpus_allowed(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    return "?"


def live_affinity(server) -> list[dict]:
    """One row per process: the frontend, then every worker of every registered model."""
    rows = []
    for pid in server.process_ids():
        if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"java"):
            rows.append({"model": "(frontend)", "pid": pid, "cpus": cpus_allowed(pid)})
    for model in sorted(m["modelName"] for m in server.call("management", "GET", "/models?limit=1000").json()["models"]):
        for worker in server.describe(model).get("workers", []):
            if worker.get("pid"):
                rows.append({"model": model, "pid": int(worker["pid"]), "cpus": cpus_allowed(int(worker["pid"]))})
    return rows
