"""A point of a catalog target or a user's archive, put in place on a TorchServe of the bench's own, changing as
little as possible: restart only for server values, build and re-register only for archive values, scale live for
workers."""

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from handlers.optimize import IPEX_HINT
from segserve.archives.build import COMPILED_STARTUP_TIMEOUT_S, Recipe
from segserve.archives.catalog import Catalog, Target
from segserve.archives.registration import from_workflow, spec_overrides
from segserve.archives.war import WarSpec, read_war, war_of
from segserve.bench.run.dag_requests import Failed
from segserve.bench.run.inputs import Body
from segserve.bench.run.measure import Endpoint, process_groups
from segserve.bench.run.suite_inputs import digest
from segserve.bench.run.targets.kind import Kind
from segserve.bench.suite.params import at_level
from segserve.bench.suite.plan import Point, settings_for, spec_values
from segserve.bench.suite.spec import Suite
from segserve.engines.ray.cluster import Cluster
from segserve.engines.ray.engine import RayServe
from segserve.errors import RuntimeFailure, UsageError
from segserve.serving.http import Connection, Response
from segserve.serving.server import TorchServe
from segserve.serving.ts_config import free_port
from segserve.shown_text import for_terminal

# a worker that compiles its network (optimize compile/int8) loads for tens of seconds on 2 cores
WORKER_LOAD_TIMEOUT_S = COMPILED_STARTUP_TIMEOUT_S


# what an optimisation imports in the worker
OPTIMIZATION_MODULES = {"int8": "torchao", "ipex": "intel_extension_for_pytorch"}


class TorchServeTargets(Kind):
    """The catalog's targets and a user's archives, on a TorchServe of the bench's own: restarted only for server
    values, archives built and registered again only for archive values, workers scaled live."""

    def __init__(
        self,
        suite: Suite,
        catalog: Catalog,
        weights: Path,
        changes: dict,
        log=print,
        env: dict | None = None,
        port_base: int | None = None,
        cluster: Cluster | None = None,
    ):
        super().__init__(changes)
        self.suite, self.catalog, self.weights, self.log = suite, catalog, weights, log
        self.port_base = port_base  # None: free ports for every server it starts
        self.extra_env = dict(env or {})  # for every worker of this deployment's server (`bench ab --b-env`)
        self.cluster = cluster  # `bench run --ray-address`: Ray points on a user's running cluster (None: a Ray of their own)
        # on a cluster the archives are built where every node reads them: in its shared folder
        self.store = Path(tempfile.mkdtemp(prefix="segserve-bench-store-", dir=cluster.shared_dir if cluster else None))
        self.staging = Path(tempfile.mkdtemp(prefix="segserve-bench-stage-"))
        # one compile cache for the workers of every server this deployment starts and for the bare forward beside
        # them: a variant compiles cold once per bench run (its first load_s), later loads reuse the kernels
        self.compile_env = {"TORCHINDUCTOR_CACHE_DIR": str(self.staging / "inductor")}
        self.recipe = Recipe(catalog, weights, self.store, self.staging, log=lambda _: None)
        self.server: TorchServe | None = None
        self.server_key = self.registered_key = None
        self.current_workers: dict[str, int] = {}
        self.importable: dict[tuple[str, str], bool] = {}  # (python, module) → whether it imports
        self.workflow: WarSpec | None = None  # the registered workflow's .war as TorchServe reads it (its timeouts)

    def owns(self, name: str) -> bool:
        return name in self.catalog.targets

    def deploy(self, point: Point) -> Endpoint:
        target = self.catalog.targets[point.target]
        self.ensure_server(point)
        try:
            self.ensure_registered(point, target)
        except RuntimeFailure as failure:
            raise self.asking_to_install(failure, point.target) from None
        self.ensure_workers(point, target)
        server, token = self.server, self.server.token("inference")
        workflow = self.workflow if target.is_workflow else None
        if self.torchserve_logs is None:  # Ray: no TorchServe metrics (server_queue_ms...) nor gRPC API: left empty
            return Endpoint(server.url("inference"), target.endpoint, token, {}, None, target.models, None, None, workflow)
        grpc, metrics, logs = server.grpc_inference_url(), server.url("metrics"), self.torchserve_logs
        return Endpoint(server.url("inference"), target.endpoint, token, {}, metrics, target.models, grpc, logs, workflow)

    @property
    def torchserve_logs(self) -> Path | None:
        """The logs folder of the TorchServe serving the point (failures by node, workers' exceptions, stalls are
        read there); None on the Ray engine, which writes none of them."""
        return self.server.run_dir / "logs" if isinstance(self.server, TorchServe) else None

    def watched_processes(self, endpoint: Endpoint) -> dict[str, list[int]] | None:
        """The engine's processes by role (frontend, each worker or replica, the rest), for their CPU and RSS."""
        if self.server is None:
            return None
        if isinstance(self.server, TorchServe):
            return process_groups(self.server, endpoint.models)
        if self.server.cluster:  # its replicas' pids are other hosts' (deploy.ClusterNodes samples each node instead)
            return None
        return self.server.process_groups(endpoint.models)

    # Server ------------------------------------------------------------------------
    def ensure_server(self, point: Point) -> None:
        # a user's archive is code: its server gets a minimal environment (server.py ARCHIVE_BASE_ENV), with the names
        # the suite's archive targets list (they share servers); segserve's own archives the caller's whole one
        worker_env = None
        if point.target in self.catalog.foreign:
            worker_env = self.suite.archive_worker_env
        installs = self.installs_requirements(point.target)
        if self.server is not None and self.server_key == (point.server, worker_env, installs):
            return
        self.stop()
        params = dict(point.server)
        env, overrides = {**self.compile_env, **self.extra_env}, {}
        for param in at_level("server"):
            if param.name in params and param.env:
                env[param.env] = param.env_value(params[param.name])
            if param.name in params and param.config:
                overrides[param.config] = param.env_value(params[param.name])
        pinning = params.get("pinning", "none")
        if pinning == "torchserve":
            if not shutil.which("numactl"):
                raise UsageError("pinning 'torchserve' needs numactl: apt-get install numactl (or `make setup-numactl`)")
            overrides["cpu_launcher_enable"] = "true"
        if installs:  # TorchServe pip-installs each archive's requirements file into its extracted folder
            overrides["install_py_dep_per_model"] = "true"
        core_plan = Path(self.suite.core_plan) if pinning == "plan" else None
        run_dir = Path(tempfile.mkdtemp(prefix="segserve-bench-ts-"))
        config = self.catalog.config_template
        if params.get("engine") == "ray":
            self.server = self.ray_engine(run_dir, env, worker_env, installs, core_plan)
        else:
            ports = {"port_base": self.port_base} if self.port_base else {"free_ports": True}
            venv = Path(params["venv"]) if params.get("venv") else None
            options = {"config_overrides": overrides, "env": env, "core_plan": core_plan, "venv": venv, "worker_env": worker_env}
            self.server = TorchServe(run_dir, self.store, config, **options, **ports)
        self.server.start(log=lambda _: None)
        self.changes["restarts"] += 1
        self.server_key, self.registered_key, self.current_workers = (point.server, worker_env, installs), None, {}

    def ray_engine(self, run_dir: Path, env: dict, worker_env, installs: bool, core_plan: Path | None = None) -> RayServe:
        """A point's Ray engine (grid.server.engine ray): HAProxy in front, as `segserve serve --engine ray` starts it,
        the same server environment and archive environment as a TorchServe point's, on free ports (or port_base's).
        On the user's cluster (`bench run --ray-address`): deployed onto it, Serve's proxy in front (HAProxy mode
        is the cluster's own, set at its nodes' `ray start`)."""
        if installs:
            raise UsageError("install_requirements: TorchServe's install_py_dep_per_model; on a Ray point not yet (docs/ray.md)")
        ports = {"port_base": self.port_base} if self.port_base else {"port": free_port(), "management_port": free_port()}
        config, haproxy = self.catalog.config_template, self.cluster is None
        options = {"env": env, "worker_env": worker_env, "cluster": self.cluster, "core_plan": core_plan}
        return RayServe(run_dir, model_store=self.store, config_template=config, haproxy=haproxy, **options, **ports)

    def requirements_key(self, name: str):
        """The archive target of the suite's file whose `install_requirements` applies to target `name`: a member's
        .war (members: true; its member targets carry the .war's value), else its own."""
        targets = self.suite.archive_targets
        for war in (t for t in targets.values() if t.members):
            foreign = self.catalog.foreign[war.name]
            if name in {foreign.member_name(node) for node in foreign.nodes}:
                return war
        return targets.get(name)

    def installs_requirements(self, name: str) -> bool:
        key = self.requirements_key(name)
        return bool(key and key.install_requirements)

    def asking_to_install(self, failure: RuntimeFailure, name: str) -> RuntimeFailure:
        """A registration that failed on a module the archive's requirements file may provide, with the way to ask
        for it after its cause (management.py puts the cause first)."""
        key = self.requirements_key(name)
        if key is None or key.install_requirements or not any(f.requirements_file for f in getattr(failure, "import_failures", [])):
            return failure
        way = f"add `install_requirements: true` to targets.{key.name} to install it as TorchServe's install_py_dep_per_model would"
        cause = f"{failure.cause}: {way}"
        asked = RuntimeFailure(cause + str(failure)[len(failure.cause) :])
        asked.cause, asked.import_failures = cause, failure.import_failures
        return asked

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            shutil.rmtree(self.server.run_dir, ignore_errors=True)
        self.server = self.server_key = self.registered_key = self.archive_overrides = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.store, ignore_errors=True)
        shutil.rmtree(self.staging, ignore_errors=True)

    # Registration ------------------------------------------------------------------
    def _node_mar(self, target: Target, node, settings: dict, registration: dict) -> str:
        """A node's .mar with these settings, built once per distinct recipe (the settings live in the archive)."""
        name = f"{node.model.name}-{digest([settings, registration])}"
        if not (self.store / f"{name}.mar").exists():
            self.recipe.node_archive(node.model, name, settings, registration)
        return f"{name}.mar"

    def release(self) -> None:
        """Unregister what is registered, so that the next point starts fresh workers (`bench ab`'s rounds)."""
        if self.server is not None and self.registered_key is not None:
            previous = self.catalog.targets[self.registered_key[0]]
            self.server.unregister(previous.management, previous.name)
        self.registered_key = self.archive_overrides = None

    def ensure_registered(self, point: Point, target: Target) -> None:
        key = (point.target, point.archive)
        if self.registered_key == key:
            return
        self.release()
        server = self.server
        started = time.monotonic()
        node_settings, stage, registration = settings_for(point, target)
        self.check_python({s.get("optimize") for s in node_settings.values()})
        workers = point.workers
        foreign = self.catalog.foreign.get(target.name)  # a user's archive: registered from a copy, never rebuilt
        if target.is_workflow:
            spec_models = spec_values(point, target, registration)
            if foreign is not None:
                archive, before = foreign.install(self.store, spec_models), foreign.war
            else:
                urls = {node.name: self._node_mar(target, node, node_settings.get(node.name, {}), {}) for node in target.nodes}
                # the .war is written again each time under the target's name (TorchServe names nodes after it)
                self.recipe.workflow_archive(self.catalog.dags[target.dag], target.name, urls, spec_models)
                archive, before = target.archive, catalog_war(self.catalog.dags[target.dag])
            self.workflow = registered_war(self.store / archive)
            # what the point's copy changed, said in its record also when TorchServe refuses it
            self.archive_overrides = spec_overrides(before, self.workflow) if before and self.workflow else None
            server.register_workflow(archive, target.name, log=lambda _: None)
        else:
            if foreign is not None:
                archive = foreign.install(self.store)
            elif target.is_fused:
                name = f"{target.name}-{digest([node_settings, stage])}"
                if not (self.store / f"{name}.mar").exists():
                    self.recipe.fused_archive(self.catalog.dags[target.dag], name, node_settings, stage)
                archive = f"{name}.mar"
            else:
                archive = self._node_mar(target, target.nodes[0], node_settings.get(target.name, {}), {})
            first = from_workflow(registration.get(target.nodes[0].name, {}))
            server.register_model(archive, target.name, next(iter(workers.values())), **first, log=lambda _: None)
        for model in target.models:
            server.wait_ready(model, WORKER_LOAD_TIMEOUT_S)
        self.registered_key, self.fresh_workers = key, True
        self.load_s = round(time.monotonic() - started, 2)
        self.changes["registrations"] += 1
        # What TorchServe started, not what was asked: 0.12 ignores a workflow node's own workers keys
        # (it starts the DAG-wide count), so ensure_workers scales such a node to the point's count.
        self.current_workers = {node: len(server.describe(model).get("workers", [])) for node, model in self._worker_models(target).items()}

    def answers(self, name: str, bodies: tuple[bytes, ...]) -> list:
        """What the archive target `name` answers to each body, registered alone (one worker, its archive's own
        batching) on the running server, or on one with the suite's default settings: a workflow member's inputs
        are what the workflow's nodes above it answer. Each row its answer (its handler's, whatever status it set:
        the workflow hands that on), or Failed where TorchServe answered its own error (the row goes no further in
        the workflow), with the workers' first exception. Whatever a point had registered is released first; its
        next deploy registers it again."""
        if self.server is None:
            self.ensure_server(Point(name, (), (), (), ()))
        self.release()
        server, endpoint = self.server, self.catalog.targets[name].endpoint
        server.register_model(self.catalog.foreign[name].install(self.store), name, 1, log=lambda _: None)
        connection = Connection(server.url("inference"), server.token("inference"))
        answered = []
        try:
            server.wait_ready(name, WORKER_LOAD_TIMEOUT_S)
            for body in bodies:
                mark = server.model_log_size()
                try:
                    response = connection.request("POST", endpoint, body, getattr(body, "content_type", "application/octet-stream"))
                except OSError as error:  # no answer in the connection's timeout: the row goes no further
                    connection.close()
                    answered.append(Failed(f"gave no answer ({type(error).__name__}: {error})"))
                    continue
                message = torchserve_error(response)
                if message is None:
                    answered.append(Body(response.body, response.content_type or "application/octet-stream"))
                    continue
                cause = server.worker_exception(mark, wait_s=1.0)
                answered.append(Failed(f"answered {response.status}: {message}" + (f" ({cause})" if cause else "")))
        finally:
            connection.close()
            server.unregister("models", name)
        failed = [
            f"{getattr(body, 'name', None) or '?'} ({row.reason})"
            for body, row in zip(bodies, answered, strict=True)
            if isinstance(row, Failed)
        ]
        said = f"; it failed {len(failed)}, which go no further: {'; '.join(failed)}" if failed else ""
        # the failures quote a worker's error and its log: shown, their escapes not obeyed
        self.log(f"captured what {name} answers to its {len(bodies)} input(s): its children's inputs{for_terminal(said)}")
        return answered

    def check_python(self, optimizations: set) -> None:
        """Fail a point fast, before anything is built or registered, when the server's Python lacks what its
        optimisation imports (ipex in segserve's own venv, torchao in .venv-ipex): a worker would fail to load."""
        python = str(self.server.venv / "bin" / "python") if self.server.venv else sys.executable
        for optimization in sorted(optimizations & set(OPTIMIZATION_MODULES)):
            module = OPTIMIZATION_MODULES[optimization]
            if (python, module) not in self.importable:
                done = subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True, timeout=300)
                self.importable[(python, module)] = done.returncode == 0
            if not self.importable[(python, module)]:
                hint = f": {IPEX_HINT}" if optimization == "ipex" else " (pip install torchao)"
                raise RuntimeFailure(f"optimize {optimization}: {module} is not importable in {python}{hint}")

    @staticmethod
    def _worker_models(target: Target) -> dict[str, str]:
        """Point.workers' keys (a node, or "workers" for one model) → the registered model they count."""
        if not target.scaled_nodes:
            return {"workers": target.name}
        return {node: target.registered(node) for node in target.scaled_nodes}

    def ensure_workers(self, point: Point, target: Target) -> None:
        models = self._worker_models(target)
        for node, count in point.workers.items():
            if self.current_workers.get(node) != count:
                model = models[node]
                self.server.scale(model, count)
                # TorchServe's CPU launcher restarts every worker of the model on a scale: wait for them.
                self.server.wait_ready(model, WORKER_LOAD_TIMEOUT_S)
                self.current_workers[node] = count
                self.fresh_workers = True
                self.changes["scales"] += 1


def catalog_war(dag) -> WarSpec | None:
    """A catalog DAG's spec as the reader reads a .war of it: what a point's .war is compared with (its overrides)."""
    try:
        return war_of(dag.spec_path, dag.name, dag.spec_path.name, yaml.safe_load(dag.spec_path.read_text()), None)
    except UsageError:
        return None


def registered_war(path: Path) -> WarSpec | None:
    """The .war a point registered, read as TorchServe reads it (its nodes' timeout-ms, for the lost answers); None
    where the reader refuses what TorchServe accepted (the point is measured all the same)."""
    try:
        return read_war(path)
    except UsageError:
        return None


def torchserve_error(response: Response) -> str | None:
    """The message of TorchServe's own error answer (NettyUtils.sendError: {"code", "type", "message"}, the code
    its status), sent where the worker failed the row's batch (ts/service.py: 503 "Prediction failed", a
    PredictionException's code) or the frontend refused the job; None for an answer the handler gave, whatever
    status it set (in a workflow that answer goes on to the next node, docs/fuse.md)."""
    if response.status < 400:
        return None
    try:
        error = json.loads(response.body)
    except ValueError:
        return None
    # Gson leaves out a null message
    if not isinstance(error, dict) or not {"code", "type"} <= set(error) <= {"code", "type", "message"} or error["code"] != response.status:
        return None
    return " ".join(str(error.get("message") or error["type"]).split())
