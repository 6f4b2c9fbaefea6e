"""best/rayservice.yaml (#67): the best point on KubeRay, a RayService (a Ray cluster of a head and a group of worker
nodes, and the Serve applications of `segserve serve --engine ray` in its serveConfigV2) with two NetworkPolicies.
manifests.py writes it once these pass: KubeRay's CRD (manifest_check.ray_service_problems), Ray Serve's own config
schema for serveConfigV2 (a string to the CRD), Kubernetes' schemas and the restricted profile for the head's and the
workers' pod templates (taken out as Deployments: pod_templates), the NetworkPolicies' schemas and rules.

- Sized (sizing.py) where the best point is a Ray point, the suite has a p99 bound and SEGSERVE_TARGET_RPS a rate:
  each deployment's replicas (a .mar: Serve's autoscaling between the point's and the target's), each replica's
  num_cpus, the worker nodes. Else the point's own replicas on one worker node of the point's cores, as measured.
- Worker nodes are a fixed group: KubeRay's autoscaler (enableInTreeAutoscaling) runs beside the head with a service
  account token that may change the RayCluster; here no pod mounts one. Serve's autoscaling moves replicas within them.
- The image (SEGSERVE_RAY_IMAGE): Ray, torch, torchserve's Python side and segserve; docs/deploying.md builds one.
- Token auth: KubeRay's authOptions with a Secret of the user's (key auth_token): KubeRay sets RAY_AUTH_MODE and
  RAY_AUTH_TOKEN in every Ray container. The inference key (TorchServe's key_file.json) is a second Secret, mounted in
  every pod: the ingress and every replica check it, as on one machine.
- Serve's own proxy on every node (port 8000), not HAProxy mode: that one binds each replica's HTTP port and its stats
  (8404, no authentication) on every interface and keeps fixed /tmp paths; the NetworkPolicy names fixed ports.
- Ray's ports are pinned (rayStartParams) so the NetworkPolicy names each one: clients reach only the serve port; the
  KubeRay operator's namespace only the head's dashboard (8265, which it polls); Ray's own ports only the cluster's pods.
- Pods: the restricted profile (non-root, no escalation, ALL capabilities dropped, seccomp RuntimeDefault, no service
  account token) with a read-only root: Ray writes its session (/tmp/ray), a replica unpacks its archive under /tmp,
  so /tmp is an emptyDir, HOME in it; /dev/shm (Ray's object store) a memory emptyDir; archives from S3 by
  pods.model_store's init container, as best/k8s.yaml has them.
"""

import math
import os
from dataclasses import dataclass

import yaml

from segserve.bench.results import manifest_check, pods
from segserve.bench.results.sizing import NotSized, Sizing, node_cores, size, target_rps

IMAGE_ENV = "SEGSERVE_RAY_IMAGE"
# no published image holds segserve: a name that cannot resolve (.invalid), said in the header, until one is set
IMAGE = "set-segserve-ray-image.invalid/segserve-ray:2.60.0"
KUBERAY_NAMESPACE_ENV, KUBERAY_NAMESPACE = "SEGSERVE_KUBERAY_NAMESPACE", "ray-system"  # where Ray's docs install it
RAY_VERSION = "2.60.0"  # benchmarks/peers/requirements-ray.txt's pin, what `make setup` installs
SERVE_PORT, DASHBOARD_PORT, METRICS_PORT = 8000, 8265, 8080  # Serve's, the dashboard's and KubeRay's metrics default
# every other port Ray listens on, pinned: the GCS (head), each node's raylet, object manager, agents, and the range
# its workers (replicas and Serve's actors) take; a Ray server whose port no flag sets (a Prometheus exporter of the
# dashboard head) is reached by no pod
RAY_PORTS = {
    "node-manager-port": 6380,
    "object-manager-port": 6381,
    "runtime-env-agent-port": 6382,
    "dashboard-agent-grpc-port": 6383,
    "dashboard-agent-listen-port": 52365,
}
GCS_PORT, WORKER_PORTS = 6379, (10002, 19999)  # KubeRay's head port; Ray's default worker range
HEAD_RESOURCES = {"cpu": "2", "memory": "4Gi"}  # not measured: the GCS, dashboard, Serve's controller, a proxy, the ingress
OBJECT_STORE_MI = 512  # bodies over 100 KB pass through it: 16 connections of 688 KB hold 11 MB
SHM_MARGIN_MI = 128  # /dev/shm a little over the object store: Ray falls back to a slow /tmp store when it has less
MEMORY_HEADROOM = 1.25
DEFAULT_NODE_MEMORY_MI = 4096  # a point without server_rss_mb
TMP, SHM, KEYS = "/tmp", "/dev/shm", "/etc/segserve"
KEY_FILE = f"{KEYS}/key_file.json"
STORE = f"{pods.HOME}/model-store"  # where pods.model_store's init container puts the archives
NODE_LABEL = "segserve.io/ray-node"  # head or worker: the head's NetworkPolicy selects it


@dataclass(frozen=True)
class Layout:
    """Replicas per deployment, each replica's num_cpus, the worker nodes; `sizing` where sized, else why not."""

    replicas: dict[str, int]
    num_cpus: float
    node_cores: int
    per_node: int  # replicas a worker node holds
    nodes: int
    sizing: Sizing | None
    why_not: str = ""


def layout(chosen: dict, replicas: dict[str, int], bound_ms: float | None, environ=os.environ, measured: bool = True) -> Layout:
    """Sized where sizing.size can (the target rate from `environ`); else the point's replicas on one node of its
    cores, num_cpus shared out so they all fit on it (and none on the head, which has no CPUs for Ray). `measured`:
    False for what the point did not measure itself (a .war's fused .mar)."""
    try:
        if not measured:
            raise NotSized(f"{chosen['run_id']} measured the workflow, not this .mar")
        sized = size(chosen, replicas, bound_ms, target_rps(environ))
        return Layout(sized.needed, sized.cores_per_replica, sized.node_cores, sized.replicas_per_node, sized.nodes, sized)
    except NotSized as why:
        cores = node_cores(chosen) or 1
        share = max(math.floor(cores / sum(replicas.values()) * 10) / 10, 0.1)
        return Layout(dict(replicas), share, cores, sum(replicas.values()), 1, None, str(why))


def memory_mi(chosen: dict, lay: Layout, measured_replicas: int) -> tuple[int, str]:
    """A worker node's memory (MiB) and why: its replicas' share of the point's RSS, with headroom, and the object store."""
    rss, replicas_per_node = chosen.get("server_rss_mb"), lay.per_node
    if not rss:
        return (
            DEFAULT_NODE_MEMORY_MI + OBJECT_STORE_MI,
            f"no server_rss_mb in {chosen['run_id']}: {DEFAULT_NODE_MEMORY_MI} MiB, not measured",
        )
    mebibytes = math.ceil(rss / measured_replicas * replicas_per_node * MEMORY_HEADROOM / 64) * 64
    why = f"server_rss_mb {rss:.0f} of {chosen['run_id']} ÷ {measured_replicas} replicas × {replicas_per_node} a node + 25%"
    return mebibytes + OBJECT_STORE_MI, f"{why}, + {OBJECT_STORE_MI} MiB object store (/dev/shm)"


def applications(served, lay: Layout) -> list[dict]:
    """serveConfigV2's applications: each model (a .war: each node) at its own route, and the ingress at `/`."""
    from segserve.engines.ray.app import INGRESS_APP, model_app_name, model_route  # Ray, only when written

    apps = []
    for model, values in served.registrations.items():
        args = {"key_file": KEY_FILE, **{k: values[k] for k in ("batch_size", "max_batch_delay_ms") if values.get(k) is not None}}
        if served.is_workflow:
            node = model.removeprefix(f"{served.name}__")
            args.update({"war": f"{STORE}/{served.archive}", "workflow": served.name, "node": node})
            builder = "workflow_node"
        else:
            args.update({"name": model, "archive": f"{STORE}/{served.archive}"})
            builder = "model"
        deployment = {"name": model, "num_replicas": lay.replicas[model], "ray_actor_options": {"num_cpus": lay.num_cpus}}
        autoscaling = lay.sizing and lay.sizing.autoscaling(model)
        if autoscaling:  # "auto": Serve's autoscaling, these values over its defaults (the code's num_replicas ignored)
            deployment.update({"num_replicas": "auto", "autoscaling_config": autoscaling})
        app = {"name": model_app_name(model), "route_prefix": model_route(model), "import_path": f"{BUILDERS}:{builder}"}
        apps.append({**app, "args": args, "deployments": [deployment]})
    kind = "workflows" if served.is_workflow else "models"
    target = {served.name: f"{STORE}/{served.archive}"}
    apps.append(
        {"name": INGRESS_APP, "route_prefix": "/", "import_path": f"{BUILDERS}:ingress", "args": {"key_file": KEY_FILE, kind: target}}
    )
    return apps


BUILDERS = "segserve.engines.ray.config_app"


def serve_config(served, lay: Layout) -> str:
    config = {"proxy_location": "EveryNode", "http_options": {"host": "0.0.0.0", "port": SERVE_PORT}}
    return yaml.safe_dump({**config, "applications": applications(served, lay)}, sort_keys=False)


def _unknown(given, known, where: str = "") -> list[str]:
    """Keys of `given` that Serve's schema dropped (it ignores fields it does not know, for newer configs)."""
    if isinstance(given, dict) and isinstance(known, dict):
        lost = [f"{where}{key}" for key in given if key not in known]
        return lost + [p for key in given if key in known for p in _unknown(given[key], known[key], f"{where}{key}.")]
    if isinstance(given, list) and isinstance(known, list):
        return [p for i, (a, b) in enumerate(zip(given, known, strict=False)) for p in _unknown(a, b, f"{where}{i}.")]
    return []


def serve_config_problems(text: str) -> list[str]:
    """What Ray Serve's own config schema (ServeDeploySchema, what `serve deploy` and KubeRay's PUT are checked by,
    and AutoscalingConfig for what it holds as a dict) refuses in serveConfigV2, a field it would ignore, and an import
    path that does not import."""
    import pydantic
    from ray._common.utils import import_attr
    from ray.serve.config import AutoscalingConfig
    from ray.serve.schema import ServeDeploySchema

    config = yaml.safe_load(text)
    try:
        schema = ServeDeploySchema.model_validate(config)
    except pydantic.ValidationError as error:
        return [f"serveConfigV2: Ray Serve's schema: {'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors()]
    problems = [
        f"serveConfigV2: {p}: not a field of Ray Serve's schema"
        for p in _unknown(config, schema.model_dump(mode="json", exclude_unset=True))
    ]
    for app in schema.applications:
        for deployment in app.deployments:  # the schema holds it as a dict: Serve checks it when it deploys
            if isinstance(deployment.autoscaling_config, dict):
                try:
                    AutoscalingConfig.model_validate(deployment.autoscaling_config)
                except pydantic.ValidationError as error:
                    said = "; ".join(e["msg"] for e in error.errors())
                    problems.append(f"serveConfigV2: {app.name}: {deployment.name}: autoscaling_config: {said}")
        try:
            import_attr(app.import_path)
        except (ImportError, AttributeError, ValueError) as error:
            problems.append(f"serveConfigV2: {app.name}: import_path {app.import_path}: {error}")
    return problems


def _port(number: int, end: int | None = None) -> dict:
    return {"protocol": "TCP", "port": number, **({"endPort": end} if end else {})}


def ray_ports() -> list[dict]:
    """The ports Ray's processes reach each other on (a NetworkPolicy's ports)."""
    fixed = [GCS_PORT, DASHBOARD_PORT, *RAY_PORTS.values()]
    return [*(_port(p) for p in fixed), _port(*WORKER_PORTS)]


def start_params(head: bool, lay: Layout) -> dict[str, str]:
    ports = {name: str(port) for name, port in RAY_PORTS.items()}
    ports.update({"min-worker-port": str(WORKER_PORTS[0]), "max-worker-port": str(WORKER_PORTS[1])})
    ports.update({"metrics-export-port": str(METRICS_PORT), "object-store-memory": str(OBJECT_STORE_MI * 2**20)})
    if head:  # no replica on the head: its CPUs are Ray's own (KubeRay's advice for a production cluster)
        return {**ports, "num-cpus": "0", "dashboard-host": "0.0.0.0"}
    return {**ports, "num-cpus": str(lay.node_cores)}


def pod_template(name: str, labels: dict, node: str, resources: dict, uri: str, env: list[dict]) -> dict:
    """A Ray node's pod: the restricted profile, read-only root, the emptyDirs Ray writes in, the archives and the key."""
    store = {"name": "model-store", "mountPath": STORE}
    more, init = pods.model_store(uri, store)  # a claim's subPath into `store`
    ports = {"serve": SERVE_PORT, "metrics": METRICS_PORT}
    if node == "head":
        ports.update({"gcs-server": GCS_PORT, "dashboard": DASHBOARD_PORT})
    container = {
        "name": f"ray-{node}",
        "image": pods.image(IMAGE_ENV, IMAGE),
        "imagePullPolicy": "Always",  # a tag is what its registry says now; a digest is checked
        "env": [{"name": "HOME", "value": f"{TMP}/home"}, *env],
        "ports": [{"name": port, "containerPort": number} for port, number in ports.items()],
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "securityContext": pods.container_security(),
        "volumeMounts": [
            {"name": "tmp", "mountPath": TMP},
            {"name": "dshm", "mountPath": SHM},
            {**store, "readOnly": True},
            {"name": "inference-key", "mountPath": KEYS, "readOnly": True},
        ],
    }
    volumes = [
        {"name": "tmp", "emptyDir": {}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{OBJECT_STORE_MI + SHM_MARGIN_MI}Mi"}},
        {"name": "inference-key", "secret": {"secretName": f"{name}-inference-key"}},
    ]
    spec = {
        "automountServiceAccountToken": False,
        "securityContext": pods.POD_SECURITY,
        "containers": [container],
        "volumes": volumes + more,
    }
    if init:
        spec["initContainers"] = init
    return {"metadata": {"labels": {**labels, NODE_LABEL: node}}, "spec": spec}


def ray_service(name: str, labels: dict, served, lay: Layout, uri: str, env: list[dict], node_memory_mi: int) -> dict:
    worker = {"cpu": str(lay.node_cores), "memory": f"{node_memory_mi}Mi"}
    head_group = {"rayStartParams": start_params(True, lay), "template": pod_template(name, labels, "head", HEAD_RESOURCES, uri, env)}
    workers = {
        "groupName": "workers",
        "replicas": lay.nodes,
        "minReplicas": lay.nodes,
        "maxReplicas": lay.nodes,
        "rayStartParams": start_params(False, lay),
        "template": pod_template(name, labels, "worker", worker, uri, env),
    }
    cluster = {
        "rayVersion": RAY_VERSION,
        "authOptions": {"mode": "token", "secretName": f"{name}-ray-token"},
        "enableInTreeAutoscaling": False,
        "headGroupSpec": head_group,
        "workerGroupSpecs": [workers],
    }
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": name, "labels": labels},
        "spec": {"serveConfigV2": serve_config(served, lay), "rayClusterConfig": cluster},
    }


def kuberay_namespace() -> str:
    return os.environ.get(KUBERAY_NAMESPACE_ENV) or KUBERAY_NAMESPACE


def network_policies(name: str, labels: dict) -> list[dict]:
    """Clients (pods labelled CLIENT_LABEL: <name>) the serve port, the metrics namespace's scrapers the metrics, the
    cluster's own pods Ray's ports (in and out); the KubeRay operator's namespace the head's dashboard only."""
    cluster = {"podSelector": {"matchLabels": labels}}
    scraper = {"namespaceSelector": {"matchLabels": {manifest_check.NAMESPACE_LABEL: pods.metrics_namespace()}}}
    scraper["podSelector"] = {"matchLabels": {pods.SCRAPE_LABEL: "true"}}
    ingress = [
        {"from": [{"podSelector": {"matchLabels": {pods.CLIENT_LABEL: name}}}], "ports": pods.tcp([SERVE_PORT])},
        {"from": [scraper], "ports": pods.tcp([METRICS_PORT])},
        {"from": [cluster], "ports": ray_ports()},
    ]
    spec = {"podSelector": {"matchLabels": labels}, "policyTypes": ["Ingress", "Egress"], "ingress": ingress}
    spec["egress"] = [*pods.egress(), {"to": [cluster], "ports": ray_ports()}]
    operator = {"namespaceSelector": {"matchLabels": {manifest_check.NAMESPACE_LABEL: kuberay_namespace()}}}
    head = {
        "podSelector": {"matchLabels": {**labels, NODE_LABEL: "head"}},
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [operator], "ports": pods.tcp([DASHBOARD_PORT])}],
    }
    meta = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy"}
    return [
        {**meta, "metadata": {"name": f"{name}-ray", "labels": labels}, "spec": spec},
        {**meta, "metadata": {"name": f"{name}-ray-head", "labels": labels}, "spec": head},
    ]


def pod_templates(service: dict) -> list[dict]:
    """The head's and each worker group's pod template as Deployments: what Kubernetes' schemas, the restricted checks
    and checkov read (none of them looks inside a custom resource)."""
    cluster = service["spec"]["rayClusterConfig"]
    groups = {"head": cluster["headGroupSpec"], **{g["groupName"]: g for g in cluster.get("workerGroupSpecs") or []}}
    wrapped = []
    for group, spec in groups.items():
        template = spec["template"]
        labels = (template.get("metadata") or {}).get("labels") or {}
        meta = {"name": f"{service['metadata']['name']}-{group}", "labels": labels}
        wrapped.append(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": meta,
                "spec": {"selector": {"matchLabels": labels}, "template": template},
            }
        )
    return wrapped


def problems(service: dict, policies: list[dict]) -> list[str]:
    """Every check best/rayservice.yaml must pass before it is written."""
    templates = pod_templates(service)
    found = manifest_check.ray_service_problems(service) + serve_config_problems(service["spec"].get("serveConfigV2", ""))
    found += manifest_check.kubernetes_problems(templates + policies) + manifest_check.pod_problems(templates)
    # the head's policy only adds its dashboard's ingress: the cluster's policy (the first) also selects the head
    return (
        found
        + manifest_check.network_policy_problems(policies[:1], egress=True)
        + manifest_check.network_policy_problems(policies[1:], egress=False)
    )


def lines(name: str, chosen: dict, lay: Layout, memory: tuple[int, str]) -> list[str]:
    """Where each figure of best/rayservice.yaml comes from (its header, after the point's own lines)."""
    run = chosen["run_id"]
    if lay.sizing:
        said = lay.sizing.lines()
    else:
        placed = ", ".join(f"{model} {count}" for model, count in lay.replicas.items())
        said = [
            f"not sized: {lay.why_not}; so the point's replicas ({placed}, workers) as fixed replicas on one",
            f"worker node of the {lay.node_cores} cores {run} ran on, num_cpus {lay.num_cpus:g} each (sizing: docs/deploying.md)",
        ]
    image = pods.image(IMAGE_ENV, IMAGE)
    image_why = f"{IMAGE_ENV}" if os.environ.get(IMAGE_ENV) else f"a placeholder: set {IMAGE_ENV}"
    versions = " and ".join(manifest_check.kubernetes_versions())
    ray_ports_text = ", ".join(str(p) for p in [GCS_PORT, DASHBOARD_PORT, *RAY_PORTS.values()]) + f", {WORKER_PORTS[0]}-{WORKER_PORTS[1]}"
    return said + [
        f"worker nodes: {lay.nodes} of cpu {lay.node_cores}, memory {memory[0]}Mi ({memory[1]}); a fixed group: KubeRay's",
        "autoscaler needs a service account token on the head, which no pod here mounts; Serve's autoscaling moves replicas",
        f"head: cpu {HEAD_RESOURCES['cpu']}, memory {HEAD_RESOURCES['memory']}, num-cpus 0 (no replica on it): not measured",
        f"image {image} ({image_why}: Ray {RAY_VERSION}, torch, torchserve 0.12's Python side and segserve; by digest",
        "repo@sha256:...; docs/deploying.md builds one)",
        f"Ray token auth: KubeRay's authOptions with the Secret {name}-ray-token (key auth_token); the inference key:",
        f"the Secret {name}-inference-key (key key_file.json, TorchServe's format) at {KEY_FILE}; docs/deploying.md makes both",
        f"exposed: serve {SERVE_PORT} (KubeRay's Service {name}-serve-svc) to pods labelled {pods.CLIENT_LABEL}: {name}; metrics",
        f'{METRICS_PORT} to pods labelled {pods.SCRAPE_LABEL}: "true" in the namespace {pods.metrics_namespace()}; the head\'s dashboard',
        f"{DASHBOARD_PORT} to the namespace {kuberay_namespace()} ({KUBERAY_NAMESPACE_ENV}: KubeRay's operator); Ray's ports",
        f"({ray_ports_text}) between the cluster's pods only; egress: those, DNS, HTTPS to public addresses",
        f"pods: Pod Security Standards restricted, read-only root, user {pods.USER_ID}; Ray writes its session in /tmp/ray and a",
        f"replica unpacks its archive under /tmp: an emptyDir; {SHM} a memory emptyDir of {OBJECT_STORE_MI + SHM_MARGIN_MI}Mi",
        f"(Ray's object store: {OBJECT_STORE_MI}Mi)",
        "Serve's own proxy on every node, not HAProxy mode (its stats on every interface, fixed /tmp paths)",
        f"validated: KubeRay's RayService CRD (commit feeaf72f), strict; serveConfigV2 by Ray Serve {RAY_VERSION}'s",
        f"ServeDeploySchema; the pod templates and NetworkPolicies by Kubernetes {versions}'s schemas, strict",
    ]
