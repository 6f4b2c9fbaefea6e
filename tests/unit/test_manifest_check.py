"""best/'s manifests checked as a cluster checks them (#51): Kubernetes' OpenAPI schemas (strict) for the oldest and
the newest minor kubernetes-validate covers, KServe's InferenceService CRD, and the runtime the manifest relies on."""

import copy

import pytest

from segserve.archives.foreign import ForeignArchive
from segserve.bench.results import manifest_check, manifests
from tests.unit.test_manifests import (  # noqa: F401 (model_best, workflow_best: fixtures)
    finish_best,
    k8s_docs,
    kserve_service,
    model_best,
    record,
    workflow_best,
    write_mar,
)

MISSPELT = {  # kind → (where a field goes, the misspelt field)
    "ConfigMap": (("metadata",), "lables"),
    "Deployment": (("spec", "template", "spec", "containers", 0), "imagePullPolice"),
    "Service": (("spec",), "sessionAfinity"),
    "NetworkPolicy": (("spec",), "podSelectr"),
}


def misspelt(doc: dict, where: tuple, field: str) -> dict:
    bad = copy.deepcopy(doc)
    node = bad
    for key in where:
        node = node[key]
    node[field] = "x"
    return bad


def test_the_checked_versions_are_the_oldest_and_newest_kubernetes_validate_covers():
    oldest, newest = manifest_check.kubernetes_versions()
    assert tuple(map(int, oldest.split("."))) < tuple(map(int, newest.split("."))) and oldest.startswith("1.")


def test_every_kubernetes_object_of_best_validates_and_a_misspelt_field_is_refused_by_name_in_every_version(model_best):
    docs = k8s_docs(model_best)
    assert set(docs) == set(MISSPELT) and manifest_check.kubernetes_problems(list(docs.values())) == []
    for kind, (where, field) in MISSPELT.items():
        problems = manifest_check.kubernetes_problems([misspelt(docs[kind], where, field)])
        assert len(problems) == 2, problems  # one per version checked
        for problem, version in zip(problems, manifest_check.kubernetes_versions(), strict=True):
            assert problem.startswith(f"{kind}/") and f"Kubernetes {version}" in problem and repr(field) in problem, problem


def test_the_inference_service_validates_against_kserves_crd_and_a_misspelt_field_is_refused_by_name(model_best):
    service = kserve_service(model_best)
    assert manifest_check.inference_service_problems(service) == []
    bad = misspelt(service, ("spec", "predictor", "model"), "storageUrl")
    assert manifest_check.inference_service_problems(bad) == [
        "InferenceService: KServe's CRD: spec.predictor.model: Additional properties are not allowed ('storageUrl' was unexpected)"
    ]
    meta = misspelt(service, ("metadata",), "nmae")  # the CRD leaves metadata to Kubernetes' ObjectMeta
    assert any("'nmae'" in p and p.startswith("InferenceService/") for p in manifest_check.inference_service_problems(meta))
    for field, value, said in (("protocolVersion", "v3", "protocolVersion 'v3'"), ("modelFormat", {"name": "onnx"}, "modelFormat 'onnx'")):
        other = copy.deepcopy(service)
        other["spec"]["predictor"]["model"][field] = value
        assert any(said in p and manifest_check.RUNTIME in p for p in manifest_check.inference_service_problems(other)), field


def test_kserve_yaml_names_the_runtime_and_what_to_do_where_it_is_gone(model_best):
    text = (model_best / "kserve.yaml").read_text()
    assert "kserve-torchserve" in text and "v0.8.0" in text and "#5638" in text and "best/k8s.yaml" in text


def test_a_manifest_that_does_not_validate_is_not_written_and_the_rest_of_best_stays(tmp_path, monkeypatch):
    monkeypatch.setenv(manifests.STORAGE_ENV, "s3://models/tiny/")
    real = manifests.inference_service

    def misspelt_service(*args, **kwargs):
        return misspelt(real(*args, **kwargs), ("spec", "predictor"), "minReplica")

    monkeypatch.setattr(manifests, "inference_service", misspelt_service)
    foreign = ForeignArchive("tiny", write_mar(tmp_path / "users_tiny.mar"), tmp_path)
    said = []
    best = finish_best(tmp_path, foreign, record(), log=said.append)
    assert not (best / "kserve.yaml").exists()
    assert (best / "k8s.yaml").is_file() and (best / "register.sh").is_file() and (best / "config.properties").is_file()
    assert said == ["best/kserve.yaml not written: InferenceService: KServe's CRD: spec.predictor: Additional properties are not "
                    "allowed ('minReplica' was unexpected)"]  # fmt: skip


def test_a_workflow_that_cannot_be_fused_gets_best_fused_txt_saying_why_and_the_rest_of_best_stays(tmp_path, monkeypatch):
    from segserve.errors import UsageError

    def cannot_fuse(war, model_store, out, log, worker_env):
        assert worker_env == ("AWS_PROFILE",)  # its import check gets what the suite's archive workers get
        raise UsageError(f"{war}: node 'x y': a node name of letters, digits, '_' and '-' only can be fused")

    monkeypatch.delenv(manifests.STORAGE_ENV, raising=False)
    spec = {"models": {"seg": {"url": "seg.mar"}, "jpeg": {"url": "jpeg.mar"}}, "dag": {"seg": ["jpeg"]}}
    foreign = ForeignArchive("seed_flow", tmp_path / "seed_flow.war", tmp_path, spec, "spec.yaml")
    said = []
    chosen = record(target="seed_flow", run_id="seed_flow-9f8e7d6c", workers=1, server_rss_mb=None)
    best = finish_best(tmp_path, foreign, chosen, log=said.append, fuse=cannot_fuse, worker_env=("AWS_PROFILE",))
    assert "cannot be fused into one .mar, so KServe cannot serve it" in (best / "fused.txt").read_text()
    assert not (best / "fused").exists() and (best / "k8s.yaml").is_file() and (best / "seed_flow.yaml").is_file()
    assert len(said) == 1 and said[0].startswith("best/: no fused .mar of seed_flow.war: ") and "'x y'" in said[0]


def config_of(best, file: str = "k8s.yaml") -> dict:
    """The cluster config.properties of best/k8s.yaml's ConfigMap (or of best/kserve/config/), as keys."""
    text = (best / file).read_text() if file != "k8s.yaml" else k8s_docs(best)["ConfigMap"]["data"]["config.properties"]
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))


@pytest.mark.parametrize("kind", ["model_best", "workflow_best"])
def test_the_management_api_stays_in_the_pod_and_neither_the_container_nor_the_service_lists_it(kind, request):
    best = request.getfixturevalue(kind)
    docs, config = k8s_docs(best), config_of(best)
    container = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert config["management_address"] == "http://127.0.0.1:8081" and config["grpc_management_address"] == "127.0.0.1"
    assert config["grpc_inference_address"] == "127.0.0.1"  # not measured over gRPC: on loopback
    assert config["enable_model_api"] == "false"  # models from model_snapshot; POST /workflows is not gated by it
    assert [port["name"] for port in container["ports"]] == ["inference", "metrics"]
    assert [port["name"] for port in docs["Service"]["spec"]["ports"]] == ["inference"]
    if kind == "workflow_best":
        return
    kserve = config_of(best, "kserve/config/config.properties")
    assert kserve["management_address"] == kserve["inference_address"] == "http://127.0.0.1:8085"
    assert kserve["enable_model_api"] == "false" and kserve["grpc_inference_address"] == "127.0.0.1"


def test_a_point_measured_over_grpc_exposes_grpc_inference_and_never_grpc_management(tmp_path, monkeypatch):
    monkeypatch.setenv(manifests.STORAGE_ENV, "s3://models/tiny")
    best = finish_best(tmp_path, ForeignArchive("tiny", write_mar(tmp_path / "tiny.mar"), tmp_path), record(protocol="grpc"))
    docs, config = k8s_docs(best), config_of(best)
    assert config["grpc_inference_address"] == "0.0.0.0" and config["grpc_management_address"] == "127.0.0.1"
    assert [port["port"] for port in docs["Service"]["spec"]["ports"]] == [8080, 7070]
    assert docs["NetworkPolicy"]["spec"]["ingress"][0]["ports"] == [{"protocol": "TCP", "port": p} for p in ("inference", "grpc-inference")]


def test_token_authorization_is_on_in_k8s_and_off_in_kserve_only_where_its_header_says_why_and_a_network_policy_stands(model_best):
    k8s, kserve = config_of(model_best), config_of(model_best, "kserve/config/config.properties")
    assert k8s["disable_token_authorization"] == "false" and int(k8s["token_expiration_min"]) == 24 * 60  # a day (#64)
    assert kserve["disable_token_authorization"] == "true"
    text = (model_best / "kserve.yaml").read_text()
    assert "token authorization OFF (KServe's runtime calls TorchServe without a" in text.split("apiVersion")[0]
    policy = k8s_docs(model_best, "kserve.yaml")["NetworkPolicy"]
    assert policy["spec"]["podSelector"] == {"matchLabels": {"serving.kserve.io/inferenceservice": "tiny"}}
    assert policy["spec"]["ingress"][0]["from"] == [{"podSelector": {"matchLabels": {"segserve.io/client-of": "tiny"}}}]
    assert manifest_check.kubernetes_problems([policy]) == []
    assert "cat /home/model-server/work/key_file.json" not in (model_best / "k8s.yaml").read_text()  # the management key too (#64)


def test_the_manifests_carry_the_server_environment_the_point_was_measured_in(model_best):
    from segserve.serving.server import SERVER_ENV

    container = k8s_docs(model_best)["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert {name: env[name] for name in SERVER_ENV} == {name: manifests.os.environ.get(name, v) for name, v in SERVER_ENV.items()}
    assert env["OMP_NUM_THREADS"] == "1" and env["MALLOC_TRIM_THRESHOLD_"]
    assert kserve_service(model_best)["spec"]["predictor"]["model"]["env"] == [e for e in container["env"] if e["name"] != "TEMP"]


@pytest.mark.parametrize("kind", ["model_best", "workflow_best"])
def test_pods_meet_the_restricted_profile_with_limits_everywhere_and_no_service_account_token(kind, request):
    best = request.getfixturevalue(kind)
    docs = list(k8s_docs(best).values())
    assert manifest_check.pod_problems(docs) == []
    pod = k8s_docs(best)["Deployment"]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in pod["containers"] + pod.get("initContainers", []):
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] and security["capabilities"] == {"drop": ["ALL"]}, container["name"]
        assert set(container["resources"]["limits"]) == {"cpu", "memory"}, container["name"]
    assert {v["name"] for v in pod["volumes"] if "emptyDir" in v} >= {"work", "tmp"}  # where TorchServe writes
    init = pod.get("initContainers", [{}])[0]
    assert "envFrom" not in init and {"name": "AWS_SHARED_CREDENTIALS_FILE", "value": "/aws/credentials"} in init.get("env", [])


RULES = {  # a change to a restricted pod → the problem it must raise
    "runAsNonRoot": (lambda pod, c: [c["securityContext"].pop("runAsNonRoot"), pod["securityContext"].pop("runAsNonRoot")], "runAsNonRoot"),
    "root": (lambda pod, c: c["securityContext"].update(runAsUser=0), "runAsUser: must be a non-zero user"),
    "escalation": (lambda pod, c: c["securityContext"].pop("allowPrivilegeEscalation"), "allowPrivilegeEscalation"),
    "capabilities": (lambda pod, c: c["securityContext"]["capabilities"].update(add=["NET_RAW"]), "capabilities: must drop ALL"),
    "seccomp": (lambda pod, c: [c["securityContext"].pop("seccompProfile"), pod["securityContext"].pop("seccompProfile")], "seccomp"),
    "read-only root": (lambda pod, c: c["securityContext"].update(readOnlyRootFilesystem=False), "readOnlyRootFilesystem"),
    "memory limit": (lambda pod, c: c["resources"]["limits"].pop("memory"), "resources.limits: no memory"),
    "token": (lambda pod, c: pod.pop("automountServiceAccountToken"), "automountServiceAccountToken"),
    "management port": (lambda pod, c: c.setdefault("ports", []).append({"name": "management", "containerPort": 8081}), "management"),
    "image": (lambda pod, c: c.update(image="torchserve; rm -rf /"), "image 'torchserve; rm -rf /'"),
    "subPath": (lambda pod, c: c["volumeMounts"][0].update(subPath="../other"), "subPath '../other': must stay inside its volume"),
}


def test_each_restricted_rule_broken_in_any_container_is_named(model_best):
    for rule, (change, said) in RULES.items():
        for index in (0, 1):  # the TorchServe container and the init container
            deployment = copy.deepcopy(k8s_docs(model_best)["Deployment"])
            pod = deployment["spec"]["template"]["spec"]
            container = (pod["containers"] + pod["initContainers"])[index]
            change(pod, container)
            problems = manifest_check.pod_problems([deployment])
            assert problems and all(p.startswith("Deployment/tiny: ") for p in problems) and any(said in p for p in problems), (
                rule,
                problems,
            )


def test_config_problems_name_an_open_management_api_the_model_api_and_a_token_that_is_not_as_the_manifest_says():
    good = "management_address=http://127.0.0.1:8081\nenable_model_api=false\ndisable_token_authorization=false\n"
    assert manifest_check.config_problems(good, True) == []
    shelltorch = "management_address=http://0.0.0.0:8081\nenable_model_api=true\ndisable_token_authorization=true\n"
    assert manifest_check.config_problems(shelltorch, True) == [
        "config.properties: management_address=http://0.0.0.0:8081: must be on 127.0.0.1",
        "config.properties: enable_model_api: must be false (models come from model_snapshot)",
        "config.properties: disable_token_authorization: must be false here",
    ]
    keyless = "management_address=http://127.0.0.1:8085\ninference_address=http://0.0.0.0:8085\ndisable_token_authorization=true\n"
    assert manifest_check.config_problems(keyless, False) == [
        "config.properties: inference_address=http://0.0.0.0:8085: token authorization is off: must be on 127.0.0.1",
        "config.properties: grpc_inference_address=0.0.0.0: token authorization is off: must be on 127.0.0.1",
    ]


def test_a_pod_that_breaks_the_restricted_profile_is_not_written_and_the_rest_of_best_stays(tmp_path, monkeypatch):
    from segserve.bench.results import pods

    monkeypatch.setenv(manifests.STORAGE_ENV, "s3://models/tiny/")
    writable = {**pods.container_security(), "readOnlyRootFilesystem": False}
    monkeypatch.setattr(pods, "container_security", lambda: dict(writable))
    said = []
    best = finish_best(tmp_path, ForeignArchive("tiny", write_mar(tmp_path / "tiny.mar"), tmp_path), record(), log=said.append)
    assert not (best / "k8s.yaml").exists() and (best / "register.sh").is_file() and (best / "config.properties").is_file()
    assert not (best / "rayservice.yaml").exists()  # its pods share the rule (pods.container_security)
    assert [line for line in said if line.startswith("best/k8s.yaml")] == [
        f"best/k8s.yaml not written: Deployment/tiny: {field} {name}: securityContext.readOnlyRootFilesystem: must be true "
        "(emptyDir volumes where it writes)"
        for field, name in (("initContainers", "archives"), ("containers", "torchserve"))
    ]
