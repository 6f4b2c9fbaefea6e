"""The models a Ray engine serves, kept by its driver (driver.py) and changed through Ray Serve: what the management
API (management_api.py, management_server.py) registers, scales and unregisters. One change at a time.

Each model is a Serve application of its own at its route `/predictions/<model>` (app.model_app) and the ingress
learns the set through its user_config (app.ingress_app): registering deploys the model's application, waits until
its replicas run, then tells the ingress; unregistering tells the ingress first, then deletes the application;
scaling redeploys the model's application with another num_replicas, which Serve applies in place (the running
replicas keep serving, the ones added take requests once they run, the ones removed finish what they hold first:
graceful shutdown). A workflow's nodes are models `<workflow>__<node>` as on TorchServe (listed, described and
scaled as any model); the ingress learns the workflow (its DAG) once every node's replicas run, and forgets it before its nodes go.
"""

import json
import threading
import time
from dataclasses import replace
from pathlib import Path

from ray import serve

from segserve.engines.ray.app import INGRESS_APP, ingress_app, model_app, model_app_name, model_route
from segserve.engines.ray.management_api import Registered, Worker
from segserve.engines.ray.torchserve_api import renewed_keys
from segserve.engines.ray.workflow_management import RegisteredWorkflow
from segserve.engines.ray.write import write_private

SCALE_TIMEOUT_S = 300  # replicas that load a large model take long; TorchServe's default_startup_timeout is 120 s


class Registry:
    def __init__(self, key_file: Path, folder: str, expiry_min: float):
        self.key_file, self.folder, self.expiry_min = key_file, folder, expiry_min
        self.models: dict[str, Registered] = {}
        self.workflow_set: dict[str, RegisteredWorkflow] = {}
        self.lock = threading.RLock()

    def start(self) -> None:
        """The ingress, serving no model yet."""
        self._deploy_ingress()

    def registered(self) -> dict[str, Registered]:
        return dict(self.models)

    def register(self, model: Registered) -> None:
        with self.lock:
            self._deploy_model(model)
            self._deploy_ingress()

    def _deploy_model(self, model: Registered) -> None:
        name = model.spec.name
        try:
            self._run_model(model.spec)
            self._wait(name, model.spec.workers)
        except Exception as failed:  # Serve's own (DEPLOY_FAILED, a replica's constructor's exception)
            serve.delete(model_app_name(name))
            raise RuntimeError(" ".join(str(failed).split())[:500]) from None
        self.models[name] = model

    def workflows(self) -> dict[str, RegisteredWorkflow]:
        return dict(self.workflow_set)

    def register_workflow(self, workflow: RegisteredWorkflow, nodes: list[Registered]) -> list[str]:
        """Each node's model deployed, one after another (TorchServe: four at a time), then the workflow; a node that
        fails takes the others back out (WorkflowManager's rollback). Why each failed; none: registered."""
        with self.lock:
            failures, done = [], []
            for node in nodes:
                try:
                    self._deploy_model(node)
                    done.append(node.spec.name)
                except RuntimeError as failed:
                    failures.append(f"Failed to start workers for model {node.spec.name} version: {node.version}: {failed}")
            if failures:
                for name in done:
                    del self.models[name]
                    serve.delete(model_app_name(name))
                return failures
            self.workflow_set[workflow.name] = workflow
            self._deploy_ingress()
            return []

    def unregister_workflow(self, name: str) -> None:
        with self.lock:
            workflow = self.workflow_set.pop(name)
            nodes = [model for model in workflow.models if model in self.models]
            for model in nodes:
                del self.models[model]
            self._deploy_ingress()  # no new request reaches the workflow or its nodes, then they go
            for model in nodes:
                serve.delete(model_app_name(model))

    def scale(self, name: str, workers: int, wait: bool) -> None:
        with self.lock:
            model = self.models[name]
            changed = replace(model, spec=replace(model.spec, workers=workers))
            self._run_model(changed.spec)
            self.models[name] = changed
        if wait:
            self._wait(name, workers)

    def unregister(self, name: str) -> None:
        with self.lock:
            del self.models[name]
            self._deploy_ingress()  # no new request reaches it, then it goes
            serve.delete(model_app_name(name))

    def workers(self, name: str) -> list[Worker]:
        """The model's replicas now, as Serve's controller lists them (the pid and state of each)."""
        return [
            Worker(r["replica_id"], r.get("start_time_s") or 0.0, r["state"] == "RUNNING", r.get("pid") or 0)
            for r in self._replicas(name)
            if r["state"] != "STOPPED"
        ]

    def renew_key(self, api: str) -> None:
        """TorchServe's /token: the ingress reads the key file again once it changed."""
        with self.lock:
            keys = renewed_keys(json.loads(self.key_file.read_text()), api, self.expiry_min)
            write_private(self.key_file, json.dumps(keys, indent=2))

    def _run_model(self, spec) -> None:
        serve.run(model_app(spec, self.folder, str(self.key_file)), name=model_app_name(spec.name), route_prefix=model_route(spec.name))

    def _deploy_ingress(self) -> None:
        versions = {name: model.version for name, model in self.models.items()}
        plans = {name: workflow.plan.to_config() for name, workflow in self.workflow_set.items()}
        serve.run(ingress_app(str(self.key_file), versions, plans), name=INGRESS_APP, route_prefix="/")

    def _replicas(self, name: str) -> list[dict]:
        # Serve's controller's own account (what `serve status` and the dashboard's REST API read); the handle has none
        details = serve.context._get_global_client().get_serve_details()
        application = details.get("applications", {}).get(model_app_name(name)) or {}
        return application.get("deployments", {}).get(name, {}).get("replicas", [])

    def _wait(self, name: str, workers: int, timeout_s: float = SCALE_TIMEOUT_S) -> None:
        """Until the model has exactly `workers` replicas, all running (synchronous=true)."""
        deadline = time.monotonic() + timeout_s
        while True:
            states = [r["state"] for r in self._replicas(name)]
            if len(states) == workers and all(state == "RUNNING" for state in states):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}'s replicas are {states or 'none'} after {timeout_s:.0f} s, not {workers} running")
            time.sleep(0.2)
