"""The Ray engine's management API (segserve/engines/ray/management_api.py) answer for answer against what a real
TorchServe 0.12 answered to the same calls (tests/unit/data/torchserve_management.json, recorded from a TorchServe
started on the echo .mar of tests/integration/data/ray_echo: status, content type, whether the connection closes, and
the body, request ids, pids, worker ids and start times aside), with the models kept in memory; and the engine
interface's selection (segserve/engines/engine_interface.py). No Ray started (tests/integration/test_ray_management.py does)."""

import json
import subprocess
import zipfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from segserve.archives.build import tool
from segserve.engines import engine_interface as engines
from segserve.engines.ray import management_api as api
from segserve.engines.ray.engine import RayServe
from segserve.engines.ray.torchserve_api import key_refused, new_keys, renewed_keys
from segserve.errors import UsageError
from segserve.serving.server import TorchServe

ROOT = Path(__file__).resolve().parents[2]
TORCHSERVE = json.loads((Path(__file__).parent / "data" / "torchserve_management.json").read_text())
ECHO = ROOT / "tests" / "integration" / "data" / "ray_echo" / "echo_handler.py"


class InMemory:
    """The models, as the driver's registry keeps them, without Ray: each worker READY at once."""

    def __init__(self):
        self.models: dict[str, api.Registered] = {}
        self.renewed: list[str] = []

    def registered(self):
        return dict(self.models)

    def register(self, model):
        self.models[model.spec.name] = model

    def scale(self, name, workers, wait):
        from dataclasses import replace

        self.models[name] = replace(self.models[name], spec=replace(self.models[name].spec, workers=workers))

    def unregister(self, name):
        del self.models[name]

    def workers(self, name):
        return [api.Worker(str(9000 + i), 0.0, True, 100 + i) for i in range(self.models[name].spec.workers)]

    def renew_key(self, kind):
        self.renewed.append(kind)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("store")
    build = [tool("torch-model-archiver"), "--model-name", "echo", "--version", "1.0", "--handler", str(ECHO), "--export-path", str(folder)]
    subprocess.run(build, check=True, capture_output=True)
    return folder


def normal(body: str) -> str:
    """A body with what differs between two servers (ids, pids, times) blanked."""
    try:
        value = json.loads(body)
    except ValueError:
        return body
    for model in value if isinstance(value, list) else []:
        for worker in model.get("workers", []):
            worker.update(id="-", pid=0, startTime="-")
    return json.dumps(value, indent=2)


def test_each_call_is_answered_as_torchserve_answered_it(store):
    keys = new_keys()
    models = InMemory()
    management = f"Bearer {keys['management']['key']}"
    defaults = api.Defaults(workers=1, response_timeout_s=120, job_queue_size=1024)  # our config.properties'

    def ask(name: str, method: str, target: str, authorization: str = management) -> None:
        got = api.answer(api.parse(method, target), authorization, keys, models, store, defaults)
        expected = TORCHSERVE[name]
        closes = "close" if got.status >= 400 else "keep-alive"  # management_server.py: sendError closes
        wanted = (expected["status"], expected["content_type"], expected["connection"])
        assert (got.status, got.headers["content-type"], closes) == wanted, name
        assert normal(got.body.decode()) == normal(expected["body"]), name

    ask("post", "POST", "/models?url=echo.mar&batch_size=4&max_batch_delay=50&initial_workers=1")
    ask("post_dup", "POST", "/models?url=echo.mar")
    ask("post_nourl", "POST", "/models")
    ask("post_http", "POST", "/models?url=http://example.com/x.mar")
    ask("post_missing", "POST", "/models?url=nope.mar")
    ask("post_dotdot", "POST", "/models?url=../x.mar")
    ask("list", "GET", "/models")
    ask("list_limit", "GET", "/models?limit=0")
    ask("describe", "GET", "/models/echo")
    ask("describe_v", "GET", "/models/echo/1.0")
    ask("describe_badv", "GET", "/models/echo/9.9")
    ask("describe_missing", "GET", "/models/nope")
    ask("scale_async", "PUT", "/models/echo?min_worker=1")
    ask("scale_sync", "PUT", "/models/echo?min_worker=2&synchronous=true")
    ask("scale_bad", "PUT", "/models/echo?min_worker=2&max_worker=1")
    ask("scale_missing", "PUT", "/models/nope?min_worker=2")
    ask("describe2", "GET", "/models/echo")
    ask("patch", "PATCH", "/models")
    ask("other", "GET", "/other")
    ask("root", "GET", "/")
    ask("badkey", "GET", "/models", "Bearer wrong")
    ask("token_wrongtype", "GET", "/token?type=x", f"Bearer {keys['API']['key']}")
    ask("token_mgmt_key", "GET", "/token?type=inference", management)
    assert models.renewed == []
    ask("token_inf", "GET", "/token?type=inference", f"Bearer {keys['API']['key']}")
    ask("token_post", "POST", "/token?type=management", f"Bearer {keys['API']['key']}")
    assert models.renewed == ["inference", "management"]
    ask("delete", "DELETE", "/models/echo")
    ask("delete_missing", "DELETE", "/models/echo")


def test_registration_reads_torchserves_parameters_and_refuses_what_the_ray_engine_cannot_serve(store):
    keys, models = new_keys(), InMemory()

    def post(target: str):
        return api.answer(api.parse("POST", target), f"Bearer {keys['management']['key']}", keys, models, store, api.Defaults(workers=3))

    assert post("/models?url=echo.mar&model_name=other&batch_size=x").status == 200  # not an integer: the default
    spec = models.models["other"].spec
    assert (spec.batch_size, spec.max_batch_delay_ms, spec.workers, spec.archive) == (1, 100, 3, str(store / "echo.mar"))
    refused = json.loads(post("/models?url=seg_jpeg.war").body)  # a .war is registered at /workflows
    assert refused["code"] == 400
    assert refused["message"] == "seg_jpeg.war is a workflow archive: register it with POST /workflows?url=seg_jpeg.war"
    key = f"Bearer {keys['management']['key']}"
    nowhere = api.answer(api.parse("POST", "/models?url=echo.mar"), key, keys, models, None, api.Defaults())
    assert json.loads(nowhere.body)["message"] == "Model store has not been configured."


def test_an_expired_key_is_refused_and_a_renewed_one_has_a_new_key_and_expiration():
    past = (datetime.now(UTC) - timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert key_refused("Bearer k", "k", "2999-01-01T00:00:00Z") is None
    assert key_refused("Bearer k", "k", "2999-01-01T00:00:00.123456789Z") is None  # Instant.toString's nanoseconds
    assert key_refused("Bearer k", "k", past).status == 400
    keys = new_keys(expiry_min=480)
    renewed = renewed_keys(keys, "inference", 480)
    assert renewed["management"] == keys["management"] and renewed["API"] == keys["API"]
    assert renewed["inference"]["key"] != keys["inference"]["key"]


def test_the_engine_is_chosen_by_its_name_else_by_the_run_folder_and_torchserve_is_the_default(tmp_path):
    options = {"run_dir": tmp_path, "model_store": tmp_path, "config": ROOT / "config.properties"}
    assert isinstance(engines.open_engine(None, **options), TorchServe)  # a run folder of before the Ray engine
    ray = engines.open_engine("ray", **options)
    assert isinstance(ray, RayServe) and ray.engine == "ray"
    engines.record(ray)
    assert isinstance(engines.open_engine(None, **options), RayServe)
    assert isinstance(engines.open_engine("torchserve", **options), TorchServe)
    assert engines.open_engine("ray", **options, core_plan=tmp_path / "plan.yaml").core_plan == tmp_path / "plan.yaml"


def test_a_core_plan_reaches_the_replicas_and_the_driver_and_replicas_count_one_another_by_the_engines_group(tmp_path, monkeypatch):
    """As a TorchServe's workers: SEGSERVE_CORE_PLAN names the plan (handlers/pinning.py claims a slot in each replica),
    the driver gets the frontend cores (Ray's processes start from its affinity), and a model's replicas, each a
    process group of its own, share its cores in one group named per run folder."""
    from handlers import pinning
    from segserve.engines.ray.cluster import Cluster
    from segserve.engines.ray.engine import LOOPBACK_ONLY, QUIETER_SERVE, WORKERS_GROUP_ENV

    ray = RayServe(tmp_path / "run", core_plan=ROOT / "core_plan.yaml")
    ray.run_dir.mkdir()
    assert ray._load_core_plan() == [0]
    written = json.loads(Path(ray.env["SEGSERVE_CORE_PLAN"]).read_text())
    assert written["models"] == {"seg_jpeg__jpeg": [[0]], "seg_jpeg__seg": [[1]]} and Path(written["lock_dir"]).is_dir()
    env = ray._environment(tmp_path)
    assert env["SEGSERVE_CORE_PLAN"] == ray.env["SEGSERVE_CORE_PLAN"] and env.items() >= LOOPBACK_ONLY.items()
    assert WORKERS_GROUP_ENV == pinning.GROUP_ENV
    assert env[WORKERS_GROUP_ENV] == RayServe(ray.run_dir)._environment(tmp_path)[WORKERS_GROUP_ENV]  # the same folder
    assert env[WORKERS_GROUP_ENV] != RayServe(tmp_path / "other")._environment(tmp_path)[WORKERS_GROUP_ENV]
    # Serve's timers slower than Ray's defaults, a user's own value kept
    assert env.items() >= QUIETER_SERVE.items() and QUIETER_SERVE["RAY_SERVE_CONTROL_LOOP_INTERVAL_S"] != "0.1"
    monkeypatch.setenv("RAY_SERVE_CONTROL_LOOP_INTERVAL_S", "0.1")
    assert ray._environment(tmp_path)["RAY_SERVE_CONTROL_LOOP_INTERVAL_S"] == "0.1"
    on_a_cluster = RayServe(tmp_path / "c", core_plan=ROOT / "core_plan.yaml", cluster=Cluster("h:6379", str(tmp_path)))
    with pytest.raises(UsageError, match="--core-plan pins the processes of one machine: not on a Ray cluster"):
        on_a_cluster._load_core_plan()


def test_the_ray_engine_serves_a_workflow_target_and_refuses_autoscaling_by_name(tmp_path):
    ray = RayServe(tmp_path)
    workflow, fused = SimpleNamespace(name="seg_jpeg", is_workflow=True), SimpleNamespace(name="seg_jpeg_fused", is_workflow=False)
    assert ray.refusal(workflow) is None and ray.refusal(fused) is None
    assert "not yet on the Ray engine" in ray.refusal(fused, autoscale=True)
    assert TorchServe(tmp_path, tmp_path, ROOT / "config.properties").refusal(workflow, autoscale=True) is None


def test_serve_starts_torchserve_unless_told_and_stops_the_engine_its_run_folder_names(tmp_path, monkeypatch):
    from segserve.cli import cmd_serve

    chosen = []
    stopped = SimpleNamespace(stop=lambda: "", title="x", run_dir=tmp_path)
    monkeypatch.setattr(cmd_serve, "server_from", lambda args: chosen.append(args.engine) or stopped)
    for argv_engine, stop in ((None, False), (None, True), ("ray", True)):
        args = SimpleNamespace(engine=argv_engine, stop=stop, run_dir=str(tmp_path))
        if stop:
            cmd_serve.run(args)
        else:
            with pytest.raises(AttributeError):  # past the choice: the namespace has no more options
                cmd_serve.run(args)
    assert chosen == ["torchserve", None, "ray"]  # None: the recorded one


def test_an_archive_whose_requirements_torchserve_would_install_is_refused_by_name(store, tmp_path):
    import zipfile

    with zipfile.ZipFile(store / "echo.mar") as echo, zipfile.ZipFile(tmp_path / "needs.mar", "w") as needs:
        manifest = json.loads(echo.read("MAR-INF/MANIFEST.json"))
        manifest["model"] |= {"modelName": "needs", "requirementsFile": "requirements.txt"}  # as the archiver writes it
        for name in echo.namelist():
            needs.writestr(name, json.dumps(manifest) if name == "MAR-INF/MANIFEST.json" else echo.read(name))
        needs.writestr("requirements.txt", "nothing-installed-here==1.0\n")
    store = tmp_path
    keys, models = new_keys(), InMemory()

    def post(installs: bool):
        defaults = api.Defaults(install_py_dep_per_model=installs)
        return api.answer(api.parse("POST", "/models?url=needs.mar"), f"Bearer {keys['management']['key']}", keys, models, store, defaults)

    refused = json.loads(post(True).body)
    assert refused["code"] == 400 and "needs.mar brings requirements.txt and install_py_dep_per_model is true" in refused["message"]
    assert "needs" not in models.models
    assert post(False).status == 200  # TorchServe installs nothing either: registered as it comes


def test_an_archives_model_config_yaml_gives_its_registration_values_as_on_torchserve(tmp_path):
    """TorchServe 0.12 measured (2026-12-05, a .mar made with `torch-model-archiver --config-file` holding minWorkers 2,
    maxWorkers 3, batchSize 4, maxBatchDelay 50, responseTimeout 77): registered without parameters it described
    minWorkers 2, batchSize 4, maxBatchDelay 50, responseTimeout 77 with 2 workers; with batch_size=2,
    max_batch_delay=10, initial_workers=1 and response_timeout=5, batchSize 2 and maxBatchDelay 10 (the request's)
    but minWorkers 2 and responseTimeout 77 (the yaml's). maxWorkers is the replicas' count on Ray (fixed replicas)."""
    # the archive as torch-model-archiver 0.12 writes it with --config-file (its manifest read back from one)
    manifest = {
        "runtime": "python",
        "model": {"modelName": "cfg", "handler": "h.py", "modelVersion": "1.0", "configFile": "model-config.yaml"},
    }
    with zipfile.ZipFile(tmp_path / "cfg.mar", "w") as mar:
        mar.writestr("MAR-INF/MANIFEST.json", json.dumps(manifest))
        mar.writestr("model-config.yaml", "minWorkers: 2\nmaxWorkers: 3\nbatchSize: 4\nmaxBatchDelay: 50\nresponseTimeout: 77\n")
        mar.writestr("h.py", ECHO.read_text())
    keys, defaults = new_keys(), api.Defaults(workers=1, response_timeout_s=120, job_queue_size=100)
    management = f"Bearer {keys['management']['key']}"
    described = {}
    for query in ("", "&batch_size=2&max_batch_delay=10&initial_workers=1&response_timeout=5"):
        models = InMemory()
        posted = api.answer(api.parse("POST", f"/models?url=cfg.mar{query}"), management, keys, models, tmp_path, defaults)
        assert posted.status == 200, posted.body
        model = json.loads(api.answer(api.parse("GET", "/models/cfg"), management, keys, models, tmp_path, defaults).body)[0]
        described[query] = (
            model["minWorkers"],
            model["batchSize"],
            model["maxBatchDelay"],
            model["responseTimeout"],
            len(model["workers"]),
        )
    assert described == {"": (2, 4, 50, 77, 2), "&batch_size=2&max_batch_delay=10&initial_workers=1&response_timeout=5": (2, 2, 10, 77, 2)}
