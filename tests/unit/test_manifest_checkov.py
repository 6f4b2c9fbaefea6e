"""checkov (PyPI, Bridgecrew's Kubernetes checks) as a second opinion on best/k8s.yaml (#58): of a model, a workflow
and a fused .war, and on best/rayservice.yaml's head and worker pod templates taken out as Deployments (#67: checkov
does not look inside a custom resource), run once for the module (offline: BC_SKIP_MAPPING, --skip-download). Every
check it fails is one docs/deploying.md lists with its reason; with images named by digest, the digest check passes."""

import json
import os
import re
import shutil
import subprocess

import pytest
import yaml

from segserve.archives.foreign import ForeignArchive
from segserve.bench.results import manifests, pods, rayservice
from tests.conftest import ROOT
from tests.unit.test_manifests import finish_best, record, write_mar

CHECKOV = ROOT / ".venv" / "checkov" / "bin" / "checkov"  # make setup-checkov: a venv of its own (its pins are older)
DIGEST = "sha256:" + "0" * 64


def checkov() -> str:
    found = str(CHECKOV) if CHECKOV.exists() else shutil.which("checkov")
    if found is None:
        pytest.fail("checkov is not installed: make setup-checkov (a venv of its own in .venv/checkov)")
    return found


def documented(heading: str = "### checkov's second opinion") -> dict[str, str]:
    """The checks docs/deploying.md says a manifest fails, with the reason: the `| CKV_K8S_21 | … | reason |` rows of
    the section under `heading` (best/k8s.yaml's, else best/rayservice.yaml's)."""
    section = (ROOT / "docs" / "deploying.md").read_text().split(heading + "\n", 1)[1]
    section = re.split(r"^#", section, maxsplit=1, flags=re.MULTILINE)[0]
    return dict(re.findall(r"^\| `(CKV2?_K8S_\d+)` \| [^|]+ \| ([^|]+) \|$", section, re.MULTILINE))


@pytest.fixture(scope="module")
def failed(tmp_path_factory) -> dict[str, set[str]]:
    """{which best/k8s.yaml: the ids of the checks checkov fails on it}: a model, a workflow, a fused .war (digests)."""
    files = {}
    with pytest.MonkeyPatch.context() as env:
        env.setenv(manifests.STORAGE_ENV, "s3://models/tiny")
        folder = tmp_path_factory.mktemp("model")
        files["model"] = finish_best(folder, ForeignArchive("tiny", write_mar(folder / "tiny.mar"), folder), record()) / "k8s.yaml"
        folder = tmp_path_factory.mktemp("workflow")
        spec = {"models": {"seg": {"url": "seg.mar"}, "jpeg": {"url": "jpeg.mar"}}, "dag": {"seg": ["jpeg"]}}
        flow = ForeignArchive("seed_flow", folder / "seed_flow.war", folder, spec, "spec.yaml")
        chosen = record(target="seed_flow", run_id="seed_flow-9f8e7d6c", workers=1, server_rss_mb=None)
        files["workflow"] = finish_best(folder, flow, chosen) / "k8s.yaml"
        env.setenv(pods.IMAGE_ENV, f"pytorch/torchserve@{DIGEST}")
        env.setenv(pods.COPY_IMAGE_ENV, f"amazon/aws-cli@{DIGEST}")
        folder = tmp_path_factory.mktemp("fused")
        flow = ForeignArchive("seed_flow", folder / "seed_flow.war", folder, spec, "spec.yaml")
        finish_best(folder, flow, chosen, fuse=lambda war, store, out, log, **_: write_mar(out))
        files["fused"] = folder / "results" / "best" / "fused" / "k8s.yaml"
        # best/rayservice.yaml's head and worker pod templates as Deployments, with its NetworkPolicies (images by digest)
        env.setenv(rayservice.IMAGE_ENV, f"segserve/ray@{DIGEST}")
        folder = tmp_path_factory.mktemp("ray")
        point = record(engine="ray", latency_p99_ms=90.0, latency_mean_ms=50.0, server_cpu_ms_per_request=20.0)
        written = finish_best(folder, ForeignArchive("tiny", write_mar(folder / "tiny.mar"), folder), point) / "rayservice.yaml"
        service, *policies = yaml.safe_load_all(written.read_text())
        files["rayservice"] = folder / "rayservice-pods.yaml"
        files["rayservice"].write_text(yaml.safe_dump_all(rayservice.pod_templates(service) + policies))
    command = [checkov(), "--framework", "kubernetes", "--skip-download", "-o", "json"]
    for path in files.values():
        command += ["-f", str(path)]
    ran = subprocess.run(command, capture_output=True, text=True, timeout=300, env={**os.environ, "BC_SKIP_MAPPING": "TRUE"})
    report = json.loads(ran.stdout)
    results = (report[0] if isinstance(report, list) else report)["results"]
    assert results["passed_checks"], ran.stderr[-2000:]  # it ran its checks
    by_file = {str(path): kind for kind, path in files.items()}
    failed = {kind: set() for kind in files}
    for check in results["failed_checks"]:
        failed[by_file[check["file_abs_path"]]].add(check["check_id"])
    return failed


def test_every_check_checkov_fails_on_best_k8s_yaml_is_listed_in_docs_deploying_md_with_its_reason(failed):
    failed = {kind: checks for kind, checks in failed.items() if kind != "rayservice"}
    listed = documented()
    assert listed and all(reason.strip() for reason in listed.values())
    for kind, checks in failed.items():
        assert checks <= set(listed), f"{kind}: checkov fails {sorted(checks - set(listed))}, which docs/deploying.md does not list"
    assert set().union(*failed.values()) == set(listed), "docs/deploying.md lists a check checkov no longer fails"


def test_with_images_named_by_digest_checkovs_digest_check_passes_and_the_restricted_checks_pass_everywhere(failed):
    assert "CKV_K8S_43" in failed["model"] and "CKV_K8S_43" not in failed["fused"]
    restricted = {"CKV_K8S_20", "CKV_K8S_22", "CKV_K8S_23", "CKV_K8S_28", "CKV_K8S_29", "CKV_K8S_30", "CKV_K8S_31", "CKV_K8S_37"}
    restricted |= {"CKV_K8S_10", "CKV_K8S_11", "CKV_K8S_12", "CKV_K8S_13", "CKV_K8S_35", "CKV_K8S_38", "CKV2_K8S_6"}
    assert all(not (checks & restricted) for checks in failed.values()), failed


def test_every_check_checkov_fails_on_the_rayservices_pods_is_listed_in_docs_deploying_md_with_its_reason(failed):
    listed = documented("### checkov on the RayService's pods")
    assert listed and all(reason.strip() for reason in listed.values())
    assert failed["rayservice"] == set(listed), f"checkov fails {sorted(failed['rayservice'])}; docs/deploying.md lists {sorted(listed)}"
    restricted = {"CKV_K8S_20", "CKV_K8S_22", "CKV_K8S_23", "CKV_K8S_28", "CKV_K8S_30", "CKV_K8S_37", "CKV_K8S_38", "CKV2_K8S_6"}
    assert not failed["rayservice"] & restricted
