"""best/k8s.yaml and best/kserve.yaml for an archive target's best point, read back through the official API models
(kubernetes.client, and kserve's generated models): every field exists there, the values come from the record, and
a misspelt field is caught. No cluster: these check the manifests' form, not a deployment."""

import importlib.util
import json
import os
import re
import sys
import types
import zipfile
from pathlib import Path
from types import SimpleNamespace

import kubernetes.client
import pydantic
import pytest
import yaml

from segserve.archives.foreign import ForeignArchive
from segserve.bench.results import manifests
from segserve.bench.run.targets.best import Best
from tests.conftest import ROOT

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def kserve_part(module: str):
    """kserve.<module> (its generated models, its ApiClient) without kserve/__init__.py, which starts importing KServe's
    model server (fastapi, grpc, …): kserve is installed without its dependencies (make setup-dev); these need none."""
    if "kserve" not in sys.modules:
        spec = importlib.util.find_spec("kserve")
        if spec is None:
            pytest.fail("kserve is not installed: make setup-dev installs it (pip install --no-deps kserve==0.21.0)")
        package = types.ModuleType("kserve")
        package.__path__, package.__spec__ = list(spec.submodule_search_locations), spec
        sys.modules.setdefault("kserve", package)
    return importlib.import_module(f"kserve.{module}")


def build(data, kind: str, path: str = ""):
    """`data` as an instance of the API model `kind` ('V1Deployment', 'list[V1Container]', …). Kubernetes' models
    are pydantic models that forbid unknown fields (model_validate); kserve's generated classes are checked here the
    same way, field by field, since their constructors take Python names and ApiClient.deserialize drops what it does
    not know without a word."""
    if data is None:
        return None
    if kind.startswith("list["):
        return [build(item, kind[5:-1], f"{path}[{i}]") for i, item in enumerate(data)]
    if kind.startswith("dict("):
        value_kind = kind[5:-1].split(", ", 1)[1]
        return {key: build(value, value_kind, f"{path}.{key}") for key, value in data.items()}
    if kind in ("str", "int", "float", "bool", "object", "datetime", "date"):
        return data
    if hasattr(kubernetes.client.models, kind):
        return getattr(kubernetes.client.models, kind).model_validate(data)
    klass = getattr(kserve_part("models"), kind)
    fields = {json_key: attribute for attribute, json_key in klass.attribute_map.items()}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        close = {key: [f for f in fields if f.lower() == key.lower()] for key in unknown}
        hint = "; ".join(f"{key!r}" + (f" (did you mean {close[key][0]!r}?)" if close[key] else "") for key in unknown)
        raise ValueError(f"{path or kind}: not a field of {kind}: {hint}")
    values = {fields[key]: build(value, klass.openapi_types[fields[key]], f"{path}.{key}") for key, value in data.items()}
    return klass(**values)


def round_trip(data: dict, kind: str) -> dict:
    """Read into the official model and written out again by its own ApiClient."""
    if hasattr(kubernetes.client.models, kind):
        return kubernetes.client.ApiClient().sanitize_for_serialization(build(data, kind))
    written = kserve_part("api_client").ApiClient().sanitize_for_serialization(build(data, kind))
    model = written["spec"]["predictor"]["model"]
    if model.get("name") == "":  # kserve's ModelSpec defaults its container's name to "" (KServe names it)
        del model["name"]
    return written


def write_mar(path: Path, version: str = "3.1") -> Path:
    with zipfile.ZipFile(path, "w") as mar:
        mar.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": {"modelName": path.stem, "modelVersion": version}}))
    return path


def record(**values) -> dict:
    """A best point's record with the keys a measured archive target's record has (tests/system/test_foreign_archives.py)."""
    environment = {"cpu_model": "AMD EPYC", "cpu_vendor": "AuthenticAMD", "cpu_cores": 8, "cpu_affinity": list(range(8))}
    base = {"run_id": "tiny-1a2b3c4d", "target": "tiny", "throughput_rps": 120.5, "concurrency": 64, "workers": 2}
    base.update({"batch_size": 4, "max_batch_delay_ms": 10, "response_timeout": 30, "server_rss_mb": 1500.0})
    return {**base, "environment": environment, **values}


def finish_best(
    tmp_path, foreign: ForeignArchive, chosen: dict, core_plan=None, log=print, fuse=None, worker_env=(), constraints=None
) -> Path:
    """The Best sink as a suite's end runs it, on a catalog holding only this archive target (its suite's worker_env
    and constraints)."""
    target = foreign.target()
    catalog = SimpleNamespace(targets={target.name: target}, foreign={target.name: foreign}, config_template=ROOT / "config.properties")
    out = tmp_path / "results"
    out.mkdir()
    run = SimpleNamespace(
        analysis=SimpleNamespace(winners={target.name: chosen}),
        out_dir=out,
        environment={},
        suite=SimpleNamespace(core_plan=core_plan, archive_worker_env=worker_env, constraint_bounds=constraints or {}),
    )
    Best(catalog, log, fuse).finish(run)
    return out / "best"


@pytest.fixture
def model_best(tmp_path, monkeypatch):
    monkeypatch.setenv(manifests.STORAGE_ENV, "s3://models/tiny/")
    foreign = ForeignArchive("tiny", write_mar(tmp_path / "users_tiny.mar"), tmp_path)
    return finish_best(tmp_path, foreign, record(omp_num_threads=1))


@pytest.fixture
def workflow_best(tmp_path, monkeypatch):
    monkeypatch.delenv(manifests.STORAGE_ENV, raising=False)
    spec = {"models": {"seg": {"url": "seg.mar"}, "jpeg": {"url": "jpeg.mar"}}, "dag": {"seg": ["jpeg"]}}
    foreign = ForeignArchive("seed_flow", tmp_path / "seed_flow.war", tmp_path, spec, "spec.yaml")
    chosen = record(target="seed_flow", run_id="seed_flow-9f8e7d6c", workers=1, seg_workers=3, seg_batch_size=8, server_rss_mb=None)
    return finish_best(tmp_path, foreign, chosen)


def k8s_docs(best: Path, file: str = "k8s.yaml") -> dict[str, dict]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all((best / file).read_text())}


def kserve_service(best: Path) -> dict:
    return k8s_docs(best, "kserve.yaml")["InferenceService"]


def test_k8s_manifests_round_trip_through_the_kubernetes_api_models(model_best):
    docs = k8s_docs(model_best)
    assert set(docs) == {"ConfigMap", "Deployment", "Service", "NetworkPolicy"}
    for kind, doc in docs.items():
        assert round_trip(doc, f"V1{kind}") == doc
    for doc in docs.values():
        assert DNS_LABEL.match(doc["metadata"]["name"].removesuffix("-config")), doc["metadata"]["name"]


def test_the_inference_service_round_trips_through_kserves_models(model_best):
    service = kserve_service(model_best)
    assert round_trip(service, "V1beta1InferenceService") == service
    model = service["spec"]["predictor"]["model"]
    assert service["apiVersion"] == "serving.kserve.io/v1beta1" and service["kind"] == "InferenceService"
    assert model["modelFormat"] == {"name": "pytorch"} and model["protocolVersion"] == "v1"
    assert model["storageUri"] == "s3://models/tiny"  # SEGSERVE_STORAGE_URI, the trailing slash dropped


def test_replicas_resources_and_ports_come_from_the_best_point(model_best):
    deployment = k8s_docs(model_best)["Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert deployment["spec"]["replicas"] == 1
    # workers 2 × omp_num_threads 1 + 1 for the frontend (the record's machine had 8 cores); RSS 1500 MB + 25%, in 64 Mi
    assert container["resources"] == {"requests": {"cpu": "3", "memory": "1920Mi"}, "limits": {"cpu": "3", "memory": "1920Mi"}}
    assert {"name": "OMP_NUM_THREADS", "value": "1"} in container["env"]
    assert [p["containerPort"] for p in container["ports"]] == [8080, 8082]  # inference and metrics (#58)
    assert "/ping" in container["readinessProbe"]["exec"]["command"][2]
    assert [p["port"] for p in k8s_docs(model_best)["Service"]["spec"]["ports"]] == [8080]
    service = kserve_service(model_best)
    assert service["spec"]["predictor"]["model"]["resources"] == container["resources"]
    assert service["spec"]["predictor"]["scaleTarget"] == 64  # the concurrency it was measured at
    header = (model_best / "k8s.yaml").read_text().split("apiVersion")[0]
    assert "cpu 3: workers 2 (tiny 2) × omp_num_threads 1" in header and "server_rss_mb 1500 in tiny-1a2b3c4d" in header


def test_the_registration_is_torchserves_model_snapshot_in_both_configs(model_best):
    snapshots = []
    kserve_text = (model_best / "kserve/config/config.properties").read_text()
    for text in (k8s_docs(model_best)["ConfigMap"]["data"]["config.properties"], kserve_text):
        line = next(line for line in text.splitlines() if line.startswith("model_snapshot="))
        snapshots.append(json.loads(line.split("=", 1)[1]))
    entry = {"defaultVersion": True, "marName": "users_tiny.mar", "minWorkers": 2, "maxWorkers": 2}
    entry.update({"batchSize": 4, "maxBatchDelay": 10, "responseTimeout": 30})
    assert snapshots[0] == snapshots[1] == {"name": "startup.cfg", "modelCount": 1, "models": {"tiny": {"3.1": entry}}}
    kserve_config = kserve_text.splitlines()
    assert "inference_address=http://127.0.0.1:8085" in kserve_config and "model_store=/mnt/models/model-store" in kserve_config


def test_a_misspelt_field_is_caught(model_best):
    deployment = k8s_docs(model_best)["Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(pydantic.ValidationError, match=r"readinesProbe\s+Extra inputs are not permitted"):
        build(deployment, "V1Deployment")
    # the client's from_dict drops it without a word: only the comparison would notice
    dropped = kubernetes.client.V1Deployment.from_dict(deployment)
    assert kubernetes.client.ApiClient().sanitize_for_serialization(dropped) != deployment
    service = kserve_service(model_best)
    service["spec"]["predictor"]["model"]["storageURI"] = service["spec"]["predictor"]["model"].pop("storageUri")
    with pytest.raises(ValueError, match=r"'storageURI' \(did you mean 'storageUri'\?\)"):
        build(service, "V1beta1InferenceService")


def test_a_missing_required_field_is_caught(model_best):
    container = k8s_docs(model_best)["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    del container["name"]
    with pytest.raises(pydantic.ValidationError, match="name"):
        build(container, "V1Container")
    port = k8s_docs(model_best)["Deployment"]["spec"]["template"]["spec"]["containers"][0]["ports"][0]
    with pytest.raises(pydantic.ValidationError, match="containerPort"):
        build({**port, "containerPort": "8080"}, "V1ContainerPort")  # a number, not a string


def test_a_workflow_gets_a_deployment_that_registers_it_and_no_inference_service(workflow_best):
    assert not (workflow_best / "kserve.yaml").exists()
    docs = k8s_docs(workflow_best)
    for kind, doc in docs.items():
        assert round_trip(doc, f"V1{kind}") == doc
    assert docs["Deployment"]["metadata"]["name"] == "seed-flow"  # seed_flow is no DNS label
    container = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    hook = container["lifecycle"]["postStart"]["exec"]["command"]
    assert hook[:2] == ["python3", "-c"] and "workflows?url=seed_flow.war&workflow_name=seed_flow" in hook[2]
    compile(hook[2], "postStart", "exec")
    assert container["resources"]["limits"]["memory"] == manifests.DEFAULT_MEMORY  # the record has no server_rss_mb
    assert not any(line.startswith("model_snapshot=") for line in docs["ConfigMap"]["data"]["config.properties"].splitlines())
    header = (workflow_best / "k8s.yaml").read_text().split("apiVersion")[0]
    assert "seed_flow__seg workers 3, batch_size 8" in header and "seed_flow__jpeg workers 1, batch_size 4" in header
    # no storage URI given: a placeholder that names what to set, fetched by the init container
    init = docs["Deployment"]["spec"]["template"]["spec"]["initContainers"][0]
    assert f"s3://SET-{manifests.STORAGE_ENV}/seed-flow/model-store/" in init["args"]


def test_a_core_plan_sizes_the_pod_by_its_cores(tmp_path):
    core = sorted(os.sched_getaffinity(0))[0]
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"frontend: [{core}]\nmodels:\n  tiny: {{cores: [{core}]}}\n")
    served = manifests.Served("tiny", False, "tiny.mar", {"tiny": {"workers": 4}})
    sized = manifests.cpu(record(pinning="plan", omp_num_threads=2), served, str(plan))
    assert sized.value == 1 and str(plan) in sized.why  # the frontend shares the model's core: one core in all


def test_a_pvc_storage_uri_mounts_the_claim(tmp_path, monkeypatch):
    monkeypatch.setenv(manifests.STORAGE_ENV, "pvc://archives/tiny")
    foreign = ForeignArchive("tiny", write_mar(tmp_path / "tiny.mar"), tmp_path)
    docs = k8s_docs(finish_best(tmp_path, foreign, record()))
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    assert round_trip(docs["Deployment"], "V1Deployment") == docs["Deployment"] and "initContainers" not in pod
    assert {"name": "model-store", "persistentVolumeClaim": {"claimName": "archives", "readOnly": True}} in pod["volumes"]
    assert pod["containers"][0]["volumeMounts"][1]["subPath"] == "tiny/model-store"
    assert pod["containers"][0]["resources"]["limits"]["cpu"] == "8"  # omp_num_threads unset: every core it ran on
