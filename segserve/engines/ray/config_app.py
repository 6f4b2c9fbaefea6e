"""Ray Serve application builders for a Serve config file: what the `import_path` and `args` of best/rayservice.yaml's
serveConfigV2 (and `serve deploy`) name. Each builds the application `segserve serve --engine ray` deploys through
its management API (app.model_app, app.ingress_app), from plain arguments: archives by their path in the model store
(every node of the cluster has the store: best/rayservice.yaml's init container), the inference key file (a Secret
mounted in every pod), the registration's values. Serve calls a builder with the application's `args` as a dict.

- model: one .mar at /predictions/<name> (TorchServe's defaults where args give none);
- workflow_node: one node of a .war (<workflow>__<node>) as POST /workflows registers it (workflow.node_specs: a
  model node's .mar, a function node's handler in the .war), its batching and replicas as args give them;
- ingress: TorchServe's inference API at `/`, told each model's version (its manifest's) and each workflow's DAG.
"""

from dataclasses import replace
from pathlib import Path

from segserve.archives.war import read_war
from segserve.engines.ray.app import ingress_app, model_app
from segserve.engines.ray.model_spec import ModelSpec
from segserve.engines.ray.workflow import node_specs, plan_of

FOLDER = "/tmp"  # where a replica unpacks its archive (a folder of its own in it): it must exist on every node
REGISTRATION = ("batch_size", "max_batch_delay_ms", "workers", "job_queue_size")


def _given(args: dict) -> dict:
    return {key: int(args[key]) for key in REGISTRATION if args.get(key) is not None}


def model(args: dict):
    """args: name, archive (the .mar's path), key_file; batch_size, max_batch_delay_ms, workers, job_queue_size, folder."""
    spec = ModelSpec(args["name"], args["archive"], **_given(args))
    return model_app(spec, args.get("folder", FOLDER), args["key_file"])


def _war(path: str):
    return read_war(Path(path), Path(path).name)


def _nodes(war_path: str, workflow: str, job_queue_size: int) -> dict[str, ModelSpec]:
    return node_specs(_war(war_path), workflow, Path(war_path).parent, job_queue_size)


def workflow_node(args: dict):
    """args: war (the .war's path; its nodes' .mar files beside it), workflow (its registered name), node, key_file;
    batch_size, max_batch_delay_ms, workers (the node's; else the spec's), job_queue_size, folder."""
    given = _given(args)
    spec = _nodes(args["war"], args["workflow"], given.pop("job_queue_size", 100))[args["node"]]
    return model_app(replace(spec, **given), args.get("folder", FOLDER), args["key_file"])


def ingress(args: dict):
    """args: key_file; models {name: its .mar's path}; workflows {name: its .war's path}."""
    versions = {name: ModelSpec(name, archive).version() for name, archive in (args.get("models") or {}).items()}
    plans = {}
    for name, war_path in (args.get("workflows") or {}).items():
        plans[name] = plan_of(_war(war_path), name).to_config()
        versions.update({spec.name: spec.version() for spec in _nodes(war_path, name, 100).values()})
    return ingress_app(args["key_file"], versions, plans)
