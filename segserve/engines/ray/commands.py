"""The segserve commands that read what only TorchServe has, refused by name on a Ray engine's run folder: the
engine interface's `refused_commands` (engine_interface.refuse_command words the line). Every other command acts
on the Ray engine as on TorchServe: `token`, `scale`, `predict` and `profile` use TorchServe's management and
inference APIs and the key file, which the engine serves; `pin --show` lists its processes' affinity (a core plan's
too: `serve --core-plan`); `audit --run-dir` audits it (segserve/audit/ray_engine.py).
"""

from types import MappingProxyType

REFUSED_COMMANDS = MappingProxyType(
    {
        # the autoscaler's signals come from TorchServe's metrics API (its handlers' counters, TorchServe's queue
        # time), which the Ray engine does not serve yet (RayServe.url("metrics") is refused)
        "autoscale": "moves workers by what TorchServe's metrics API counts",
    }
)
