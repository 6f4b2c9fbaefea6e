"""The Ray driver of one Ray engine (engine.py starts it: `python -m segserve.engines.ray.driver PLAN.json`): a local
Ray of its own (its temp folder, no dashboard, node IP 127.0.0.1, token auth from the environment engine.py sets),
Serve's HTTP at the plan's inference address, the ingress and the plan's models deployed (registry.py), and
TorchServe's management API at the plan's management address (management_server.py); then it writes the plan's
`ready` file and serves. On SIGTERM or SIGINT: Ray shut down (its GCS, raylet and workers), exit 0; engine.py stops
by pid whatever is left (HAProxy, Ray's agents). Not serve.shutdown(): in HAProxy mode it waits out a 30 s drain
(RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S), and nothing of Serve's outlives the engine's temp folder anyway.
"""

import json
import os
import signal
import sys
import time
from pathlib import Path


def main(plan_path: str) -> int:
    plan = json.loads(Path(plan_path).read_text())
    import ray
    from ray import serve

    from segserve.engines.ray import management_server
    from segserve.engines.ray.management_api import Defaults, Registered
    from segserve.engines.ray.model_spec import ModelSpec
    from segserve.engines.ray.registry import Registry

    try:
        ray.init(
            num_cpus=plan["num_cpus"],
            _temp_dir=plan["temp_dir"],
            _node_ip_address="127.0.0.1",
            include_dashboard=False,
            log_to_driver=False,
        )
        # after ray.init, which installs a SIGTERM handler of its own that stops nothing
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        serve.start(http_options={"host": plan["host"], "port": plan["port"]})
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
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
