"""Who reaches best/'s pods, and where they may go (#64): best/kserve.yaml's InferenceService is cluster-local, its
NetworkPolicy admits KServe's request path on the queue-proxy's ports only, its Istio AuthorizationPolicy validates
against Istio's CRD; best/k8s.yaml's pods reach no cloud metadata address, their keys expire and are renewed, a
client reads the inference key alone, and only a named namespace reads the metrics."""

import copy
import ipaddress
import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jsonschema
import pytest

from segserve.archives.foreign import ForeignArchive
from segserve.bench.results import manifest_check, manifests, mesh, pods
from tests.conftest import ROOT
from tests.unit.test_manifests import finish_best, k8s_docs, kserve_service, model_best, record, write_mar  # noqa: F401

METADATA = ipaddress.ip_address("169.254.169.254")


def kserve_docs(best) -> dict[str, dict]:
    return k8s_docs(best, "kserve.yaml")


def test_the_inference_service_is_cluster_local_as_kserve_reads_it_and_still_validates(model_best):
    service = kserve_service(model_best)
    assert service["metadata"]["labels"]["networking.knative.dev/visibility"] == "cluster-local"
    assert manifest_check.inference_service_problems(service) == []


def test_kserves_network_policy_admits_the_mesh_namespaces_on_the_queue_proxys_ports_only(model_best):
    policy = kserve_docs(model_best)["NetworkPolicy"]
    by_namespace = {}
    for rule in policy["spec"]["ingress"]:
        assert rule["ports"], rule  # no rule admits every port
        for peer in rule["from"]:
            if "namespaceSelector" in peer and "podSelector" not in peer:
                by_namespace[peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]] = [p["port"] for p in rule["ports"]]
    # the gateways and the activator reach Knative's queue-proxy (HTTP/1), the autoscaler its load metrics; not 8080
    assert by_namespace == {"istio-system": [8012], "knative-serving": [8012, 9090]}
    assert manifest_check.network_policy_problems([policy], egress=False) == []
    assert manifest_check.kubernetes_problems([policy]) == []


def test_a_network_policy_rule_without_ports_or_with_an_open_namespace_selector_is_refused_by_name(model_best):
    policy = kserve_docs(model_best)["NetworkPolicy"]
    before = copy.deepcopy(policy)  # the rules as they were (#64): the mesh namespaces on any port, metrics from any namespace
    before["spec"]["ingress"][2].pop("ports")
    before["spec"]["ingress"][1]["from"][0]["namespaceSelector"] = {}
    assert manifest_check.network_policy_problems([before], egress=False) == [
        "NetworkPolicy/tiny: ingress[1]: a namespaceSelector must name one namespace (kubernetes.io/metadata.name), not None",
        "NetworkPolicy/tiny: ingress[2]: must name its ports (without them it admits every port)",
    ]


def test_the_authorization_policy_validates_against_istios_crd_and_a_wrong_field_is_refused_by_name(model_best):
    istio = kserve_docs(model_best)["AuthorizationPolicy"]
    assert istio["apiVersion"] == "security.istio.io/v1" and manifest_check.authorization_policy_problems(istio) == []
    schema = json.loads((manifest_check.ISTIO / "authorizationpolicy-v1.schema.json").read_text())
    jsonschema.Draft7Validator(schema).validate({"spec": istio["spec"]})  # Istio's schema as it is, not only made strict
    assert "Apache License" in (manifest_check.ISTIO / "LICENSE").read_text()
    bad = copy.deepcopy(istio)
    bad["spec"]["rule"] = bad["spec"].pop("rules")
    bad["spec"]["action"] = "PERMIT"
    bad["spec"]["rule"][0]["to"][0]["operation"]["ports"] = [8012]  # Istio's ports are strings
    assert manifest_check.authorization_policy_problems(bad) == [
        "AuthorizationPolicy: Istio's CRD: spec.action: 'PERMIT' is not one of ['ALLOW', 'DENY', 'AUDIT', 'CUSTOM']",
        "AuthorizationPolicy: Istio's CRD: spec: Additional properties are not allowed ('rule' was unexpected)",
    ]
    bad["spec"]["rules"] = bad["spec"].pop("rule")
    assert (
        manifest_check.authorization_policy_problems(bad)[1]
        == "AuthorizationPolicy: Istio's CRD: spec.rules.0.to.0.operation.ports.0: 8012 is not of type 'string'"
    )
    wrong = manifest_check.authorization_policy_problems({**istio, "apiVersion": "security.istio.io/v1alpha1"})
    assert wrong == [
        "AuthorizationPolicy: apiVersion/kind security.istio.io/v1alpha1/AuthorizationPolicy: "
        "must be security.istio.io/v1/AuthorizationPolicy"
    ]


def test_the_authorization_policy_admits_the_network_policys_request_path_by_identity(model_best):
    istio = kserve_docs(model_best)["AuthorizationPolicy"]
    assert (
        istio["spec"]["selector"] == {"matchLabels": {"serving.kserve.io/inferenceservice": "tiny"}} and istio["spec"]["action"] == "ALLOW"
    )
    admitted = {
        rule["from"][0]["source"]["namespaces"][0]: rule["to"][0]["operation"]["ports"] for rule in istio["spec"]["rules"] if "from" in rule
    }
    assert admitted == {namespace: [str(port) for port in ports] for namespace, ports in mesh.KSERVE_FROM.items()}
    assert [rule for rule in istio["spec"]["rules"] if "from" not in rule] == [{"to": [{"operation": {"ports": ["8082"]}}]}]


def egress_admits(policy: dict, address: str, port: int) -> bool:
    """Whether a NetworkPolicy lets its pods open a TCP connection to address:port (read here, not by manifest_check)."""
    spec, ip = policy["spec"], ipaddress.ip_address(address)
    if "Egress" not in spec["policyTypes"]:
        return True
    for rule in spec.get("egress", []):
        if rule.get("ports") and not any(p["port"] == port and p["protocol"] == "TCP" for p in rule["ports"]):
            continue
        for peer in rule.get("to") or [{"ipBlock": {"cidr": "0.0.0.0/0"}}]:
            block = peer.get("ipBlock")
            if block and ipaddress.ip_network(block["cidr"]).version == ip.version and ip in ipaddress.ip_network(block["cidr"]):
                if not any(ip in ipaddress.ip_network(other) for other in block.get("except", [])):
                    return True
    return False


def test_k8s_pods_reach_dns_and_public_https_but_no_cloud_metadata_address(model_best):
    policy = k8s_docs(model_best)["NetworkPolicy"]
    assert not egress_admits(policy, "169.254.169.254", 80)  # AWS, GCP, Azure: a node's credentials
    assert not egress_admits(policy, "100.100.100.200", 80) and not egress_admits(policy, "fd00:ec2::254", 80)
    assert not egress_admits(policy, "10.96.0.1", 443)  # nor the Kubernetes API, nor other cluster services
    assert egress_admits(policy, "52.216.0.10", 443)  # S3, for the init container
    assert egress_admits(policy, "10.96.0.10", 53)  # kube-dns
    assert manifest_check.network_policy_problems([policy], egress=True) == []
    no_egress = copy.deepcopy(policy)
    no_egress["spec"]["policyTypes"] = ["Ingress"]
    assert manifest_check.network_policy_problems([no_egress], egress=True) == [
        "NetworkPolicy/tiny: policyTypes: must include Egress (else the pods reach every address, a cloud's metadata too)"
    ]
    no_egress["spec"].update(policyTypes=["Ingress", "Egress"], egress=[{"ports": [{"protocol": "TCP", "port": 80}]}])
    assert manifest_check.network_policy_problems([no_egress], egress=True) == [
        "NetworkPolicy/tiny: egress[0]: reaches a cloud's metadata address (a node's credentials)"
    ]


def test_only_pods_labelled_in_the_named_metrics_namespace_read_the_metrics(model_best, tmp_path, monkeypatch):
    for best, namespace in ((model_best, "monitoring"), (None, "prometheus")):
        if best is None:
            monkeypatch.setenv(pods.METRICS_NAMESPACE_ENV, namespace)
            folder = tmp_path / "other"  # model_best's results are in tmp_path
            folder.mkdir()
            best = finish_best(folder, ForeignArchive("tiny", write_mar(folder / "tiny.mar"), folder), record())
        for policy in (k8s_docs(best)["NetworkPolicy"], kserve_docs(best)["NetworkPolicy"]):
            rule = next(rule for rule in policy["spec"]["ingress"] if rule["ports"] == [{"protocol": "TCP", "port": 8082}])
            assert rule["from"] == [
                {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},  # the API server sets it
                    "podSelector": {"matchLabels": {"segserve.io/scrape-metrics": "true"}},
                }
            ]
        assert f"in the namespace {namespace} (SEGSERVE_METRICS_NAMESPACE)" in (best / "k8s.yaml").read_text()


def test_a_metrics_namespace_that_is_no_namespace_name_writes_no_manifest(tmp_path, monkeypatch):
    monkeypatch.setenv(manifests.STORAGE_ENV, "s3://models/tiny")
    monkeypatch.setenv(pods.METRICS_NAMESPACE_ENV, "Monitoring Stack")
    said = []
    best = finish_best(tmp_path, ForeignArchive("tiny", write_mar(tmp_path / "tiny.mar"), tmp_path), record(), log=said.append)
    assert not (best / "k8s.yaml").exists() and not (best / "kserve.yaml").exists() and not (best / "rayservice.yaml").exists()
    problem = "ingress[1]: a namespaceSelector must name one namespace (kubernetes.io/metadata.name), not 'Monitoring Stack'"
    assert said == [
        f"best/k8s.yaml not written: NetworkPolicy/tiny: {problem}",
        f"best/rayservice.yaml not written: NetworkPolicy/tiny-ray: {problem}",
        f"best/kserve.yaml not written: NetworkPolicy/tiny: {problem}",
    ]


def key_file(path, expires_in_s: float, inference: str = "old-inference") -> None:
    """key_file.json as TorchServe 0.12 writes it (TokenAuthorization.java: Java's Instant, nanoseconds, UTC)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() + expires_in_s)) + ".071210180Z"
    keys = {
        "management": {"key": "the-management-key", "expiration time": stamp},
        "inference": {"key": inference, "expiration time": stamp},
    }
    path.write_text(json.dumps({**keys, "API": {"key": "the-api-key"}}, indent=2))


class StandIn(BaseHTTPRequestHandler):
    """TorchServe's answers the probe relies on: /token?type=inference with the API key makes a new inference key
    (rewrites the file), /ping wants the current inference key, else 400 InvalidKeyException."""

    def do_GET(self):
        keys = json.loads(self.server.key_file.read_text())
        if self.path == "/token?type=inference" and self.headers["Authorization"] == "Bearer the-api-key":
            key_file(self.server.key_file, pods.TOKEN_LIFETIME_MIN * 60, "new-inference")
            self.server.calls.append("token")
            status = 200
        else:
            status = 200 if self.path == "/ping" and self.headers["Authorization"] == f"Bearer {keys['inference']['key']}" else 400
            self.server.calls.append(f"ping {status}")
        self.send_response(status)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def torchserve_stand_in(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    server.key_file, server.calls = tmp_path / "key_file.json", []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def run_probe(server) -> int:
    port = server.server_address[1]
    code = pods.ping().replace(pods.KEY_FILE, str(server.key_file)).replace(":8081/", f":{port}/").replace(":8080/", f":{port}/")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=30).returncode


def test_keys_live_a_day_and_the_readiness_probe_renews_the_inference_key_in_its_last_minutes(model_best, torchserve_stand_in):
    config = k8s_docs(model_best)["ConfigMap"]["data"]["config.properties"]
    assert "token_expiration_min=1440" in config.splitlines()  # was 100 years
    key_file(torchserve_stand_in.key_file, 3600)  # an hour left: used as it is
    assert run_probe(torchserve_stand_in) == 0 and torchserve_stand_in.calls == ["ping 200"]
    key_file(torchserve_stand_in.key_file, pods.TOKEN_RENEW_BEFORE_MIN * 60 - 30)  # in its last minutes: renewed first
    assert run_probe(torchserve_stand_in) == 0 and torchserve_stand_in.calls[1:] == ["token", "ping 200"]
    assert json.loads(torchserve_stand_in.key_file.read_text())["inference"]["key"] == "new-inference"


def test_the_documented_command_prints_the_inference_key_and_nothing_else(model_best, tmp_path):
    header = (model_best / "k8s.yaml").read_text().split("apiVersion")[0]
    command = next(line for line in header.splitlines() if "reads the inference key" in line).split(": ", 1)[1]
    assert command == pods.inference_key_command("tiny") and "cat " not in header
    assert pods.inference_key_command("<name>") in (ROOT / "docs" / "deploying.md").read_text()  # the docs show the same
    key_file(tmp_path / "key_file.json", 3600, "the-inference-key")
    local = command.removeprefix("kubectl exec deploy/tiny -c torchserve -- ").replace(pods.KEY_FILE, str(tmp_path / "key_file.json"))
    printed = subprocess.run(["sh", "-c", local.replace("python3", sys.executable, 1)], capture_output=True, text=True, timeout=30)
    assert printed.stdout == "the-inference-key\n"
    assert "kubectl exec deploy/tiny -c torchserve" in pods.renew_command("tiny") and "type=inference" in pods.renew_command("tiny")
