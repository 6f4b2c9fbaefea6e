"""TorchServe's registration parameters, each spelt once for every place that takes it (#50).

TorchServe 0.12 spells one setting four ways: `max_batch_delay_ms` in a suite and a record (segserve's name, with
its unit), `max_batch_delay` in the management API's query (POST /models?max_batch_delay=), `max-batch-delay` in a
workflow spec's `models:` and `maxBatchDelay` in a model config (and config.properties' `models=` snapshot). The
suite's parameter table (bench/suite/params.py) names the setting; everything that registers a model, writes a spec,
a register.sh or a manifest takes its key from here.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Registration:
    name: str  # segserve's: the suite's YAML key and the record's column
    unit: str
    query: str  # POST /models?<query>=
    workflow: str  # a workflow spec's `models:` key (for every node, or one node's)
    model_config: str  # a model config's key, and a model's in config.properties' models= snapshot
    workflow_scale: int = 1  # a spec's value is the setting × this (response_timeout: s, timeout-ms: ms)


REGISTRATIONS: dict[str, Registration] = {
    r.name: r
    for r in (
        Registration("batch_size", "requests", "batch_size", "batch-size", "batchSize"),
        Registration("max_batch_delay_ms", "ms", "max_batch_delay", "max-batch-delay", "maxBatchDelay"),
        Registration("response_timeout", "s", "response_timeout", "timeout-ms", "responseTimeout", 1000),
    )
}
# A workers count is registered as a pair, min and max alike, so that the count is what runs: in PUT /models/<name>'s
# query, a workflow spec and a model config.
WORKERS_QUERY = ("min_worker", "max_worker")
WORKERS_WORKFLOW = ("min-workers", "max-workers")
WORKERS_MODEL_CONFIG = ("minWorkers", "maxWorkers")
# The keys a workflow spec's `models:` may set for every node or per node (TorchServe's WorkFlow.java).
WORKFLOW_MODEL_KEYS = (*WORKERS_WORKFLOW, *(r.workflow for r in REGISTRATIONS.values()), "retry-attempts")


def query(values: dict) -> str:
    """The `&key=value` of POST /models for the settings given ({name: value}; None: the archive's own)."""
    return "".join(f"&{REGISTRATIONS[name].query}={value}" for name, value in values.items() if value is not None)


def register_query(archive: str, name: str, workers: int, values: dict) -> str:
    """POST /models?<this>: the archive registered as `name` with that many workers and the settings given, answered
    once its workers are up."""
    return f"url={archive}&model_name={name}&initial_workers={workers}&synchronous=true" + query(values)


def scale_query(workers: int) -> str:
    """PUT /models/<name>?<this>: that many workers, and no fewer or more."""
    return "&".join(f"{key}={workers}" for key in WORKERS_QUERY) + "&synchronous=true"


def workflow_entry(values: dict, workers: int | None = None) -> dict:
    """A workflow spec's `models:` entry ({name: value} → {batch-size: …, timeout-ms: …}, min/max-workers)."""
    entry = {
        REGISTRATIONS[name].workflow: value * REGISTRATIONS[name].workflow_scale for name, value in values.items() if value is not None
    }
    if workers is not None:
        entry.update(dict.fromkeys(WORKERS_WORKFLOW, workers))
    return entry


def from_workflow(entry: dict) -> dict:
    """{name: value} of a workflow `models:` entry's registration keys (its workers and other keys left out)."""
    by_key = {r.workflow: r for r in REGISTRATIONS.values()}
    return {by_key[key].name: value // by_key[key].workflow_scale for key, value in entry.items() if key in by_key}


def model_config_entry(values: dict, workers: int | None = None) -> dict:
    """A model's keys in a model config or config.properties' models= ({name: value} → {batchSize: …})."""
    entry = dict.fromkeys(WORKERS_MODEL_CONFIG, workers) if workers is not None else {}
    entry.update({REGISTRATIONS[name].model_config: value for name, value in values.items() if value is not None})
    return entry
