"""best/'s manifests checked as a cluster checks them, before they are written (#51).

Kubernetes objects (best/k8s.yaml): against the official OpenAPI schemas, strict (an unknown field is refused), for
the oldest and the newest Kubernetes minor that kubernetes-validate (PyPI) ships schemas for. The InferenceService
(best/kserve.yaml): against the `openAPIV3Schema` of KServe's CRD (kserve/, with its source and license), made strict
as `kubectl apply --validate=strict` is (a field the schema does not name is refused, except below
`x-kubernetes-preserve-unknown-fields`), its metadata against Kubernetes' ObjectMeta; and the ServingRuntime it
relies on (kserve-torchserve) must offer its model format and protocol version. Its Istio AuthorizationPolicy: against
the `openAPIV3Schema` of Istio's CRD (istio/, with its source and license), strict the same way (#64). The RayService
(best/rayservice.yaml): against KubeRay's CRD (kuberay/, with its source and license), strict the same way (#67).

And what a cluster would let through but segserve does not write (#58): a pod that breaks the Pod Security Standards'
"restricted" profile (runAsNonRoot, a non-zero user, no privilege escalation, every capability dropped, seccomp
RuntimeDefault), a writable root filesystem, a mounted service account token, a container without requests and
limits of CPU and memory, an image that is neither a tag nor a digest; a Service or container that lists the
management port; a cluster config.properties whose management API is beyond loopback, whose model API is on,
or whose token authorization is not as the manifest says; and a NetworkPolicy rule that admits every port, or a
namespace a pod could choose, or (best/k8s.yaml) lets the pods reach a cloud's metadata address (#64).
"""

import gzip
import ipaddress
import json
import re
from functools import cache
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml
from kubernetes_validate import utils as kubernetes_schemas

KSERVE = Path(__file__).parent / "kserve"
KUBERAY = Path(__file__).parent / "kuberay"
RAY_SERVICE = ("ray.io/v1", "RayService")  # the CRD's group, served version and kind
ISTIO = Path(__file__).parent / "istio"
AUTHORIZATION_POLICY = ("security.istio.io/v1", "AuthorizationPolicy")  # the CRD's group, served version and kind
NAMESPACE_LABEL = "kubernetes.io/metadata.name"  # the API server sets it to the namespace's name: no pod chooses it
NAMESPACE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # a DNS-1123 label, what a namespace's name is
# where clouds serve a node's own credentials: AWS, GCP, Azure, Oracle (IPv4), AWS (IPv6), Alibaba
METADATA_ADDRESSES = [ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200")]
DNS_PORT = 53  # a DNS resolver may share the metadata address (GCP's): DNS to it is no way to the credentials
RUNTIME = "kserve-torchserve"  # the ClusterServingRuntime KServe selects for modelFormat pytorch
IMAGE = re.compile(r"^[a-z0-9][a-z0-9._/:-]*(:[\w][\w.-]{0,127}|@sha256:[0-9a-f]{64})$")  # repo:tag or repo@sha256:digest
MANAGEMENT_PORTS = {8081, 7071, "management", "grpc-management"}  # TorchServe's management API (REST, gRPC)
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


def kubernetes_versions() -> tuple[str, str]:
    """The oldest and the newest minor with schemas (kubernetes-validate 1.37: 1.25 and 1.37)."""
    versions = kubernetes_schemas.all_versions()
    return kubernetes_schemas.major_minor(versions[0]), kubernetes_schemas.major_minor(versions[-1])


def _where(error: jsonschema.ValidationError) -> str:
    return ".".join(str(part) for part in error.absolute_path) or "(top level)"


def kubernetes_problems(objects: list[dict]) -> list[str]:
    """One line per object and version that does not validate: its kind and name, the field, the schema's reason."""
    problems = []
    for version in kubernetes_versions():
        for data in objects:
            name = f"{data.get('kind')}/{(data.get('metadata') or {}).get('name')}"
            try:
                kubernetes_validate.validate(data, version, strict=True)
            except jsonschema.ValidationError as error:
                problems.append(f"{name}: Kubernetes {version}: {_where(error)}: {error.message}")
            except kubernetes_validate.SchemaNotFoundError:
                problems.append(f"{name}: Kubernetes {version} has no {data.get('apiVersion')} {data.get('kind')}")
    return problems


def _strict(schema):
    """The schema with every object that names its fields closed to others, as the API server's strict field
    validation is; a schema that preserves unknown fields, or says what its other fields may be, is left open."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    strict = {key: _strict(value) for key, value in schema.items()}
    if "properties" in schema and "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        strict["additionalProperties"] = False
    return strict


@cache
def inference_service_schema() -> dict:
    schema = json.loads(gzip.decompress((KSERVE / "inferenceservice-v1beta1.schema.json.gz").read_bytes()))
    return _strict(schema)


@cache
def runtime() -> dict:
    return yaml.safe_load((KSERVE / f"{RUNTIME}.yaml").read_text())


@cache
def authorization_policy_schema() -> dict:
    return _strict(json.loads((ISTIO / "authorizationpolicy-v1.schema.json").read_text()))


def _metadata_problems(kind: str, data: dict) -> list[str]:
    """A CRD leaves metadata to the API server: an ObjectMeta, checked by Kubernetes' own schema."""
    meta = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": data.get("metadata") or {}}
    return [p.replace("ConfigMap/", f"{kind}/", 1) for p in kubernetes_problems([meta])]


def authorization_policy_problems(policy: dict) -> list[str]:
    """Lines naming what in an Istio AuthorizationPolicy a cluster with Istio's CRD refuses (its schema does not
    describe apiVersion, kind and metadata, which the API server checks itself: here, the served version and kind)."""
    problems = []
    if (policy.get("apiVersion"), policy.get("kind")) != AUTHORIZATION_POLICY:
        said = f"{policy.get('apiVersion')}/{policy.get('kind')}"
        problems.append(f"AuthorizationPolicy: apiVersion/kind {said}: must be {'/'.join(AUTHORIZATION_POLICY)}")
    body = {key: value for key, value in policy.items() if key not in ("apiVersion", "kind", "metadata")}
    problems += [
        f"AuthorizationPolicy: Istio's CRD: {_where(error)}: {error.message}"
        for error in jsonschema.Draft7Validator(authorization_policy_schema()).iter_errors(body)
    ]
    return problems + _metadata_problems("AuthorizationPolicy", policy)


@cache
def ray_service_schema() -> dict:
    return _strict(json.loads(gzip.decompress((KUBERAY / "rayservice-v1.schema.json.gz").read_bytes())))


def ray_service_problems(service: dict) -> list[str]:
    """Lines naming what in a RayService a cluster with KubeRay's CRD refuses (strict as the InferenceService's)."""
    problems = []
    if (service.get("apiVersion"), service.get("kind")) != RAY_SERVICE:
        problems.append(f"RayService: apiVersion/kind {service.get('apiVersion')}/{service.get('kind')}: must be {'/'.join(RAY_SERVICE)}")
    problems += [
        f"RayService: KubeRay's CRD: {_where(error)}: {error.message}"
        for error in jsonschema.Draft7Validator(ray_service_schema()).iter_errors(service)
    ]
    return problems + _metadata_problems("RayService", service)


def inference_service_problems(service: dict) -> list[str]:
    """Lines naming what in an InferenceService a cluster with KServe's CRD (and its TorchServe runtime) refuses."""
    problems = [
        f"InferenceService: KServe's CRD: {_where(error)}: {error.message}"
        for error in jsonschema.Draft7Validator(inference_service_schema()).iter_errors(service)
    ]
    problems += _metadata_problems("InferenceService", service)
    model = ((service.get("spec") or {}).get("predictor") or {}).get("model") or {}
    spec = runtime()["spec"]
    formats = {f["name"] for f in spec.get("supportedModelFormats", [])}
    wanted = (model.get("modelFormat") or {}).get("name")
    if wanted not in formats:
        problems.append(f"InferenceService: modelFormat {wanted!r}: {RUNTIME} serves {sorted(formats)}")
    protocol = model.get("protocolVersion", "v1")
    if protocol not in spec.get("protocolVersions", []):
        problems.append(f"InferenceService: protocolVersion {protocol!r}: {RUNTIME} offers {spec.get('protocolVersions')}")
    return problems


def _container_problems(where: str, container: dict, pod: dict) -> list[str]:
    security, pod_security = container.get("securityContext") or {}, pod.get("securityContext") or {}

    def setting(key):  # a container's own, else the pod's
        return security.get(key, pod_security.get(key))

    problems = []
    if setting("runAsNonRoot") is not True:
        problems.append("runAsNonRoot: must be true")
    if setting("runAsUser") in (None, 0):
        problems.append("runAsUser: must be a non-zero user")
    if security.get("allowPrivilegeEscalation") is not False:
        problems.append("securityContext.allowPrivilegeEscalation: must be false")
    if security.get("privileged"):
        problems.append("securityContext.privileged: must not be true")
    if "ALL" not in ((security.get("capabilities") or {}).get("drop") or []) or (security.get("capabilities") or {}).get("add"):
        problems.append("securityContext.capabilities: must drop ALL and add none")
    if (setting("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"):
        problems.append("seccompProfile.type: must be RuntimeDefault")
    if security.get("readOnlyRootFilesystem") is not True:
        problems.append("securityContext.readOnlyRootFilesystem: must be true (emptyDir volumes where it writes)")
    resources = container.get("resources") or {}
    for kind in ("requests", "limits"):
        missing = [amount for amount in ("cpu", "memory") if amount not in (resources.get(kind) or {})]
        if missing:
            problems.append(f"resources.{kind}: no {' or '.join(missing)}")
    if not IMAGE.match(container.get("image") or ""):
        problems.append(f"image {container.get('image')!r}: must be repo:tag or repo@sha256:<digest>")
    for mount in container.get("volumeMounts") or []:  # a pvc:// path becomes one
        sub_path = mount.get("subPath", "")
        if sub_path.startswith("/") or ".." in sub_path.split("/"):
            problems.append(f"volumeMounts {mount.get('name')}: subPath {sub_path!r}: must stay inside its volume (no '..', not absolute)")
    ports = container.get("ports") or []
    if ({port.get("name") for port in ports} | {port.get("containerPort") for port in ports}) & MANAGEMENT_PORTS:
        problems.append("ports: must not list the management API's (it listens on 127.0.0.1)")
    return [f"{where}: {problem}" for problem in problems]


def pod_problems(objects: list[dict]) -> list[str]:
    """One line per rule a Deployment's pods (every container, init containers too) or a Service breaks."""
    problems = []
    for data in objects:
        name = f"{data.get('kind')}/{(data.get('metadata') or {}).get('name')}"
        spec = data.get("spec") or {}
        if data.get("kind") == "Service":
            listed = {port.get("name") for port in spec.get("ports") or []} | {port.get("port") for port in spec.get("ports") or []}
            if listed & MANAGEMENT_PORTS:
                problems.append(f"{name}: ports: must not expose the management API")
        if data.get("kind") != "Deployment":
            continue
        pod = (spec.get("template") or {}).get("spec") or {}
        if pod.get("automountServiceAccountToken") is not False:
            problems.append(f"{name}: automountServiceAccountToken: must be false (nothing in it calls the Kubernetes API)")
        for flag in ("hostNetwork", "hostPID", "hostIPC"):
            if pod.get(flag):
                problems.append(f"{name}: {flag}: must not be true")
        if any("hostPath" in volume for volume in pod.get("volumes") or []):
            problems.append(f"{name}: volumes: no hostPath")
        for field in ("initContainers", "containers"):
            for container in pod.get(field) or []:
                problems += _container_problems(f"{name}: {field} {container.get('name')}", container, pod)
    return problems


def config_problems(text: str, token: bool) -> list[str]:
    """One line per key of a cluster's config.properties that opens more than segserve means to (#58)."""
    config = dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.lstrip().startswith("#"))
    problems = []
    host = re.sub(r"^\w+://", "", config.get("management_address", "http://127.0.0.1:8081")).rsplit(":", 1)[0]
    if host not in LOOPBACK:
        problems.append(f"config.properties: management_address={config.get('management_address')}: must be on 127.0.0.1")
    if config.get("grpc_management_address", "127.0.0.1") not in LOOPBACK:
        problems.append(f"config.properties: grpc_management_address={config['grpc_management_address']}: must be 127.0.0.1")
    if config.get("enable_model_api", "false").lower() != "false":
        problems.append("config.properties: enable_model_api: must be false (models come from model_snapshot)")
    if (config.get("disable_token_authorization", "false").lower() == "true") == token:
        problems.append(f"config.properties: disable_token_authorization: must be {str(not token).lower()} here")
    if not token:  # without a key, nothing of TorchServe's but its metrics may listen beyond the pod
        for key in ("inference_address", "grpc_inference_address"):
            if not any(host in config.get(key, "0.0.0.0") for host in LOOPBACK):
                problems.append(f"config.properties: {key}={config.get(key, '0.0.0.0')}: token authorization is off: must be on 127.0.0.1")
    return problems


def _reaches_metadata(rule: dict) -> bool:
    """Whether an egress rule lets a pod reach a metadata address on a port other than DNS's."""
    ports = [port.get("port") for port in rule.get("ports") or []]
    if ports and all(port == DNS_PORT for port in ports):
        return False
    peers = rule.get("to") or [{"ipBlock": {"cidr": "0.0.0.0/0"}}, {"ipBlock": {"cidr": "::/0"}}]  # no `to`: everywhere
    for peer in peers:
        block = peer.get("ipBlock") or {}
        if not block:
            continue  # pods and namespaces: not a metadata address
        cidr = ipaddress.ip_network(block["cidr"], strict=False)
        excepted = [ipaddress.ip_network(other, strict=False) for other in block.get("except") or []]
        for address in METADATA_ADDRESSES:
            if (
                address.version == cidr.version
                and address in cidr
                and not any(address in net for net in excepted if net.version == address.version)
            ):
                return True
    return False


def network_policy_problems(objects: list[dict], egress: bool) -> list[str]:
    """One line per NetworkPolicy rule that admits more than segserve means to: an ingress rule without ports (every
    port) or without `from` (every peer), a namespaceSelector that does not name its namespace (a namespace's other
    labels are its owner's to set), and with `egress`, no egress policy or a rule that reaches a metadata address."""
    problems = []
    for data in objects:
        if data.get("kind") != "NetworkPolicy":
            continue
        name, spec = f"NetworkPolicy/{(data.get('metadata') or {}).get('name')}", data.get("spec") or {}
        for index, rule in enumerate(spec.get("ingress") or []):
            if not rule.get("ports"):
                problems.append(f"{name}: ingress[{index}]: must name its ports (without them it admits every port)")
            if not rule.get("from"):
                problems.append(f"{name}: ingress[{index}]: must name its peers (without `from` it admits every pod and address)")
            for peer in rule.get("from") or []:
                if "namespaceSelector" not in peer:
                    continue
                namespace = ((peer["namespaceSelector"] or {}).get("matchLabels") or {}).get(NAMESPACE_LABEL)
                if not NAMESPACE_NAME.match(str(namespace or "")):
                    problems.append(
                        f"{name}: ingress[{index}]: a namespaceSelector must name one namespace ({NAMESPACE_LABEL}), not {namespace!r}"
                    )
        if not egress:
            continue
        if "Egress" not in (spec.get("policyTypes") or []):
            problems.append(f"{name}: policyTypes: must include Egress (else the pods reach every address, a cloud's metadata too)")
        for index, rule in enumerate(spec.get("egress") or []):
            if _reaches_metadata(rule):
                problems.append(f"{name}: egress[{index}]: reaches a cloud's metadata address (a node's credentials)")
    return problems
