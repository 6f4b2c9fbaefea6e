"""An archive target's best point beyond one machine: best/k8s.yaml (a ConfigMap, Deployment and Service running
stock TorchServe) and, for a .mar, best/kserve.yaml (an InferenceService on KServe's TorchServe runtime) with
best/kserve/config/config.properties, the file KServe reads from `<storageUri>/config/`.

Every value comes from the best point's record: the registration (workers, batch size, delay, timeout) goes into
TorchServe's `model_snapshot` (how KServe's runtime registers models at start), the threads into the workers'
environment, and the pod's CPU and memory from workers × threads, the core plan and the measured RSS. Each YAML
says in its header which record each value came from. Written as plain data; tests/unit/test_manifests.py reads
them back through the official API models (kubernetes.client, kserve.models).

A workflow (.war) gets k8s.yaml only: KServe's protocol names a model, and TorchServe's snapshots hold no
workflow, so the Deployment registers it after TorchServe starts (a postStart hook, before readiness).
"""

import json
import math
import os
import re
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from segserve.archives.registration import REGISTRATIONS, model_config_entry
from segserve.bench.results import manifest_check
from segserve.bench.suite.params import PARAMS
from segserve.serving.cores import load_plan
from segserve.serving.ts_config import render_config

STORAGE_ENV = "SEGSERVE_STORAGE_URI"  # where the archives are (KServe's layout): set it before `segserve bench`
IMAGE = "pytorch/torchserve:0.12.0-cpu"  # the TorchServe release segserve pins
HOME = "/home/model-server"  # the image's working directory (logs/ land there)
PORTS = {"inference": 8080, "management": 8081, "metrics": 8082}
MEMORY_HEADROOM = 1.25  # over the RSS measured at the end of the point: allocations between samples, a larger batch
# What best/kserve.yaml says of the runtime it relies on (docs/deploying.md says the same): facts as of the KServe
# commit its schemas come from (bench/results/kserve/README.md).
RUNTIME_FUTURE = [
    "validated against KServe's InferenceService CRD (commit aaac4e29, 2026-08-21), strict; its runtime offers pytorch and v1",
    "runtime: KServe's kserve-torchserve ClusterServingRuntime, shipped since KServe v0.8.0 (the first with ServingRuntimes)",
    "and still at that commit; TorchServe is archived (0.12.0, its last release, 2025) and kserve/kserve PR #5638 removes",
    "the runtime: where a KServe no longer has it, apply best/k8s.yaml instead (stock TorchServe, nothing of KServe)",
]
KSERVE_PROTOCOL = "v1"  # KServe selects its TorchServe runtime for modelFormat pytorch with protocol v1 (v2 also runs)


@dataclass(frozen=True)
class Served:
    """What the best point registers: a model archive, or a workflow archive whose nodes run as models."""

    name: str  # registered as
    is_workflow: bool  # a .war (its nodes run as models), else a .mar
    archive: str  # the file in the model store
    registrations: dict[str, dict]  # TorchServe model → workers, batch_size, max_batch_delay_ms, response_timeout
    version: str = "1.0"  # a .mar's model version (its MANIFEST): the snapshot names it


@dataclass(frozen=True)
class Sized:
    value: object
    why: str  # which record (and which of its keys) it came from


def node_value(chosen: dict, node: str, param: str):
    """A node's value in a record: its own (`<node>_<param>`), else the DAG-wide one."""
    return chosen.get(f"{node}_{param}", chosen.get(param))


def served_foreign(target, foreign, chosen: dict) -> Served:
    """A user's archive target at its best point: the values its register.sh uses."""
    params = ("workers", *REGISTRATIONS)
    if not foreign.is_workflow:
        values = {param: node_value(chosen, target.name, param) for param in params}
        return Served(target.name, False, foreign.path.name, {target.name: values}, mar_version(foreign.path))
    nodes = {target.registered(node): {param: node_value(chosen, node, param) for param in params} for node in foreign.nodes}
    return Served(target.name, True, f"{target.name}.war", nodes)


def served_fused(name: str, mar: Path, chosen: dict, root: str) -> Served:
    """The fused .mar of a workflow's best point: one model, with the workflow's DAG-wide workers and its root node's
    batching (the fused worker takes a batch of requests at the root)."""
    values = {"workers": chosen.get("workers"), **{param: node_value(chosen, root, param) for param in REGISTRATIONS}}
    return Served(name, False, mar.name, {name: values}, mar_version(mar))


def mar_version(path: Path) -> str:
    try:
        with zipfile.ZipFile(path) as mar:
            return str(json.loads(mar.read("MAR-INF/MANIFEST.json"))["model"]["modelVersion"])
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return "1.0"  # the archiver's default; an unreadable archive failed its points anyway


def storage_uri(name: str) -> Sized:
    uri = os.environ.get(STORAGE_ENV)
    if uri:
        return Sized(uri.rstrip("/"), f"{STORAGE_ENV} when the suite finished")
    return Sized(f"s3://SET-{STORAGE_ENV}/{k8s_name(name)}", f"a placeholder: {STORAGE_ENV} was not set (docs/deploying.md)")


def k8s_name(name: str) -> str:
    """A DNS-1123 label (what Kubernetes names must be): seed_jpeg → seed-jpeg."""
    return re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:63] or "torchserve"


def cpu(chosen: dict, served: Served, core_plan: str | None) -> Sized:
    """Whole cores (with requests = limits, the kubelet's static CPU manager gives the pod cores of its own)."""
    run = chosen["run_id"]
    environment = chosen.get("environment") or {}
    measured = len(environment.get("cpu_affinity") or []) or environment.get("cpu_cores") or 1
    if chosen.get("pinning") == "plan" and core_plan:
        plan = load_plan(Path(core_plan))
        cores = set(plan.frontend).union(*(model.cores for model in plan.models.values()))
        return Sized(len(cores), f"the core plan {core_plan} ({len(cores)} cores: frontend and models), pinning plan in {run}")
    workers = {model: values["workers"] or 1 for model, values in served.registrations.items()}
    counts = ", ".join(f"{model} {count}" for model, count in workers.items())
    threads = chosen.get("omp_num_threads")
    if threads:
        total = sum(workers.values())
        cores = min(measured, total * threads + 1)
        why = f"workers {total} ({counts}) × omp_num_threads {threads} + 1 for the frontend, at most the {measured} cores of {run}"
        return Sized(cores, why)
    return Sized(measured, f"omp_num_threads unset in {run}: each of its workers ({counts}) used every one of its {measured} cores")


def memory(chosen: dict) -> Sized | None:
    rss = chosen.get("server_rss_mb")
    if not rss:
        return None
    mebibytes = math.ceil(rss * MEMORY_HEADROOM / 64) * 64
    return Sized(f"{mebibytes}Mi", f"server_rss_mb {rss:.0f} in {chosen['run_id']} (frontend + workers) + {MEMORY_HEADROOM - 1:.0%}")


def worker_env(chosen: dict) -> list[dict]:
    """The server parameters that reach workers through their environment (OMP_NUM_THREADS, …), as measured."""
    return [{"name": p.env, "value": p.env_value(chosen[p.name])} for p in PARAMS.values() if p.env and chosen.get(p.name) is not None]


def snapshot(served: Served) -> str:
    """TorchServe's model_snapshot: the models it registers at start, with their workers and batching."""
    models = {}
    for model, values in served.registrations.items():
        entry = {"defaultVersion": True, "marName": served.archive}
        entry.update(model_config_entry({name: values.get(name) for name in REGISTRATIONS}, values["workers"] or 1))
        models[model] = {served.version: entry}
    return json.dumps({"name": "startup.cfg", "modelCount": len(models), "models": models}, separators=(",", ":"))


def config_text(template: Path, overrides: dict[str, str], note: list[str]) -> str:
    """best/config.properties with the cluster's keys set; its own comments, written for one machine on loopback,
    give way to `note`."""
    with tempfile.TemporaryDirectory() as folder:
        written = Path(folder) / "config.properties"
        render_config(template, written, overrides)
        keys = [line for line in written.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return "\n".join([f"# {line}" for line in note] + keys) + "\n"


CLUSTER_NOTE = [
    "best/config.properties for a cluster: the addresses open to the pod's network (the Service is ClusterIP),",
    "token authorization off (its keys live in a file inside the pod and expire, which no probe or client outside",
    "can follow; KServe's runtime calls TorchServe without one), the model store where the archives are put, and",
    "for a model its registration at the best point as TorchServe's model_snapshot (read at start).",
]


def cluster_overrides(served: Served, model_store: str, address: dict[str, str]) -> dict[str, str]:
    overrides = {f"{api}_address": url for api, url in address.items()}
    overrides.update({"disable_token_authorization": "true", "model_store": model_store})
    if not served.is_workflow:
        overrides["model_snapshot"] = snapshot(served)
    return overrides


class BlockDumper(yaml.SafeDumper):
    """config.properties in a ConfigMap as a literal block, readable and diffable as the file it is; no anchors."""

    def ignore_aliases(self, data) -> bool:
        return True


BlockDumper.add_representer(
    str, lambda dumper, text: dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)
)


def header(chosen: dict, on: str, lines: list[str]) -> str:
    rate = chosen.get("throughput_rps") or 0.0
    top = [f"# From {chosen['run_id']} ({chosen['target']}, {rate:.1f} req/s with one server).", on]
    return "\n".join(top + [f"# {line}" for line in lines]) + "\n"


def write_manifests(
    best_dir: Path, chosen: dict, served: Served, on: str, core_plan: str | None = None, replicas: int = 1, notes: tuple[str, ...] = ()
) -> list[str]:
    """best/k8s.yaml, and for a model best/kserve.yaml and best/kserve/config/config.properties; each manifest only
    when it validates as a cluster would validate it (manifest_check.py). Returns why one was not written."""
    uri, cores, mem = storage_uri(served.name), cpu(chosen, served, core_plan), memory(chosen)
    amounts = {"cpu": str(cores.value), **({"memory": mem.value} if mem else {})}
    resources = {"requests": amounts, "limits": dict(amounts)}
    env_text = " ".join(f"{e['name']}={e['value']}" for e in worker_env(chosen))
    registrations = "; ".join(
        f"{m} " + ", ".join(f"{k} {v}" for k, v in values.items() if v is not None) for m, values in served.registrations.items()
    )
    lines = [
        f"replicas {replicas}: one TorchServe server is what {chosen['run_id']} measured; each replica adds at most its rate",
        f"cpu {cores.value}: {cores.why}",
        f"memory {mem.value}: {mem.why}" if mem else f"memory: no server_rss_mb in {chosen['run_id']}: none requested",
        f"registration from {chosen['run_id']}: {registrations}",
        f"env: {env_text or 'none'} (server parameters of {chosen['run_id']})",
        f"archives: {uri.value}/model-store/{served.archive} ({uri.why})",
        *notes,
    ]
    if chosen.get("pinning") in ("torchserve", "plan"):
        lines.append(f"pinning {chosen['pinning']} is not carried over: whole cores with requests = limits get exclusive cores")
    template = best_dir / "config.properties"
    address = {api: f"http://0.0.0.0:{port}" for api, port in PORTS.items()}
    k8s_config = config_text(template, cluster_overrides(served, f"{HOME}/model-store", address), CLUSTER_NOTE)
    k8s = k8s_objects(served, k8s_config, uri.value, resources, worker_env(chosen), replicas)
    note = [] if not served.is_workflow else ["no kserve.yaml: KServe serves models by name; a workflow runs on this Deployment"]
    versions = " and ".join(manifest_check.kubernetes_versions())
    note.append(f"validated against Kubernetes {versions}'s OpenAPI schemas, strict (kubernetes-validate)")
    refused = [f"best/k8s.yaml not written: {problem}" for problem in manifest_check.kubernetes_problems(k8s)]
    if not refused:
        (best_dir / "k8s.yaml").write_text(header(chosen, on, lines + note) + yaml.dump_all(k8s, Dumper=BlockDumper, sort_keys=False))
    if served.is_workflow:
        return refused
    kserve_address = {"inference": "http://0.0.0.0:8085", "management": "http://0.0.0.0:8085", "metrics": "http://0.0.0.0:8082"}
    kserve_config = best_dir / "kserve" / "config" / "config.properties"
    kserve_config.parent.mkdir(parents=True, exist_ok=True)
    overrides = {**cluster_overrides(served, "/mnt/models/model-store", kserve_address), "enable_envvars_config": "true"}
    kserve_config.write_text(config_text(template, overrides, CLUSTER_NOTE))
    lines[-1] += f"; upload best/kserve/config/config.properties to {uri.value}/config/"
    service = inference_service(served, uri.value, resources, worker_env(chosen), replicas, chosen.get("concurrency"))
    problems = manifest_check.inference_service_problems(service)
    if problems:
        return refused + [f"best/kserve.yaml not written: {problem}" for problem in problems]
    lines += RUNTIME_FUTURE
    (best_dir / "kserve.yaml").write_text(header(chosen, on, lines) + yaml.dump(service, Dumper=BlockDumper, sort_keys=False))
    return refused


def inference_service(served: Served, uri: str, resources: dict, env: list[dict], replicas: int, concurrency) -> dict:
    model = {"modelFormat": {"name": "pytorch"}, "protocolVersion": KSERVE_PROTOCOL, "storageUri": uri, "resources": resources}
    if env:
        model["env"] = env
    predictor = {"minReplicas": replicas, "maxReplicas": replicas, "model": model}
    if concurrency:  # raise maxReplicas and KServe adds pods when a pod has more requests in flight than measured
        predictor.update({"scaleMetric": "concurrency", "scaleTarget": int(concurrency)})
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": k8s_name(served.name)},
        "spec": {"predictor": predictor},
    }


def k8s_objects(served: Served, config: str, uri: str, resources: dict, env: list[dict], replicas: int) -> list[dict]:
    name = k8s_name(served.name)
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "segserve-best"}
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{name}-config", "labels": labels},
        "data": {"config.properties": config},
    }
    store = {"name": "model-store", "mountPath": f"{HOME}/model-store"}
    container = {
        "name": "torchserve",
        "image": IMAGE,
        "command": ["torchserve"],
        "args": ["--start", "--foreground", "--ts-config", f"{HOME}/config/config.properties", "--model-store", f"{HOME}/model-store"],
        "ports": [{"name": api, "containerPort": port} for api, port in PORTS.items()],
        "resources": resources,
        "readinessProbe": {"httpGet": {"path": "/ping", "port": "inference"}, "initialDelaySeconds": 10, "periodSeconds": 5},
        "volumeMounts": [{"name": "config", "mountPath": f"{HOME}/config"}, store],
    }
    if env:
        container["env"] = env
    if served.is_workflow:  # probes start once this returns: ready means registered
        container["lifecycle"] = {"postStart": {"exec": {"command": ["python3", "-c", register_workflow(served)]}}}
    volumes = [{"name": "config", "configMap": {"name": f"{name}-config"}}]
    pod = {"containers": [container], "volumes": volumes}
    if uri.startswith("pvc://"):
        claim, _, path = uri.removeprefix("pvc://").partition("/")
        volumes.append({"name": "model-store", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
        store["subPath"] = f"{path}/model-store".lstrip("/")
    else:  # s3:// (the placeholder too): copied in before TorchServe starts, credentials from an optional Secret
        volumes.append({"name": "model-store", "emptyDir": {}})
        pod["initContainers"] = [
            {
                "name": "archives",
                "image": "amazon/aws-cli:2.22.0",
                "args": ["s3", "cp", "--recursive", f"{uri}/model-store/", f"{HOME}/model-store/"],
                "envFrom": [{"secretRef": {"name": "aws-credentials", "optional": True}}],
                "volumeMounts": [store],
            }
        ]
    template = {"metadata": {"labels": labels}, "spec": pod}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": template},
    }
    ports = [{"name": api, "port": port, "targetPort": api} for api, port in PORTS.items()]
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": labels},
        "spec": {"selector": labels, "ports": ports},
    }
    return [config_map, deployment, service]


def register_workflow(served: Served) -> str:
    """Python for the postStart hook: register the .war once the management API answers (2 minutes at most)."""
    url = f"http://127.0.0.1:{PORTS['management']}/workflows?url={served.archive}&workflow_name={served.name}"
    return (
        "import time, urllib.request\n"
        "for _ in range(60):\n"
        "    try:\n"
        f"        urllib.request.urlopen(urllib.request.Request({url!r}, method='POST'), timeout=600); break\n"
        "    except OSError: time.sleep(2)\n"
        "else: raise SystemExit('the workflow did not register')\n"
    )
