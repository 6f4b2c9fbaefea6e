"""best/rayservice.yaml (segserve/bench/results/rayservice.py): a RayService that KubeRay's CRD admits (a broken one
refused), pods of the restricted profile, NetworkPolicies that open only what they name, serveConfigV2 that Ray Serve's
own schema admits with import paths that build our applications, the sizing written in with where it comes from, and
nothing written where a check fails. No cluster: these check the manifest's form and its figures."""

import json
import shlex
import subprocess
import sys

import pytest
import yaml
from ray._common.utils import import_attr
from ray.serve._private.api import call_user_app_builder_with_args_if_necessary

from segserve.archives.foreign import ForeignArchive
from segserve.bench.results import manifest_check, manifests, rayservice
from segserve.engines.ray.torchserve_api import InferenceKey
from tests.conftest import ROOT
from tests.system import workflow_shapes as shapes
from tests.unit.test_manifests import finish_best, record, write_mar
from tests.unit.test_ray_workflow import mar_file, war_file

BOUND = {"latency_p99_ms": {"max": 200}}


def ray_point(**values) -> dict:
    measured = {"engine": "ray", "latency_p99_ms": 180.0, "latency_mean_ms": 531.0, "server_cpu_ms_per_request": 30.0}
    return record(**{**measured, **values})


def documents(best) -> tuple[dict, list[dict], str]:
    """(the RayService, its NetworkPolicies, the header) of best/rayservice.yaml."""
    text = (best / "rayservice.yaml").read_text()
    service, *policies = yaml.safe_load_all(text)
    return service, policies, "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))


@pytest.fixture
def sized(tmp_path, monkeypatch):
    monkeypatch.setenv(manifests.STORAGE_ENV, "s3://models/tiny")
    monkeypatch.setenv("SEGSERVE_TARGET_RPS", "1000")
    return documents(best_of(tmp_path / "sized", ray_point()))


def best_of(folder, chosen: dict, **given):
    """best/ of a .mar's point, in a folder of its own."""
    folder.mkdir()
    foreign = ForeignArchive("tiny", write_mar(folder / "tiny.mar"), folder)
    return finish_best(folder, foreign, chosen, **{"constraints": BOUND, **given})


@pytest.fixture
def workflow(tmp_path, monkeypatch):
    monkeypatch.setenv("SEGSERVE_TARGET_RPS", "1000")
    spec = {"models": {"seg": {"url": "seg.mar"}, "jpeg": {"url": "jpeg.mar"}}, "dag": {"seg": ["jpeg"]}}
    folder = tmp_path / "workflow"
    folder.mkdir()
    flow = ForeignArchive("seed_flow", folder / "seed_flow.war", folder, spec, "spec.yaml")
    chosen = ray_point(target="seed_flow", run_id="seed_flow-9f8e7d6c", workers=1, seg_workers=2)
    return documents(finish_best(folder, flow, chosen, constraints=BOUND))


def serve_config(service: dict) -> dict:
    return yaml.safe_load(service["spec"]["serveConfigV2"])


def test_the_rayservice_passes_kuberays_crd_and_a_broken_one_is_refused_naming_the_field(sized, workflow):
    for service, _, _ in (sized, workflow):
        assert manifest_check.ray_service_problems(service) == []
    service = sized[0]
    misspelt = yaml.safe_load(yaml.safe_dump(service))
    misspelt["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParam"] = {}
    assert any("rayStartParam" in p and "Additional properties" in p for p in manifest_check.ray_service_problems(misspelt))
    wrong = yaml.safe_load(yaml.safe_dump(service))
    wrong["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["replicas"] = "five"
    assert any("workerGroupSpecs.0.replicas" in p for p in manifest_check.ray_service_problems(wrong))
    wrong["apiVersion"] = "ray.io/v1alpha1"
    assert any("must be ray.io/v1/RayService" in p for p in manifest_check.ray_service_problems(wrong))


def test_head_and_worker_pods_are_restricted_read_only_with_ray_writing_in_emptydirs(sized):
    service = sized[0]
    templates = rayservice.pod_templates(service)
    assert [t["metadata"]["name"] for t in templates] == ["tiny-head", "tiny-workers"]
    assert manifest_check.pod_problems(templates) == [] and manifest_check.kubernetes_problems(templates) == []
    for template in templates:
        pod = template["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        (ray,) = pod["containers"]
        mounts = {m["mountPath"]: m["name"] for m in ray["volumeMounts"]}
        assert "emptyDir" in volumes[mounts["/tmp"]] and volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
        assert ray["securityContext"]["readOnlyRootFilesystem"] and pod["automountServiceAccountToken"] is False
        assert [c["name"] for c in pod["initContainers"]] == ["archives"]  # from S3, as best/k8s.yaml
        assert volumes[mounts[rayservice.KEYS]]["secret"]["secretName"] == "tiny-inference-key"
    opened = yaml.safe_load(yaml.safe_dump(templates[1]))
    opened["spec"]["template"]["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    assert manifest_check.pod_problems([opened]) == [
        "Deployment/tiny-workers: containers ray-worker: securityContext.allowPrivilegeEscalation: must be false"
    ]


def test_token_auth_comes_from_a_secret_and_the_image_from_its_variable_by_digest(tmp_path, monkeypatch, sized):
    cluster = sized[0]["spec"]["rayClusterConfig"]
    assert cluster["authOptions"] == {"mode": "token", "secretName": "tiny-ray-token"} and not cluster["enableInTreeAutoscaling"]
    assert "a placeholder: set SEGSERVE_RAY_IMAGE" in sized[2]
    digest = "registry.example/segserve-ray@sha256:" + "0" * 64
    monkeypatch.setenv(rayservice.IMAGE_ENV, digest)
    service, _, header = documents(best_of(tmp_path / "digest", ray_point()))
    images = {t["spec"]["template"]["spec"]["containers"][0]["image"] for t in rayservice.pod_templates(service)}
    assert images == {digest} and "placeholder" not in header


def test_the_network_policies_open_the_serve_port_to_clients_the_dashboard_to_kuberay_and_rays_ports_to_the_cluster(sized):
    _, policies, _ = sized
    assert manifest_check.kubernetes_problems(policies) == []
    cluster, head = policies
    ray_labels = {"app.kubernetes.io/name": "tiny-ray", "app.kubernetes.io/part-of": "segserve-best"}
    assert cluster["spec"]["podSelector"]["matchLabels"] == ray_labels
    rules = {str(rule["from"]): [p["port"] for p in rule["ports"]] for rule in cluster["spec"]["ingress"]}
    assert rules[str([{"podSelector": {"matchLabels": {"segserve.io/client-of": "tiny"}}}])] == [8000]  # clients: serve only
    assert rules[str([{"podSelector": {"matchLabels": ray_labels}}])] == [6379, 8265, 6380, 6381, 6382, 6383, 52365, 10002]
    assert {"protocol": "TCP", "port": 10002, "endPort": 19999} in cluster["spec"]["ingress"][2]["ports"]
    assert 8000 not in rules[str([{"podSelector": {"matchLabels": ray_labels}}])]
    ray_ports = cluster["spec"]["ingress"][2]["ports"]
    assert {"to": [{"podSelector": {"matchLabels": ray_labels}}], "ports": ray_ports} in cluster["spec"]["egress"]
    assert manifest_check.network_policy_problems([cluster], egress=True) == []  # DNS, public HTTPS, the cluster: no metadata address
    assert head["spec"]["podSelector"]["matchLabels"] == {**ray_labels, "segserve.io/ray-node": "head"}
    (operator,) = head["spec"]["ingress"]
    assert operator == {
        "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ray-system"}}}],
        "ports": [{"protocol": "TCP", "port": 8265}],
    }
    # the ports pinned in rayStartParams are the ones the policy names
    params = sized[0]["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["rayStartParams"]
    assert {int(params[key]) for key in rayservice.RAY_PORTS} <= set(rules[str([{"podSelector": {"matchLabels": ray_labels}}])])
    assert (params["min-worker-port"], params["max-worker-port"]) == ("10002", "19999")


def test_the_sizing_is_written_in_with_where_each_figure_comes_from(sized):
    service, _, header = sized
    (model, ingress) = serve_config(service)["applications"]
    (deployment,) = model["deployments"]
    assert deployment == {
        "name": "tiny",
        "num_replicas": "auto",
        "ray_actor_options": {"num_cpus": 1.9},
        "autoscaling_config": {"min_replicas": 2, "max_replicas": 17, "target_ongoing_requests": 31.99},
    }
    workers = service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    assert workers["replicas"] == workers["minReplicas"] == workers["maxReplicas"] == 5 and workers["rayStartParams"]["num-cpus"] == "8"
    assert workers["template"]["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "8", "memory": "4288Mi"}
    assert service["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    for said in ("sized for 1000 req/s (SEGSERVE_TARGET_RPS) at p99 ≤ 200 ms", "latency_mean_ms 531.0 (Little's law)", "5 worker nodes"):
        assert said in header


def test_a_torchserve_point_keeps_its_replicas_and_says_why_it_is_not_sized(tmp_path, monkeypatch):
    monkeypatch.setenv("SEGSERVE_TARGET_RPS", "1000")
    service, _, header = documents(best_of(tmp_path / "torchserve", record()))
    (deployment,) = serve_config(service)["applications"][0]["deployments"]
    assert deployment == {"name": "tiny", "num_replicas": 2, "ray_actor_options": {"num_cpus": 4.0}}
    assert "not sized: tiny-1a2b3c4d ran on torchserve" in header
    assert service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["replicas"] == 1


def test_a_war_runs_each_node_with_the_points_replicas_scaled_and_fixed(workflow):
    service, _, header = workflow
    apps = {app["name"]: app for app in serve_config(service)["applications"]}
    assert set(apps) == {"model:seed_flow__seg", "model:seed_flow__jpeg", "torchserve"}
    seg = apps["model:seed_flow__seg"]
    assert (
        seg["args"]["node"] == "seg"
        and seg["args"]["war"].endswith("/seed_flow.war")
        and seg["route_prefix"] == "/predictions/seed_flow__seg"
    )
    assert seg["deployments"][0]["num_replicas"] == 17 and apps["model:seed_flow__jpeg"]["deployments"][0]["num_replicas"] == 9
    assert apps["torchserve"]["args"]["workflows"] == {"seed_flow": "/home/model-server/model-store/seed_flow.war"}
    assert "no autoscaling" in header


def test_serve_config_passes_rays_schema_and_each_import_path_builds_our_application(sized, tmp_path):
    config = serve_config(sized[0])
    assert rayservice.serve_config_problems(sized[0]["spec"]["serveConfigV2"]) == []
    archive = str(write_mar(tmp_path / "built.mar"))
    for app in config["applications"]:
        args = {key: archive if key == "archive" else value for key, value in app["args"].items()}
        args["models"] = {"tiny": archive} if "models" in args else None
        built = call_user_app_builder_with_args_if_necessary(import_attr(app["import_path"]), {k: v for k, v in args.items() if v})
        names = [d["name"] for d in app.get("deployments", [])]
        assert names in ([], [built._bound_deployment.name])  # an override names a deployment the code makes
    broken = yaml.safe_load(sized[0]["spec"]["serveConfigV2"])
    broken["applications"][0]["deployments"][0]["autoscaling_config"]["min_replicas"] = 99
    broken["applications"][0]["deployments"][0]["num_replica"] = 2
    broken["applications"][1]["import_path"] = "segserve.engines.ray.config_app:nowhere"
    said = rayservice.serve_config_problems(yaml.safe_dump(broken))
    assert any("min_replicas" in p for p in said), said
    broken["applications"][0]["deployments"][0]["autoscaling_config"]["min_replicas"] = 2
    said = rayservice.serve_config_problems(yaml.safe_dump(broken))
    assert "serveConfigV2: applications.0.deployments.0.num_replica: not a field of Ray Serve's schema" in said
    assert any("config_app:nowhere" in p for p in said)


def test_a_wars_node_and_ingress_builders_read_the_war_as_post_workflows_does(tmp_path):
    for name in ("animal", "breed"):
        mar_file(tmp_path, name)
    war = str(war_file(tmp_path, "dogbreed", shapes.DOGBREED_SPEC, shapes.DOGBREED_FUNCTIONS))
    node = import_attr("segserve.engines.ray.config_app:workflow_node")
    built = call_user_app_builder_with_args_if_necessary(
        node, {"war": war, "workflow": "dogbreed", "node": "animal", "key_file": "k", "workers": 3}
    )
    assert built._bound_deployment.name == "dogbreed__animal" and built._bound_deployment.num_replicas == 3
    ingress = call_user_app_builder_with_args_if_necessary(
        import_attr("segserve.engines.ray.config_app:ingress"), {"key_file": "k", "workflows": {"dogbreed": war}}
    )
    config = ingress._bound_deployment.user_config
    assert set(config["workflows"]) == {"dogbreed"} and set(config["versions"]) == {
        "dogbreed__animal",
        "dogbreed__breed",
        "dogbreed__pre_processing",
    }
    function = call_user_app_builder_with_args_if_necessary(
        node, {"war": war, "workflow": "dogbreed", "node": "pre_processing", "key_file": "k"}
    )
    assert function._bound_deployment.init_args[0].handler == "dogbreed_functions.py:pre_processing"  # TorchServe's function node


def test_nothing_is_written_where_a_check_fails_and_the_reason_is_given(tmp_path, monkeypatch):
    monkeypatch.setenv(rayservice.IMAGE_ENV, "Not An Image")
    said = []
    best = best_of(tmp_path / "refused", ray_point(), log=said.append)
    assert not (best / "rayservice.yaml").exists() and (best / "k8s.yaml").exists()
    assert "best/rayservice.yaml not written: Deployment/tiny-head: containers ray-head: image 'Not An Image'" in " ".join(said)


def test_the_documented_secrets_are_a_key_file_the_replicas_read_and_the_token_kuberay_reads(tmp_path, sized):
    block = (ROOT / "docs" / "deploying.md").read_text().split("## Ray on Kubernetes", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    make_key, key_secret, token_secret, apply = block.splitlines()
    code = shlex.split(make_key.split(">")[0])[2]
    (tmp_path / "key_file.json").write_text(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    key = InferenceKey(str(tmp_path / "key_file.json"))
    given = json.loads((tmp_path / "key_file.json").read_text())["inference"]["key"]
    assert key.refused(f"Bearer {given}") is None and key.refused("Bearer wrong").status == 400  # no expiry: it holds
    service, *_ = sized
    volume = {v["name"]: v for v in rayservice.pod_templates(service)[0]["spec"]["template"]["spec"]["volumes"]}["inference-key"]
    assert f"{volume['secret']['secretName']} --from-file=key_file.json" in key_secret and rayservice.KEY_FILE.endswith("/key_file.json")
    auth = service["spec"]["rayClusterConfig"]["authOptions"]
    assert f"{auth['secretName']} --from-literal=auth_token=" in token_secret  # KubeRay reads the key auth_token
    assert apply.endswith("/best/rayservice.yaml")
