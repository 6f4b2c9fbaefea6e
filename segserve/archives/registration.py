"""TorchServe's registration parameters, each spelt once for every place that takes it (#50).

TorchServe 0.12 spells one setting four ways: `max_batch_delay_ms` in a suite and a record (segserve's name, with
its unit), `max_batch_delay` in the management API's query (POST /models?max_batch_delay=), `max-batch-delay` in a
workflow spec's `models:` and `maxBatchDelay` in a model config (and config.properties' `models=` snapshot). The
suite's parameter table (bench/suite/params.py) names the setting; everything that registers a model, writes a spec,
a register.sh or a manifest takes its key from here. A workflow spec also takes some at its top level: the
only values that reach a function node (`write_models`).
"""

from dataclasses import dataclass

from segserve.archives.war import DEFAULTS, FUNCTION_NODE, WarSpec


@dataclass(frozen=True)
class Registration:
    name: str  # segserve's: the suite's YAML key and the record's column
    unit: str
    query: str | None  # POST /models?<query>=; None: a workflow spec's only (TorchServe takes it nowhere else)
    workflow: str  # a workflow spec's `models:` key (for every node, or one node's)
    model_config: str | None  # a model config's key, and a model's in config.properties' models= snapshot (None: none)
    workflow_scale: int = 1  # a spec's value is the setting × this (response_timeout: s, timeout-ms: ms)

    @property
    def workflow_only(self) -> bool:
        """A setting of a workflow spec alone: it applies to workflow targets, not to a model registered alone."""
        return self.query is None


REGISTRATIONS: dict[str, Registration] = {
    r.name: r
    for r in (
        Registration("batch_size", "requests", "batch_size", "batch-size", "batchSize"),
        Registration("max_batch_delay_ms", "ms", "max_batch_delay", "max-batch-delay", "maxBatchDelay"),
        Registration("response_timeout", "s", "response_timeout", "timeout-ms", "responseTimeout", 1000),
        # how many times the workflow executor sends a node's request again after its timeout-ms passed
        Registration("retry_attempts", "retries", None, "retry-attempts", None),
    )
}
# A workers count is registered as a pair, min and max alike, so that the count is what runs: in PUT /models/<name>'s
# query, a workflow spec and a model config.
WORKERS_QUERY = ("min_worker", "max_worker")
WORKERS_WORKFLOW = ("min-workers", "max-workers")
WORKERS_MODEL_CONFIG = ("minWorkers", "maxWorkers")
# The keys a workflow spec's `models:` may set for every node or per node (TorchServe's WorkFlow.java).
WORKFLOW_MODEL_KEYS = tuple(DEFAULTS)
# The top-level keys a function node takes (WorkFlow.java builds it from the workflow's timeout-ms and retry-attempts,
# archives/war.py): a DAG-wide value of these is written at the spec's top level too, else it never reaches one.
WORKFLOW_LEVEL_KEYS = tuple(key for key in DEFAULTS if key not in FUNCTION_NODE)


def query(values: dict) -> str:
    """The `&key=value` of POST /models for the settings given ({name: value}; None: the archive's own)."""
    return "".join(
        f"&{REGISTRATIONS[name].query}={value}" for name, value in values.items() if value is not None and REGISTRATIONS[name].query
    )


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


def workflow_top(values: dict) -> dict:
    """The spec's top-level keys of a point's DAG-wide values ({name: value}, other names ignored): those a function
    node takes (WORKFLOW_LEVEL_KEYS), in a spec's spelling and unit."""
    given = {name: value for name, value in values.items() if name in REGISTRATIONS}
    return {key: value for key, value in workflow_entry(given).items() if key in WORKFLOW_LEVEL_KEYS}


def write_models(models: dict, values: dict) -> dict:
    """A spec's `models:` (a new mapping) with `values` written in: a node's name → its keys (updated), a setting's key
    → its top-level value. A top-level value the spec has is replaced where it is; one it lacks goes first, so that
    each model node also reads it as its default (WorkFlow.java: the top-level value as read so far)."""
    tops = {key: value for key, value in values.items() if not isinstance(value, dict)}
    written = {key: value for key, value in tops.items() if key not in models}
    for key, value in models.items():
        written[key] = tops.get(key, value)
    for node, keys in values.items():
        if isinstance(keys, dict):
            written[node] = {**written[node], **keys}
    return written


def spec_overrides(before: WarSpec, after: WarSpec) -> dict:
    """The settings a .war's copy changed, as TorchServe registers them (archives/war.py): {"models.timeout-ms": 5000
    (the top level: what function nodes take), "models.<node>.timeout-ms": 5000, …} for each value that differs."""
    changed = {f"models.{key}": value for key, value in after.workflow_settings.items() if before.workflow_settings.get(key) != value}
    for name, node in after.nodes.items():
        if node.is_function:  # it takes the top level: said there
            continue
        was = before.nodes.get(name)
        changed.update({f"models.{name}.{key}": v for key, v in node.settings.items() if was is None or was.settings.get(key) != v})
    return changed


def from_workflow(entry: dict) -> dict:
    """{name: value} of a workflow `models:` entry's registration keys (its workers and other keys left out)."""
    by_key = {r.workflow: r for r in REGISTRATIONS.values()}
    return {by_key[key].name: value // by_key[key].workflow_scale for key, value in entry.items() if key in by_key}


def model_config_entry(values: dict, workers: int | None = None) -> dict:
    """A model's keys in a model config or config.properties' models= ({name: value} → {batchSize: …})."""
    entry = dict.fromkeys(WORKERS_MODEL_CONFIG, workers) if workers is not None else {}
    keys = {name: REGISTRATIONS[name].model_config for name in values}
    entry.update({keys[name]: value for name, value in values.items() if value is not None and keys[name]})
    return entry
