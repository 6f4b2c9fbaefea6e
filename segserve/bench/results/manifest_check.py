"""best/'s manifests checked as a cluster checks them, before they are written (#51).

Kubernetes objects (best/k8s.yaml): against the official OpenAPI schemas, strict (an unknown field is refused), for
the oldest and the newest Kubernetes minor that kubernetes-validate (PyPI) ships schemas for. The InferenceService
(best/kserve.yaml): against the `openAPIV3Schema` of KServe's CRD (kserve/, with its source and license), made strict
as `kubectl apply --validate=strict` is (a field the schema does not name is refused, except below
`x-kubernetes-preserve-unknown-fields`), its metadata against Kubernetes' ObjectMeta; and the ServingRuntime it
relies on (kserve-torchserve) must offer its model format and protocol version.
"""

import gzip
import json
from functools import cache
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml
from kubernetes_validate import utils as kubernetes_schemas

KSERVE = Path(__file__).parent / "kserve"
RUNTIME = "kserve-torchserve"  # the ClusterServingRuntime KServe selects for modelFormat pytorch


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


def inference_service_problems(service: dict) -> list[str]:
    """Lines naming what in an InferenceService a cluster with KServe's CRD (and its TorchServe runtime) refuses."""
    problems = [
        f"InferenceService: KServe's CRD: {_where(error)}: {error.message}"
        for error in jsonschema.Draft7Validator(inference_service_schema()).iter_errors(service)
    ]
    # the CRD leaves metadata to the API server: an ObjectMeta, checked by Kubernetes' own schema
    meta = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": service.get("metadata") or {}}
    problems += [p.replace("ConfigMap/", "InferenceService/", 1) for p in kubernetes_problems([meta])]
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
