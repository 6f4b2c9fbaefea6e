"""Core plans for the whole server: which cores the frontend gets and how each model's cores split into
worker slots; and `segserve pin --show`, the live affinity of every process of a server (either engine).

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


# Splitting cores by cost (segserve/bench/results/core_plan_from.py measures the costs) ------------------------------


def split_cores(costs: dict[str, float], cores: list[int], frontend_cores: int = 1) -> tuple[list[int], dict[str, list[int]]]:
    """(frontend cores, cores per model): the cores after the frontend's split in proportion to each model's
    cost, by largest remainder, at least one each. Cheapest models come first, next to the frontend: with
    fewer cores than models + frontend, the frontend shares the first cores (the cheapest model's)."""
    if frontend_cores < 1:
        raise UsageError(f"--frontend-cores must be ≥ 1 (got {frontend_cores})")
    if frontend_cores > len(cores):
        raise UsageError(f"--frontend-cores {frontend_cores}: only {len(cores)} core(s) to plan ({cores_text(cores)})")
    if len(cores) < len(costs):
        raise UsageError(
            f"{len(cores)} core(s) ({cores_text(cores)}) cannot give each of {len(costs)} models its own core: "
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
                raise UsageError(f"--cores {text}: between 1 and the {len(available)} core(s) available here ({cores_text(available)})")
            return available[:count]
        cores = set()
        for part in text.split(","):
            low, _, high = part.partition("-")
            cores.update(range(int(low), int(high or low) + 1))
    except ValueError:
        raise UsageError(f"--cores {text}: not a count or a core list (e.g. 8, or 0-3,6)") from None
    missing = sorted(cores - set(available))
    if missing or not cores:
        raise UsageError(f"--cores {text}: cores {missing} are not available here ({cores_text(available)}); generate a plan where it runs")
    return sorted(cores)


def cores_text(cores: list[int]) -> str:
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
    """One row per process: the server's own (TorchServe's frontend; the Ray engine's frontend, HAProxy and Serve's
    proxy, and Ray's other processes), then every worker (replica) of every registered model."""
    rows = [{"model": f"({role})", "pid": pid, "cpus": cpus_allowed(pid)} for role, pid in server.server_processes()]
    for model in sorted(m["modelName"] for m in server.call("management", "GET", "/models?limit=1000").json()["models"]):
        for worker in server.describe(model).get("workers", []):
            if worker.get("pid"):
                rows.append({"model": model, "pid": int(worker["pid"]), "cpus": cpus_allowed(int(worker["pid"]))})
    return rows
