"""Who reaches best/kserve.yaml's predictor pods (#64): KServe's request path in its default (Serverless) install.

The InferenceService is cluster-local: no route through the external gateway. A NetworkPolicy admits the gateways
and Knative's activator and autoscaler on the queue-proxy's ports only, and an Istio AuthorizationPolicy admits the
same peers by their mesh identity (mTLS), in force where the predictor pods run with an Istio sidecar (KServe's
service-mesh mode); both checked before they are written (manifest_check.py, against Istio's CRD in istio/).
Neither tells one caller inside the cluster from another: whoever calls the cluster-local URL comes through the
cluster-local gateway, and TorchServe's token is off (KServe's kserve_wrapper calls TorchServe without a key). For a
key per client, best/k8s.yaml keeps TorchServe's token on.
"""

from segserve.bench.results import pods

# Knative puts its queue-proxy beside KServe's server (8080) in each predictor pod. The gateways (istio-system) and
# the activator (knative-serving) send requests to the queue-proxy, never to 8080: to 8012 for a container port named
# http1 or not named (the runtime's kserve-container names none: protocol v1 over HTTP/1), to 8013 only for one named
# h2c (gRPC), which best/kserve.yaml never asks for. Knative's autoscaler (knative-serving) reads the queue-proxy's
# load on 9090 to add or remove pods. Knative's own names (knative.dev/serving, pkg/apis/networking/ports.go):
# BackendHTTPPort 8012, BackendHTTP2Port 8013, AutoscalingQueueMetricsPort 9090; its 8022 (the queue-proxy's admin
# port, for the pod's own hooks) and 9091 (its request metrics) are not admitted.
QUEUE_PROXY_HTTP1, QUEUE_PROXY_AUTOSCALING = 8012, 9090
KSERVE_FROM = {"istio-system": [QUEUE_PROXY_HTTP1], "knative-serving": [QUEUE_PROXY_HTTP1, QUEUE_PROXY_AUTOSCALING]}
# KServe's ingress (ingress_reconciler.go) routes an InferenceService with this label through the cluster-local
# gateway only, and copies the InferenceService's labels to its Knative Service, which Knative then keeps
# cluster-local too (knative.dev/docs/serving/services/private-services/)
VISIBILITY = {"networking.knative.dev/visibility": "cluster-local"}
POD_LABEL = "serving.kserve.io/inferenceservice"  # KServe labels each predictor pod with its InferenceService's name
ISTIO_API = "security.istio.io/v1"


def network_policy(name: str, labels: dict, port: int) -> dict:
    """Pods labelled CLIENT_LABEL: <name> on KServe's server, the metrics to the metrics namespace, and KServe's request
    path on the queue-proxy's ports."""
    return pods.network_policy(name, labels, {POD_LABEL: name}, [port], KSERVE_FROM)


def authorization_policy(name: str, labels: dict) -> dict:
    """Istio's check of the same request path, by mTLS identity (a peer's namespace is in its certificate, not its
    address): ALLOW lists what may reach the predictor's sidecar, everything else is refused. The metrics port is
    open to any source here: a Prometheus outside the mesh has no identity; the NetworkPolicy names its namespace."""
    rules = [{"from": [{"source": {"namespaces": [namespace]}}], "to": [{"operation": {"ports": [str(p) for p in ports]}}]}
             for namespace, ports in KSERVE_FROM.items()]  # fmt: skip
    rules.append({"to": [{"operation": {"ports": [str(pods.PORTS["metrics"])]}}]})
    spec = {"selector": {"matchLabels": {POD_LABEL: name}}, "action": "ALLOW", "rules": rules}
    return {"apiVersion": ISTIO_API, "kind": "AuthorizationPolicy", "metadata": {"name": name, "labels": labels}, "spec": spec}
