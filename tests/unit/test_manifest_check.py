"""best/'s manifests checked as a cluster checks them (#51): Kubernetes' OpenAPI schemas (strict) for the oldest and
the newest minor kubernetes-validate covers, KServe's InferenceService CRD, and the runtime the manifest relies on."""

import copy

import yaml

from segserve.archives.foreign import ForeignArchive
from segserve.bench.results import manifest_check, manifests
from tests.unit.test_manifests import finish_best, k8s_docs, model_best, record, write_mar  # noqa: F401 (model_best: a fixture)

MISSPELT = {  # kind → (where a field goes, the misspelt field)
    "ConfigMap": (("metadata",), "lables"),
    "Deployment": (("spec", "template", "spec", "containers", 0), "imagePullPolice"),
    "Service": (("spec",), "sessionAfinity"),
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
    service = yaml.safe_load((model_best / "kserve.yaml").read_text())
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

    def cannot_fuse(war, model_store, out, log):
        raise UsageError(f"{war}: node 'x y': a node name of letters, digits, '_' and '-' only can be fused")

    monkeypatch.delenv(manifests.STORAGE_ENV, raising=False)
    spec = {"models": {"seg": {"url": "seg.mar"}, "jpeg": {"url": "jpeg.mar"}}, "dag": {"seg": ["jpeg"]}}
    foreign = ForeignArchive("seed_flow", tmp_path / "seed_flow.war", tmp_path, spec, "spec.yaml")
    said = []
    chosen = record(target="seed_flow", run_id="seed_flow-9f8e7d6c", workers=1, server_rss_mb=None)
    best = finish_best(tmp_path, foreign, chosen, log=said.append, fuse=cannot_fuse)
    assert "cannot be fused into one .mar, so KServe cannot serve it" in (best / "fused.txt").read_text()
    assert not (best / "fused").exists() and (best / "k8s.yaml").is_file() and (best / "seed_flow.yaml").is_file()
    assert len(said) == 1 and said[0].startswith("best/: no fused .mar of seed_flow.war: ") and "'x y'" in said[0]
