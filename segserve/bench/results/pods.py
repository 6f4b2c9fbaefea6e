"""best/k8s.yaml's objects: a ConfigMap, a Deployment of stock TorchServe whose pods meet the Pod Security Standards'
"restricted" profile, a Service for inference only and a NetworkPolicy beside it (#58).

Inside the pod TorchServe's management API listens on 127.0.0.1 only (the container and the Service do not list
its port): only the pod's own processes reach it (the workflow's postStart hook, `kubectl exec`). Token
authorization stays on: TorchServe 0.12 makes its keys itself at every start (TokenAuthorization.java: random,
written to key_file.json in its working directory, no way to give it one), so the readiness probe and the hook read
them from that file, and a client gets the inference key from the pod. The keys expire after TOKEN_LIFETIME_MIN; the
readiness probe renews the inference key in its last TOKEN_RENEW_BEFORE_MIN (TorchServe's /token, with the API key).
The root filesystem is read-only; TorchServe writes to emptyDir volumes: its working directory (key_file.json, logs/)
and TEMP (its pid file, the workers' sockets, the archives it unpacks).

The NetworkPolicy admits named peers on named ports only, the metrics to one named namespace (a pod cannot set its
namespace's kubernetes.io/metadata.name), and lets the pods out to DNS and HTTPS beyond the private and link-local
ranges: not to a cloud's metadata address (169.254.169.254), where a node's own credentials are.
"""

import os
from urllib.parse import urlencode

from segserve.bench.results.manifest_check import DNS_PORT, NAMESPACE_LABEL

HOME = "/home/model-server"  # the image's home and working directory (its user model-server owns it)
WORK = f"{HOME}/work"  # TorchServe's working directory here: key_file.json and logs/ land in it
TMP = f"{HOME}/tmp"  # the image's TEMP: TorchServe's pid file, java.io.tmpdir (worker sockets, unpacked archives)
KEY_FILE = f"{WORK}/key_file.json"
USER_ID = 1000  # the image's model-server user (useradd -m on Ubuntu 20.04); KServe's runtime runs it as 1000 too
IMAGE_ENV, IMAGE = "SEGSERVE_TORCHSERVE_IMAGE", "pytorch/torchserve:0.12.0-cpu"  # the release segserve pins
COPY_IMAGE_ENV, COPY_IMAGE = "SEGSERVE_COPY_IMAGE", "amazon/aws-cli:2.22.0"  # the init container's, for s3://
COPY_RESOURCES = {"cpu": "500m", "memory": "512Mi"}  # aws s3 cp streams each file: a bounded buffer, one core's half
PORTS = {"inference": 8080, "management": 8081, "metrics": 8082, "grpc-inference": 7070, "grpc-management": 7071}
CLIENT_LABEL = "segserve.io/client-of"  # a pod labelled <this>: <name> may call the inference API
SCRAPE_LABEL = "segserve.io/scrape-metrics"  # a pod labelled <this>: "true" in the metrics namespace may read the metrics
METRICS_NAMESPACE_ENV, METRICS_NAMESPACE = "SEGSERVE_METRICS_NAMESPACE", "monitoring"  # kube-prometheus's namespace
PROBE_TIMEOUT_S = 5  # python3's start, a key renewal now and then, one /ping
# TorchServe 0.12's keys expire token_expiration_min after they were made (TokenAuthorization.java); a new one only
# through the management API's /token with the API key, which never expires. A day bounds what a leaked key is worth;
# the readiness probe (every 5 s) renews the inference key in its last 10 minutes, so the pod stays ready. A client
# refused (400, InvalidKeyException) reads the key again. The management key is not renewed: only the workflow's
# hook, at start, uses it.
TOKEN_LIFETIME_MIN = 24 * 60
TOKEN_RENEW_BEFORE_MIN = 10
# Egress: DNS to any address (kube-dns, or a node-local cache on 169.254.20.10), else HTTPS (the init container's S3,
# a handler's downloads) beyond the private, shared and link-local ranges: no cloud metadata address (169.254.169.254
# on AWS, GCP, Azure; 100.100.100.200 on Alibaba; fd00:ec2::254), no Kubernetes API, no cluster service.
HTTPS_PORT = 443
NOT_PUBLIC_V4 = ["10.0.0.0/8", "100.64.0.0/10", "169.254.0.0/16", "172.16.0.0/12", "192.168.0.0/16"]
NOT_PUBLIC_V6 = ["fc00::/7", "fe80::/10"]
AWS_CREDENTIALS = "/aws/credentials"  # the Secret aws-credentials' key `credentials`, an AWS credentials file


def served_ports(grpc: bool) -> dict[str, int]:
    """What the Service exposes: inference, and TorchServe's gRPC inference only where the point was measured over it."""
    return {api: port for api, port in PORTS.items() if api == "inference" or (grpc and api == "grpc-inference")}


def image(env: str, default: str) -> str:
    """An image by tag, or by digest where the variable names one (`repo@sha256:…`): docs/deploying.md."""
    return os.environ.get(env) or default


def container_security() -> dict:
    """The restricted profile's container fields, and a read-only root filesystem."""
    return {
        "runAsNonRoot": True,
        "runAsUser": USER_ID,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


POD_SECURITY = {
    "runAsNonRoot": True,
    "runAsUser": USER_ID,
    "runAsGroup": USER_ID,
    "fsGroup": USER_ID,  # the emptyDir volumes are the user's to write
    "seccompProfile": {"type": "RuntimeDefault"},
}


def keyed_request(api: str, url: str, method: str = "GET", timeout_s: int = 600) -> str:
    """Python (the image's python3) that sends one request with the API's key from TorchServe's key file; an
    answer other than 2xx raises (exit status 1)."""
    return (
        "import json, urllib.request\n"
        f"key = json.load(open({KEY_FILE!r}))[{api!r}]['key']\n"
        f"request = urllib.request.Request({url!r}, method={method!r}, headers={{'Authorization': 'Bearer ' + key}})\n"
        f"urllib.request.urlopen(request, timeout={timeout_s}).read()\n"
    )


def renew_inference_key(timeout_s: int) -> str:
    """Python that makes a new inference key (TorchServe's /token, with the API key, on the management API)."""
    url = f"http://127.0.0.1:{PORTS['management']}/token?type=inference"
    return keyed_request("API", url, timeout_s=timeout_s)


def ping() -> str:
    """The readiness probe: /ping answers 200 once every model has its workers, and wants the inference key. In the
    key's last TOKEN_RENEW_BEFORE_MIN it first makes a new one (the expiry is Java's Instant, UTC, in the key file)."""
    renew_s = TOKEN_RENEW_BEFORE_MIN * 60
    half = (PROBE_TIMEOUT_S - 1) // 2
    return (
        "import calendar, json, time\n"
        f"expires = json.load(open({KEY_FILE!r}))['inference']['expiration time'][:19]\n"
        f"if calendar.timegm(time.strptime(expires, '%Y-%m-%dT%H:%M:%S')) - time.time() < {renew_s}:\n"
        + "".join(f"    {line}\n" for line in renew_inference_key(half).splitlines())
        + keyed_request("inference", f"http://127.0.0.1:{PORTS['inference']}/ping", timeout_s=half)
    )


def inference_key_command(name: str) -> str:
    """What a client runs to read the inference key, and only it (key_file.json holds the management and API keys too)."""
    return (
        f"kubectl exec deploy/{name} -c torchserve -- python3 -c \"import json; print(json.load(open('{KEY_FILE}'))['inference']['key'])\""
    )


def renew_command(name: str) -> str:
    """What an operator runs to replace the inference key now (a key that leaked): the old one stops working."""
    code = renew_inference_key(PROBE_TIMEOUT_S).replace("\n", "; ").rstrip("; ").replace('"', '\\"')
    return f'kubectl exec deploy/{name} -c torchserve -- python3 -c "{code}"'


def register_workflow(archive: str, name: str) -> str:
    """Python for the postStart hook: register the .war once the management API answers (2 minutes at most); the
    names URL-encoded, the management key from the key file (written once TorchServe is up)."""
    url = f"http://127.0.0.1:{PORTS['management']}/workflows?{urlencode({'url': archive, 'workflow_name': name})}"
    call = keyed_request("management", url, "POST").replace("\n", "\n        ").rstrip()
    return (
        "import time\n"
        "for _ in range(60):\n"
        "    try:\n"
        f"        {call}\n"
        "        break\n"
        "    except (OSError, ValueError):\n"  # no key file yet, half written, or no answer yet
        "        time.sleep(2)\n"
        "else:\n"
        "    raise SystemExit('the workflow did not register')\n"
    )


def k8s_objects(name: str, labels: dict, config: str, served, uri: str, resources: dict, env: list[dict], replicas: int, grpc: bool):
    """The ConfigMap, Deployment, Service and NetworkPolicy of best/k8s.yaml."""
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{name}-config", "labels": labels},
        "data": {"config.properties": config},
    }
    store = {"name": "model-store", "mountPath": f"{HOME}/model-store"}
    listening = {api: port for api, port in PORTS.items() if api == "metrics" or api in served_ports(grpc)}
    container = {
        "name": "torchserve",
        "image": image(IMAGE_ENV, IMAGE),
        "imagePullPolicy": "Always",  # a tag is what its registry says now; a digest is checked
        "command": ["torchserve"],
        "args": ["--start", "--foreground", "--ts-config", f"{HOME}/config/config.properties", "--model-store", f"{HOME}/model-store"],
        "workingDir": WORK,
        "env": [{"name": "TEMP", "value": TMP}, *env],
        "ports": [{"name": api, "containerPort": port} for api, port in listening.items()],
        "resources": resources,
        "securityContext": container_security(),
        "readinessProbe": {
            "exec": {"command": ["python3", "-c", ping()]},
            "initialDelaySeconds": 10,
            "periodSeconds": 5,
            "timeoutSeconds": PROBE_TIMEOUT_S,
        },
        # the frontend listening at all (no key needed); registration, before the port opens, may take minutes
        "livenessProbe": {"tcpSocket": {"port": "inference"}, "initialDelaySeconds": 60, "periodSeconds": 20, "failureThreshold": 6},
        "volumeMounts": [
            {"name": "config", "mountPath": f"{HOME}/config", "readOnly": True},
            store,
            {"name": "work", "mountPath": WORK},
            {"name": "tmp", "mountPath": TMP},
        ],
    }
    if served.is_workflow:  # probes start once this returns: ready means registered
        container["lifecycle"] = {"postStart": {"exec": {"command": ["python3", "-c", register_workflow(served.archive, served.name)]}}}
    volumes = [
        {"name": "config", "configMap": {"name": f"{name}-config"}},
        {"name": "work", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
    ]
    pod = {"automountServiceAccountToken": False, "securityContext": POD_SECURITY, "containers": [container], "volumes": volumes}
    more, init = model_store(uri, store)
    volumes += more
    if init:
        pod["initContainers"] = init
    scrape = {"prometheus.io/scrape": "true", "prometheus.io/port": str(PORTS["metrics"])}  # the NetworkPolicy says who may
    template = {"metadata": {"labels": labels, "annotations": scrape}, "spec": pod}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": template},
    }
    ports = [{"name": api, "port": port, "targetPort": api} for api, port in served_ports(grpc).items()]
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": labels}}
    service["spec"] = {"selector": labels, "ports": ports}
    return [config_map, deployment, service, network_policy(name, labels, labels, list(served_ports(grpc)), out=True)]


def model_store(uri: str, store: dict) -> tuple[list[dict], list[dict]]:
    """The model store's volumes and init containers: a pvc:// claim mounted read-only (`store`, the container's mount
    of it, gets its subPath), else s3:// (the placeholder too) copied into an emptyDir before the server starts (the
    pod needs an emptyDir volume `tmp` for the copy's HOME)."""
    if uri.startswith("pvc://"):
        claim, _, path = uri.removeprefix("pvc://").partition("/")
        store.update({"subPath": f"{path}/model-store".lstrip("/"), "readOnly": True})
        return [{"name": "model-store", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}], []
    credentials = {"name": "aws-credentials", "secret": {"secretName": "aws-credentials", "optional": True}}
    return [{"name": "model-store", "emptyDir": {}}, credentials], [copy_archives(uri, store)]


def copy_archives(uri: str, store: dict) -> dict:
    """The init container: the archives from S3 into the model store, credentials as a file (the Secret's key
    `credentials`, optional: without it, the pod's own AWS identity), nothing else of the pod's."""
    return {
        "name": "archives",
        "image": image(COPY_IMAGE_ENV, COPY_IMAGE),
        "imagePullPolicy": "Always",
        "args": ["s3", "cp", "--recursive", f"{uri}/model-store/", f"{HOME}/model-store/"],
        "env": [{"name": "AWS_SHARED_CREDENTIALS_FILE", "value": AWS_CREDENTIALS}, {"name": "HOME", "value": TMP}],
        "resources": {"requests": dict(COPY_RESOURCES), "limits": dict(COPY_RESOURCES)},
        "securityContext": container_security(),
        "volumeMounts": [
            {"name": "model-store", "mountPath": store["mountPath"]},
            {"name": "aws-credentials", "mountPath": os.path.dirname(AWS_CREDENTIALS), "readOnly": True},
            {"name": "tmp", "mountPath": TMP},
        ],
    }


def metrics_namespace() -> str:
    """The namespace whose pods labelled SCRAPE_LABEL read the metrics: SEGSERVE_METRICS_NAMESPACE, else monitoring."""
    return os.environ.get(METRICS_NAMESPACE_ENV) or METRICS_NAMESPACE


def tcp(ports) -> list[dict]:
    return [{"protocol": "TCP", "port": port} for port in ports]


def egress() -> list[dict]:
    """DNS anywhere, HTTPS to public addresses only (NOT_PUBLIC_V4/V6: the metadata addresses among them)."""
    public = [{"ipBlock": {"cidr": "0.0.0.0/0", "except": NOT_PUBLIC_V4}}, {"ipBlock": {"cidr": "::/0", "except": NOT_PUBLIC_V6}}]
    return [
        {"ports": [{"protocol": "UDP", "port": DNS_PORT}, {"protocol": "TCP", "port": DNS_PORT}]},
        {"to": public, "ports": tcp([HTTPS_PORT])},
    ]


def network_policy(name: str, labels: dict, pods: dict, ports: list, more_from: dict | None = None, out: bool = False) -> dict:
    """Who reaches the pods: pods labelled CLIENT_LABEL: <name> (same namespace) the served ports, pods labelled
    SCRAPE_LABEL in the metrics namespace the metrics, `more_from` {namespace: its ports} (KServe's request path).
    With `out`, where the pods may go (egress())."""
    scraper = {"namespaceSelector": {"matchLabels": {NAMESPACE_LABEL: metrics_namespace()}}}
    scraper["podSelector"] = {"matchLabels": {SCRAPE_LABEL: "true"}}
    ingress = [
        {"from": [{"podSelector": {"matchLabels": {CLIENT_LABEL: name}}}], "ports": tcp(ports)},
        {"from": [scraper], "ports": tcp([PORTS["metrics"]])},
    ]
    for namespace, namespace_ports in (more_from or {}).items():
        ingress.append({"from": [{"namespaceSelector": {"matchLabels": {NAMESPACE_LABEL: namespace}}}], "ports": tcp(namespace_ports)})
    spec = {"podSelector": {"matchLabels": pods}, "policyTypes": ["Ingress"], "ingress": ingress}
    if out:
        spec.update({"policyTypes": ["Ingress", "Egress"], "egress": egress()})
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": name, "labels": labels}, "spec": spec}
