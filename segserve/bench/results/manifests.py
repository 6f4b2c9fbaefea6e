"""An archive target's best point beyond one machine: best/k8s.yaml (a ConfigMap, Deployment and Service running
stock TorchServe) and, for a .mar, best/kserve.yaml (an InferenceService on KServe's TorchServe runtime) with
best/kserve/config/config.properties, the file KServe reads from `<storageUri>/config/`.

Every value comes from the best point's record: the registration (workers, batch size, delay, timeout) goes into
TorchServe's `model_snapshot` (how KServe's runtime registers models at start), the threads into the workers'
environment (with the server environment segserve measured it in, SERVER_ENV), and the pod's CPU and memory from
workers × threads, the core plan and the measured RSS. Each YAML says in its header which record each value came
from. Written as plain data (best/k8s.yaml's objects: pods.py), and only once manifest_check.py passes them;
tests/unit/test_manifests.py reads them back through the official API models (kubernetes.client, kserve.models).

Exposed (#58): TorchServe's management API stays on 127.0.0.1 in both, the model API off, gRPC on loopback unless
the point was measured over it. best/k8s.yaml keeps token authorization on (pods.py says how its keys are read);
KServe's runtime calls TorchServe without a key, so best/kserve/config/config.properties turns it off and binds
TorchServe's APIs to 127.0.0.1, behind KServe's own server in the same container; the InferenceService is
cluster-local, with a NetworkPolicy and an Istio AuthorizationPolicy beside it (mesh.py).

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
from segserve.bench.results import manifest_check, mesh, pods, rayservice
from segserve.bench.suite.params import PARAMS
from segserve.serving.cores import load_plan
from segserve.serving.server import SERVER_ENV
from segserve.serving.ts_config import render_config

STORAGE_ENV = "SEGSERVE_STORAGE_URI"  # where the archives are (KServe's layout): set it before `segserve bench`
MEMORY_HEADROOM = 1.25  # over the RSS measured at the end of the point: allocations between samples, a larger batch
DEFAULT_MEMORY = "2Gi"  # without a measured RSS: KServe's kserve-torchserve runtime's own request and limit
K8S_ADDRESS = {"inference": "http://0.0.0.0:8080", "management": "http://127.0.0.1:8081", "metrics": "http://0.0.0.0:8082"}
# KServe's runtime image runs its own server on 8080 (HTTP) and 8081 (gRPC) and calls TorchServe at these addresses
# (its kserve_wrapper reads them from this file): TorchServe's APIs on one loopback port, its metrics for Prometheus.
KSERVE_ADDRESS = {"inference": "http://127.0.0.1:8085", "management": "http://127.0.0.1:8085", "metrics": "http://0.0.0.0:8082"}
KSERVE_PORT = 8080  # KServe's server in the predictor pod
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


def memory(chosen: dict) -> Sized:
    rss = chosen.get("server_rss_mb")
    if not rss:
        return Sized(DEFAULT_MEMORY, f"no server_rss_mb in {chosen['run_id']}: KServe's runtime's default; measure the RSS")
    mebibytes = math.ceil(rss * MEMORY_HEADROOM / 64) * 64
    return Sized(f"{mebibytes}Mi", f"server_rss_mb {rss:.0f} in {chosen['run_id']} (frontend + workers) + {MEMORY_HEADROOM - 1:.0%}")


def worker_env(chosen: dict) -> list[dict]:
    """The environment the point's server ran in: segserve's SERVER_ENV (OMP_WAIT_POLICY, glibc's malloc thresholds),
    unless this process's own set them (the bench runs here), then the server parameters that reach workers through
    their environment (OMP_NUM_THREADS, …), as measured."""
    env = {name: os.environ.get(name, value) for name, value in SERVER_ENV.items()}
    env.update({p.env: p.env_value(chosen[p.name]) for p in PARAMS.values() if p.env and chosen.get(p.name) is not None})
    return [{"name": name, "value": value} for name, value in env.items()]


def snapshot(served: Served) -> str:
    """TorchServe's model_snapshot: the models it registers at start, with their workers and batching."""
    models = {}
    for model, values in served.registrations.items():
        entry = {"defaultVersion": True, "marName": served.archive}
        entry.update(model_config_entry({name: values.get(name) for name in REGISTRATIONS}, values["workers"] or 1))
        models[model] = {served.version: entry}
    return json.dumps({"name": "startup.cfg", "modelCount": len(models), "models": models}, separators=(",", ":"))


def config_text(template: Path, overrides: dict[str, str], note: list[str]) -> str:
    """best/config.properties with the cluster's keys set; its own comments, written for one machine, give way to
    `note`."""
    with tempfile.TemporaryDirectory() as folder:
        written = Path(folder) / "config.properties"
        render_config(template, written, overrides)
        keys = [line for line in written.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return "\n".join([f"# {line}" for line in note] + keys) + "\n"


K8S_NOTE = [
    "best/config.properties for a cluster: inference and metrics open to the pod's network (the Service exposes",
    "inference only; a NetworkPolicy says who reaches it), the management API on 127.0.0.1 (the pod's own processes),",
    "the model API off, gRPC on loopback unless the point was measured over it, token authorization ON (the keys",
    "in key_file.json in the pod's working directory, renewed by the readiness probe: docs/deploying.md), the model store",
    "where the archives are put, and for a model its registration as TorchServe's model_snapshot (read at start).",
]
KSERVE_NOTE = [
    "best/config.properties for KServe's TorchServe runtime: token authorization OFF, because KServe's server in the",
    "same container calls TorchServe without a key; so TorchServe's APIs listen on 127.0.0.1 only (that server is",
    "what the pod serves), metrics for Prometheus, the model API off, gRPC on loopback, and the registration as",
    "TorchServe's model_snapshot (read at start). best/kserve.yaml's NetworkPolicy says who reaches the pod.",
]


def cluster_overrides(served: Served, model_store: str, address: dict[str, str], token: bool, grpc: bool) -> dict[str, str]:
    """The keys a cluster's config.properties sets over best/config.properties (#58)."""
    overrides = {f"{api}_address": url for api, url in address.items()}
    overrides.update(
        {
            "grpc_inference_address": "0.0.0.0" if grpc else "127.0.0.1",  # TorchServe 0.12 always opens gRPC
            "grpc_management_address": "127.0.0.1",
            "disable_token_authorization": "false" if token else "true",
            "enable_model_api": "false",  # gates POST and DELETE /models only; POST /workflows is not gated (0.12)
            "model_store": model_store,
        }
    )
    if token:
        overrides["token_expiration_min"] = str(pods.TOKEN_LIFETIME_MIN)
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
    best_dir: Path,
    chosen: dict,
    served: Served,
    on: str,
    core_plan: str | None = None,
    replicas: int = 1,
    notes: tuple[str, ...] = (),
    p99_bound_ms: float | None = None,
    measured: bool = True,
) -> list[str]:
    """best/k8s.yaml and best/rayservice.yaml, and for a model best/kserve.yaml and best/kserve/config/config.properties;
    each manifest only when it passes manifest_check.py (the schemas a cluster checks, the restricted profile, what it
    exposes). `p99_bound_ms` (the suite's) sizes a Ray point (sizing.py); `measured`: False where `served` is not what
    the point measured (a .war's fused .mar). Returns why one was not written."""
    uri, cores, mem = storage_uri(served.name), cpu(chosen, served, core_plan), memory(chosen)
    amounts = {"cpu": str(cores.value), "memory": mem.value}
    resources = {"requests": amounts, "limits": dict(amounts)}
    env, grpc = worker_env(chosen), chosen.get("protocol") == "grpc"
    env_text = " ".join(f"{e['name']}={e['value']}" for e in env)
    registrations = "; ".join(
        f"{m} " + ", ".join(f"{k} {v}" for k, v in values.items() if v is not None) for m, values in served.registrations.items()
    )
    name = k8s_name(served.name)
    lines = [
        f"replicas {replicas}: one TorchServe server is what {chosen['run_id']} measured; each replica adds at most its rate",
        f"cpu {cores.value}: {cores.why}",
        f"memory {mem.value}: {mem.why}",
        f"registration from {chosen['run_id']}: {registrations}",
        f"env: {env_text} (segserve's server environment and the parameters of {chosen['run_id']})",
        f"archives: {uri.value}/model-store/{served.archive} ({uri.why})",
        *notes,
    ]
    if chosen.get("pinning") in ("torchserve", "plan"):
        lines.append(f"pinning {chosen['pinning']} is not carried over: whole cores with requests = limits get exclusive cores")
    exposed = ", ".join(f"{api} {port}" for api, port in pods.served_ports(grpc).items())
    access = [
        f"exposed: {exposed} (Service and NetworkPolicy: pods labelled {pods.CLIENT_LABEL}: {name}); metrics 8082 to pods",
        f'labelled {pods.SCRAPE_LABEL}: "true" in the namespace {pods.metrics_namespace()} ({pods.METRICS_NAMESPACE_ENV}); '
        "management on 127.0.0.1 in the pod; gRPC " + ("inference open: the point was measured over gRPC" if grpc else "on loopback"),
        f"egress: DNS, and HTTPS ({pods.HTTPS_PORT}) to public addresses only: not {', '.join(pods.NOT_PUBLIC_V4)} (the",
        "metadata address 169.254.169.254 among them), nor IPv6's private and link-local ranges",
    ]
    template = best_dir / "config.properties"
    k8s_config = config_text(template, cluster_overrides(served, f"{pods.HOME}/model-store", K8S_ADDRESS, True, grpc), K8S_NOTE)
    k8s = pods.k8s_objects(name, labels(name), k8s_config, served, uri.value, resources, env, replicas, grpc)
    k8s_lines = [
        *access,
        "token authorization on: each pod makes its own keys at start (TorchServe 0.12 takes none from outside), valid",
        f"{pods.TOKEN_LIFETIME_MIN} minutes; the readiness probe makes a new inference key in its last {pods.TOKEN_RENEW_BEFORE_MIN}"
        " (a client refused with 400 InvalidKeyException reads it again);",
        f"a client reads the inference key (and only it): {pods.inference_key_command(name)}",
        f"a new inference key now (the old one stops working): {pods.renew_command(name)}",
        f"pods: Pod Security Standards restricted, read-only root, user {pods.USER_ID}; images by tag unless {pods.IMAGE_ENV}",
        f"and {pods.COPY_IMAGE_ENV} name digests (repo@sha256:...)",
    ]
    if served.is_workflow:
        k8s_lines.append("no kserve.yaml: KServe serves models by name; a workflow runs on this Deployment")
    versions = " and ".join(manifest_check.kubernetes_versions())
    k8s_lines.append(f"validated against Kubernetes {versions}'s OpenAPI schemas, strict (kubernetes-validate)")
    problems = manifest_check.kubernetes_problems(k8s) + manifest_check.pod_problems(k8s) + manifest_check.config_problems(k8s_config, True)
    problems += manifest_check.network_policy_problems(k8s, egress=True)
    refused = [f"best/k8s.yaml not written: {problem}" for problem in problems]
    if not refused:
        text = header(chosen, on, lines + k8s_lines) + yaml.dump_all(k8s, Dumper=BlockDumper, sort_keys=False)
        (best_dir / "k8s.yaml").write_text(text)
    refused += write_rayservice(best_dir, chosen, served, header(chosen, on, lines[3:]), uri.value, env, p99_bound_ms, measured)
    if served.is_workflow:
        return refused
    kserve = inference_service(served, uri.value, resources, env, replicas, chosen.get("concurrency"))
    archives = next(index for index, line in enumerate(lines) if line.startswith("archives: "))
    lines[archives] += f"; upload best/kserve/config/config.properties to {uri.value}/config/"
    return refused + write_kserve(best_dir, kserve, served, header(chosen, on, lines))


def write_kserve(best_dir: Path, service: dict, served: Served, top: str) -> list[str]:
    """best/kserve.yaml (the InferenceService, its NetworkPolicy and AuthorizationPolicy) and
    best/kserve/config/config.properties, once they pass manifest_check.py; else why not."""
    name = service["metadata"]["name"]
    overrides = {**cluster_overrides(served, "/mnt/models/model-store", KSERVE_ADDRESS, False, False), "enable_envvars_config": "true"}
    kserve_config = config_text(best_dir / "config.properties", overrides, KSERVE_NOTE)
    policy, istio = mesh.network_policy(name, labels(name), KSERVE_PORT), mesh.authorization_policy(name, labels(name))
    problems = manifest_check.inference_service_problems(service) + manifest_check.kubernetes_problems([policy])
    problems += manifest_check.network_policy_problems([policy], egress=False) + manifest_check.authorization_policy_problems(istio)
    problems += manifest_check.config_problems(kserve_config, False)
    if problems:
        return [f"best/kserve.yaml not written: {problem}" for problem in problems]
    (best_dir / "kserve" / "config").mkdir(parents=True, exist_ok=True)
    (best_dir / "kserve" / "config" / "config.properties").write_text(kserve_config)
    kserve_lines = [
        f"exposed: KServe's server on {KSERVE_PORT}; token authorization OFF (KServe's runtime calls TorchServe without a",
        "key), so TorchServe listens on 127.0.0.1 only; cluster-local (networking.knative.dev/visibility): no external route;",
        f"the NetworkPolicy admits pods labelled {pods.CLIENT_LABEL}: {name} on {KSERVE_PORT}, the metrics to pods labelled",
        f'{pods.SCRAPE_LABEL}: "true" in the namespace {pods.metrics_namespace()}, and KServe\'s Serverless request path on the',
        "queue-proxy's ports only: " + "; ".join(f"{ns} {', '.join(map(str, ports))}" for ns, ports in mesh.KSERVE_FROM.items()) + ";",
        "the AuthorizationPolicy admits the same path by mesh identity where the predictor runs with an Istio sidecar;",
        "any pod in the cluster that calls the cluster-local URL comes through its gateway: no key per client here",
        f"(best/k8s.yaml has one); edit both policies for another ingress; validated against Istio's CRD ({mesh.ISTIO_API})",
        "no read-only root here: KServe's server and TorchServe write in the runtime image's home (best/k8s.yaml has one)",
        *RUNTIME_FUTURE,
    ]
    documents = yaml.dump_all([service, policy, istio], Dumper=BlockDumper, sort_keys=False)
    (best_dir / "kserve.yaml").write_text(top + "".join(f"# {line}\n" for line in kserve_lines) + documents)
    return []


def write_rayservice(best_dir: Path, chosen: dict, served: Served, top: str, uri: str, env, p99_bound_ms, measured: bool) -> list[str]:
    """best/rayservice.yaml (rayservice.py) once rayservice.problems passes; else why not."""
    name = k8s_name(served.name)
    replicas = {model: values["workers"] or 1 for model, values in served.registrations.items()}
    if not replicas:
        return [f"best/rayservice.yaml not written: {served.name} has no node in its DAG to run"]
    lay = rayservice.layout(chosen, replicas, p99_bound_ms, measured=measured)
    memory = rayservice.memory_mi(chosen, lay, sum(replicas.values()))
    service = rayservice.ray_service(name, labels(f"{name}-ray"), served, lay, uri, env, memory[0])
    policies = rayservice.network_policies(name, labels(f"{name}-ray"))
    problems = rayservice.problems(service, policies)
    if problems:
        return [f"best/rayservice.yaml not written: {problem}" for problem in problems]
    said = "".join(f"# {line}\n" for line in rayservice.lines(name, chosen, lay, memory))
    (best_dir / "rayservice.yaml").write_text(top + said + yaml.dump_all([service, *policies], Dumper=BlockDumper, sort_keys=False))
    return []


def labels(name: str) -> dict:
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "segserve-best"}


def inference_service(served: Served, uri: str, resources: dict, env: list[dict], replicas: int, concurrency) -> dict:
    model = {"modelFormat": {"name": "pytorch"}, "protocolVersion": KSERVE_PROTOCOL, "storageUri": uri, "resources": resources}
    if env:
        model["env"] = env
    # the restricted profile where KServe's runtime allows it: its container writes in its image's home (no read-only root)
    model["securityContext"] = {key: value for key, value in pods.container_security().items() if key != "readOnlyRootFilesystem"}
    predictor = {"minReplicas": replicas, "maxReplicas": replicas, "automountServiceAccountToken": False, "model": model}
    predictor["securityContext"] = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    if concurrency:  # raise maxReplicas and KServe adds pods when a pod has more requests in flight than measured
        predictor.update({"scaleMetric": "concurrency", "scaleTarget": int(concurrency)})
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": k8s_name(served.name), "labels": {**labels(k8s_name(served.name)), **mesh.VISIBILITY}},
        "spec": {"predictor": predictor},
    }
