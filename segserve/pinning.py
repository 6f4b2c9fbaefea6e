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
        return CorePlan.model_validate(yaml.safe_load(path.read_text()))
    except OSError as error:
        raise UsageError(f"{path}: cannot read core plan ({error.strerror})") from None
    except ValidationError as error:
        lines = [
            f"{path}: {'.'.join(map(str, e['loc'])) or '(top level)'}: {e['msg'].removeprefix('Value error, ')}" for e in error.errors()
        ]
        raise UsageError("\n".join(lines)) from None


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
