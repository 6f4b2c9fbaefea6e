"""The Ray driver of one Ray engine (engine.py starts it: `python -m segserve.engines.ray.driver PLAN.json`): a local
Ray of its own (its temp folder, no dashboard, node IP 127.0.0.1, token auth from the environment engine.py sets),
Serve's HTTP at the plan's inference address, the ingress and the plan's models deployed (registry.py), and
TorchServe's management API at the plan's management address (management_server.py); then it writes the plan's
`ready` file and serves. On SIGTERM or SIGINT: Ray shut down (its GCS, raylet and workers), exit 0; engine.py stops
by pid whatever is left (HAProxy, Ray's agents). Not serve.shutdown(): in HAProxy mode it waits out a 30 s drain
(RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S), and nothing of Serve's outlives the engine's temp folder anyway.

With the plan's `address` (a user's running cluster, cluster.py): it joins that cluster as a driver of its machine's
node, refuses a cluster where a segserve engine's ingress application already runs (its applications' names are
fixed), and on SIGTERM deletes our applications (the ingress and every model's) and disconnects: Serve's
controller and proxies and the cluster keep running (the user's). `--delete PLAN.json` does only that deletion, for
a driver that died.
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

from segserve.engines.ray.app import INGRESS_APP, model_app_name


def ours(applications) -> list[str]:
    """Our applications among a cluster's: the ingress and every model's (model_app_name's prefix); the ingress
    first, so that no new request is routed to a model going away."""
    prefix = model_app_name("")
    return [name for name in applications if name == INGRESS_APP] + sorted(name for name in applications if name.startswith(prefix))


def delete_ours() -> None:
    from ray import serve

    for name in ours(serve.status().applications):
        serve.delete(name)


def connect(plan: dict) -> None:
    import ray

    if plan.get("address"):
        ray.init(address=plan["address"], log_to_driver=False)
        return
    ray.init(
        num_cpus=plan["num_cpus"],
        _temp_dir=plan["temp_dir"],
        _node_ip_address="127.0.0.1",
        include_dashboard=False,
        log_to_driver=False,
    )


def main(plan_path: str) -> int:
    plan = json.loads(Path(plan_path).read_text())
    import ray
    from ray import serve

    from segserve.engines.ray import management_server
    from segserve.engines.ray.management_api import Defaults, Registered
    from segserve.engines.ray.model_spec import ModelSpec
    from segserve.engines.ray.registry import Registry

    deployed = False
    if plan.get("frontend_cores"):  # a core plan's (engine._load_core_plan): Ray's processes start from this affinity
        os.sched_setaffinity(0, plan["frontend_cores"])
    try:
        connect(plan)
        # after ray.init, which installs a SIGTERM handler of its own that stops nothing
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        serve.start(http_options={"host": plan.get("http_host", plan["host"]), "port": plan["port"]})
        if plan.get("address") and INGRESS_APP in serve.status().applications:
            print(f"error: the Ray cluster at {plan['address']} already runs a segserve engine (application {INGRESS_APP!r}): stop that")
            return 1
        deployed = True
        defaults = Defaults(**plan["defaults"])
        registry = Registry(Path(plan["key_file"]), plan["folder"], plan["expiry_min"])
        registry.start()
        for model in plan["models"]:
            spec = ModelSpec(**model)
            registry.register(Registered(spec, Path(spec.archive).name, spec.version(), defaults.response_timeout_s))
        store = Path(plan["model_store"]) if plan["model_store"] else None
        management_server.start(plan["host"], plan["management_port"], Path(plan["key_file"]), registry, store, defaults)
        Path(plan["ready"]).write_text(json.dumps({"pid": os.getpid()}))
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second signal must not cut the stop short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if plan.get("address") and deployed and ray.is_initialized():
            delete_ours()  # the cluster is the user's: only what we deployed goes
        ray.shutdown()


def delete(plan_path: str) -> int:
    """Our applications deleted from the plan's cluster (its driver is gone)."""
    import ray

    connect(json.loads(Path(plan_path).read_text()))
    try:
        delete_ours()
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(delete(sys.argv[2]) if sys.argv[1] == "--delete" else main(sys.argv[1]))
